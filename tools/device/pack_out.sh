# Source me last: bundle what a run left under $OUT (JSON, PNG, text, CSV, HTML) into $OUT/results.tgz and remove
# the loose files, for a runner that brings back only a few files.
(cd "$OUT" && find . -type f \( -name '*.json' -o -name '*.png' -o -name '*.txt' -o -name '*.csv' -o -name '*.html' \) \
   ! -path './results.tgz' -print0 | tar czf results.tgz --null -T - && find . -type f ! -name results.tgz -delete \
   && find . -mindepth 1 -type d -empty -delete)

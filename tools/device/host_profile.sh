# Where the training thread's host time goes in steady epochs: yolofeed trains yolo11n (batch 128, imgsz 640, mosaic
# off as in a 10-epoch run) on a synth set after a run that compiled its kernels, and py-spy (its wheel carried in
# .tools/) attaches once the first epochs are past: every thread's Python stacks (thread ids, raw collapsed stacks)
# for SPY_S seconds, then only the thread holding the GIL, then 3 s as a timeline (chrometrace). A wait shows as the
# line that waits; a CUDA event's synchronize spins, so it counts as busy. Also times torch._inductor's import
# (Ultralytics' init_seeds makes it) without bytecode and with a bytecode cache.
# With SETUP=1 it samples instead a run of 2 epochs from its start into spy_setup.txt: where the set-up's threads
# spend their time (Python frames only: with native frames, 200 a second, py-spy fell a minute behind and the run
# outlasted its call).
# Usage: [SETUP=1] bash tools/device/host_profile.sh [images] [epochs] [attach_after_s] [spy_s]; all in $OUT.
source tools/device/setup.sh
N="${1:-4000}"; EPOCHS="${2:-24}"; AFTER="${3:-40}"; SPY_S="${4:-10}"
NOTES="$OUT/notes.txt"
env | grep -E '^PYTHON' | sort > "$NOTES" || true
python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/pyspy .tools/py_spy-*.whl
SPY=/tmp/pyspy/bin/py-spy
# each from a bytecode folder of its own (setup.sh has compiled the packages' own): an empty one read and not
# written (from source, twice), then one written and read
fresh="$(mktemp -d)"
for how in "no bytecode" "no bytecode" "cache written" "cache read"; do
  case "$how" in
    "no bytecode") env=(PYTHONDONTWRITEBYTECODE=1 PYTHONPYCACHEPREFIX="$(mktemp -d)") ;;
    *) env=(-u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX="$fresh") ;;
  esac
  /usr/bin/env "${env[@]}" python3 -c "import time, torch; t = time.perf_counter(); import torch._inductor.config; \
print('torch._inductor import, $how:', round(time.perf_counter() - t, 2), 's')"
done 2>&1 | tee -a "$NOTES"
python3 -m yolofeed synth out=/tmp/synth_hp n_train="$N" n_val=500 seed=0 | tail -1
python3 -m yolofeed pack data=/tmp/synth_hp/data.yaml imgsz=640 | tail -1
TRAIN=(python3 -m yolofeed train model=yolo11n.yaml data=/tmp/synth_hp/data.yaml batch=128 imgsz=640 workers=16
       close_mosaic=1000 project=/tmp/hp_runs exist_ok=True)
timeout 120 "${TRAIN[@]}" epochs=1 name=compile > /tmp/compile.log 2>&1 || tail -5 /tmp/compile.log | tee -a "$NOTES"
if [ "${SETUP:-0}" = 1 ]; then
  timeout 150 $SPY record --rate 200 --threads --nonblocking --format raw -o "$OUT/spy_setup.txt" -- \
    "${TRAIN[@]}" epochs=2 name=setup > "$OUT/train.log" 2>&1 || tail -20 "$OUT/train.log"
  grep -E "py-spy|yolofeed:" "$OUT/train.log" | head -20 >> "$NOTES"
  find "$OUT" -name '*.pt' -delete
  cat "$NOTES"
  exit 0
fi
"${TRAIN[@]}" epochs="$EPOCHS" name=profiled > "$OUT/train.log" 2>&1 &
pid=$!
sleep "$AFTER"
for what in all gil timeline; do
  case "$what" in
    all) args=(--duration "$SPY_S" --format raw) ;;
    gil) args=(--duration "$SPY_S" --format raw --gil) ;;
    timeline) args=(--duration 3 --format chrometrace) ;;
  esac
  ext=txt; [ "$what" = timeline ] && ext=json
  $SPY record --pid "$pid" --rate 400 --threads --nonblocking "${args[@]}" -o "$OUT/spy_$what.$ext" 2>&1 \
    | grep -v '^$' >> "$NOTES" || echo "py-spy $what failed" >> "$NOTES"
done
wait "$pid" || tail -20 "$OUT/train.log"
cp /tmp/hp_runs/profiled/results.csv "$OUT/results.csv" 2>/dev/null || true
find "$OUT" -name '*.pt' -delete
cat "$NOTES"

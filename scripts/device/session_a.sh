#!/usr/bin/env bash
# One device call for issue 4: the GPU tests, then the three-model bench (yolofeed vs stock vs ceiling) on 10k
# synthetic images, batch 128, imgsz 640. Results bundled in $OUT/results.tgz. BENCH_JPEG=1 adds the jpeg pack for yolo11n.
source scripts/device/setup.sh
set +e
# the GPU tests run beside the dataset's generation (CPU-bound; no timing is taken from either)
(timeout 150 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -rA 2>&1 | grep -v "Warning\|popen_fork\|self.pid\|^$" \
  | grep -E "PASSED|FAILED|SKIPPED|Error|assert|nvJPEG|passed|failed" | tail -40 > $OUT/gpu_tests.txt) &
TESTS=$!
python3 -m yolofeed synth out=/tmp/synth n_train=10000 n_val=500 seed=0 2>&1 | grep -v "img/s\]"
for f in raw ${BENCH_JPEG:+jpeg}; do python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 format=$f 2>&1 | grep -v "img/s\]"; done
wait $TESTS; cat $OUT/gpu_tests.txt
b() {  # b MODEL MODES SECONDS
  timeout $3 python3 -m yolofeed bench model=$1 modes=$2 data=/tmp/synth/data.yaml batch=128 imgsz=640 steps=100 \
    warmup=30 workers=16 out=$OUT/bench_${1%.yaml} 2>&1 | grep -v "it/s\|━" | tail -8
}
b yolo11n.yaml stock,yolofeed,ceiling${BENCH_JPEG:+,yolofeed_jpeg} 200
b yolo11s.yaml stock,yolofeed,ceiling 140
b yolo26n.yaml stock,yolofeed,ceiling 140
[ -n "$NO_PACK" ] || source scripts/device/pack_out.sh  # NO_PACK=1: a caller bundles

#!/usr/bin/env bash
# The graphed step (graphed_step, on by default) on the GPU: its GPU tests with full tracebacks, then side-by-side
# benches on the 10k synthetic set at batch 128, 640: yolo11n with optimizer=MuSGD (stock, yolofeed) and yolo26n
# (stock, yolofeed, ceiling). Usage: bash tools/device/graphed_bench.sh    Environment: TESTS (pytest paths)
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,4p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
timeout 150 python3 -m pytest -q -m gpu ${TESTS:-tests/test_graphed.py tests/test_loss.py} -p no:cacheprovider \
  --tb=long -rA > $OUT/gpu_tests_full.txt 2>&1
grep -E "^(FAILED|PASSED|ERROR)|passed|failed|^E  " $OUT/gpu_tests_full.txt | head -30
python3 -m yolofeed synth out=/tmp/synth n_train=10000 n_val=500 seed=0 2>&1 | tail -1
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 2>&1 | tail -1
B="workers=16 batch=128 imgsz=640 data=/tmp/synth/data.yaml steps=60 warmup=20"
timeout 200 python3 -m yolofeed bench model=yolo11n.yaml modes=stock,yolofeed optimizer=MuSGD first_epoch=False $B \
  out=$OUT/bench_musgd > $OUT/bench_musgd.txt 2>&1
tr '\r' '\n' < $OUT/bench_musgd.txt | grep -v "step/s]\|it/s]" | grep -A5 "^yolo11n.yaml\|Error\|error" | tail -12
timeout 170 python3 -m yolofeed bench model=yolo26n.yaml modes=stock,yolofeed,ceiling first_epoch=False $B \
  out=$OUT/bench_26n > $OUT/bench_26n.txt 2>&1
tr '\r' '\n' < $OUT/bench_26n.txt | grep -v "step/s]\|it/s]" | grep -A5 "^yolo26n.yaml\|Error\|error" | tail -12
find $OUT -name '*.pt' -delete

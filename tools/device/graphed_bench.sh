#!/usr/bin/env bash
# The graphed step (graphed_step, on by default) on the GPU, on the 10k synthetic set at batch 128, 640, in parts:
#   tests  its GPU tests (tests/test_graphed.py, tests/test_loss.py) with full tracebacks
#   ab     yolo11n, yolofeed and the ceiling, graphed_step=False then True, first epoch and steady
#   musgd  yolo11n with optimizer=MuSGD, stock and yolofeed
#   26n    yolo26n, stock, yolofeed and the ceiling
# Usage: bash tools/device/graphed_bench.sh    Environment: PARTS=tests,ab (default: every part; about 12 minutes)
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,7p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
PARTS=",${PARTS:-tests,ab,musgd,26n},"
B="workers=16 batch=128 imgsz=640 data=/tmp/synth/data.yaml steps=60 warmup=20"
show() { tr '\r' '\n' < "$1" | grep -v "step/s]\|it/s]" | grep -A5 "^yolo.*yaml, batch\|Error" | tail -12; }
if [[ $PARTS == *,tests,* ]]; then
  timeout 150 python3 -m pytest -q -m gpu tests/test_graphed.py tests/test_loss.py -p no:cacheprovider --tb=long -rA \
    > $OUT/gpu_tests_full.txt 2>&1
  grep -E "^(FAILED|PASSED|ERROR)|passed|failed|^E  " $OUT/gpu_tests_full.txt | head -30
fi
[ -f /tmp/synth/data.yaml ] || python3 -m yolofeed synth out=/tmp/synth n_train=10000 n_val=500 seed=0 2>&1 | tail -1
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 2>&1 | tail -1
if [[ $PARTS == *,ab,* ]]; then
  for g in False True; do
    timeout 200 python3 -m yolofeed bench model=yolo11n.yaml modes=yolofeed,ceiling first_epoch=True graphed_step=$g \
      $B out=$OUT/bench_graphed_$g > $OUT/bench_graphed_$g.txt 2>&1
    show $OUT/bench_graphed_$g.txt
  done
fi
if [[ $PARTS == *,musgd,* ]]; then
  timeout 200 python3 -m yolofeed bench model=yolo11n.yaml modes=stock,yolofeed optimizer=MuSGD first_epoch=False $B \
    out=$OUT/bench_musgd > $OUT/bench_musgd.txt 2>&1
  show $OUT/bench_musgd.txt
fi
if [[ $PARTS == *,26n,* ]]; then
  timeout 170 python3 -m yolofeed bench model=yolo26n.yaml modes=stock,yolofeed,ceiling first_epoch=False $B \
    out=$OUT/bench_26n > $OUT/bench_26n.txt 2>&1
  show $OUT/bench_26n.txt
fi
find $OUT -name '*.pt' -delete

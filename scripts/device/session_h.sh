#!/usr/bin/env bash
# Device call for issue 4 (~4 min): the GPU tests; Ultralytics' step against yolofeed's (the progress bar's loss
# items a step late: train/step.py), side by side and interleaved, yolo11n twice and yolo26n once, batch 128,
# imgsz 640 (scripts/device/step_ab.py). Results in $OUT/results.tgz.
source scripts/device/setup.sh
set +e
(timeout 150 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -rA 2>&1 | grep -v "Warning\|popen_fork\|self.pid\|^$" \
  | grep -E "PASSED|FAILED|SKIPPED|Error|assert|nvJPEG|passed|failed" | tail -40 > $OUT/gpu_tests.txt) &
TESTS=$!
python3 -m yolofeed synth out=/tmp/synth n_train=10000 n_val=500 seed=0 2>&1 | grep -v "img/s\]"
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 format=raw 2>&1 | grep -v "img/s\]"
wait $TESTS; cat $OUT/gpu_tests.txt
timeout 200 python3 scripts/device/step_ab.py /tmp/synth/data.yaml yolo11n.yaml \
  yolofeed_stock_step,yolofeed,yolofeed,yolofeed_stock_step 2>&1 | grep "STEP_AB\|Error\|error"
timeout 120 python3 scripts/device/step_ab.py /tmp/synth/data.yaml yolo26n.yaml \
  yolofeed,yolofeed_stock_step 2>&1 | grep "STEP_AB\|Error\|error"
source scripts/device/pack_out.sh

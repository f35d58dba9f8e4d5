#!/usr/bin/env bash
# Device call for issue 4 (~4 min): the GPU tests; Ultralytics' step against yolofeed's (the progress bar's loss
# items a step late: train/step.py), side by side and interleaved, yolo11n twice and yolo26n once, batch 128,
# imgsz 640 (scripts/device/step_ab.py). Results in $OUT/results.tgz.
source scripts/device/prelude.sh  # setup, the GPU tests beside the dataset and its pack
timeout 200 python3 scripts/device/step_ab.py /tmp/synth/data.yaml yolo11n.yaml \
  yolofeed_stock_step,yolofeed,yolofeed,yolofeed_stock_step 2>&1 | grep "STEP_AB\|Error\|error"
timeout 120 python3 scripts/device/step_ab.py /tmp/synth/data.yaml yolo26n.yaml \
  yolofeed,yolofeed_stock_step 2>&1 | grep "STEP_AB\|Error\|error"
source scripts/device/pack_out.sh

#!/usr/bin/env bash
# Device call for issue 4's GPU-utilisation target (~6 min): the GPU tests; the host syncs per step with
# Ultralytics' step and with yolofeed's sync-free step (scripts/device/syncs.py); and both steps side by side,
# ceiling and yolofeed, yolo11n and yolo26n, batch 128, imgsz 640 (scripts/device/step_ab.py). $OUT/results.tgz.
source scripts/device/prelude.sh  # setup, the GPU tests beside the dataset and its pack
for v in ceiling_stock_step ceiling yolofeed; do
  timeout 90 python3 scripts/device/syncs.py /tmp/synth/data.yaml $v yolo11n.yaml 2>&1 | grep -v "it/s\|━" | tail -14
done
timeout 200 python3 scripts/device/step_ab.py /tmp/synth/data.yaml yolo11n.yaml \
  ceiling_stock_step,ceiling,yolofeed_stock_step,yolofeed 2>&1 | grep "STEP_AB\|Error\|error"
timeout 150 python3 scripts/device/step_ab.py /tmp/synth/data.yaml yolo26n.yaml \
  ceiling_stock_step,ceiling,yolofeed 2>&1 | grep "STEP_AB\|Error\|error"
source scripts/device/pack_out.sh

#!/usr/bin/env bash
# Issue 4 (~5 min): the sync-free loss with its padded foreground rows on distinct anchors (train/loss.py
# foreground_rows; session_k found 41 ms a step in indexing_backward_kernel from rows piled on anchor (0, 0)).
# yolofeed with and without it, interleaved, and the ceiling with it; yolo11n and yolo26n, batch 128, imgsz 640.
NO_GPU_TESTS=1 source scripts/device/prelude.sh
timeout 240 python3 scripts/device/step_ab.py /tmp/synth/data.yaml yolo11n.yaml \
  yolofeed_sync_free_loss,yolofeed,ceiling_sync_free_loss,yolofeed_sync_free_loss,yolofeed 2>&1 | grep "STEP_AB\|Error"
timeout 120 python3 scripts/device/step_ab.py /tmp/synth/data.yaml yolo26n.yaml \
  yolofeed_sync_free_loss,yolofeed 2>&1 | grep "STEP_AB\|Error"
source scripts/device/pack_out.sh

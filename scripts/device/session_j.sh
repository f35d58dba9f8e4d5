#!/usr/bin/env bash
# Next device call for issue 4 (~6 min): the sync-free loss (train/loss.py, opt-in as sync_free_loss=True) measured.
# The GPU tests (its no-sync test among them: not yet run on a GPU); the syncs left in a yolofeed step with it
# (expect 0); then side by side, interleaved, yolofeed and the ceiling with and without it, yolo11n and yolo26n,
# batch 128, imgsz 640 (scripts/device/step_ab.py). If it pays, make sync_free_loss the default and run
# session_a.sh for the record. Results in $OUT/results.tgz.
source scripts/device/prelude.sh  # setup, the GPU tests beside the dataset and its pack
for v in yolofeed_sync_free_loss ceiling_sync_free_loss; do
  timeout 45 python3 scripts/device/syncs.py /tmp/synth/data.yaml $v yolo11n.yaml 2>&1 | grep -v "it/s\|━" | tail -8
done
timeout 200 python3 scripts/device/step_ab.py /tmp/synth/data.yaml yolo11n.yaml \
  yolofeed,yolofeed_sync_free_loss,ceiling_sync_free_loss,ceiling,yolofeed_sync_free_loss,yolofeed 2>&1 | grep "STEP_AB\|Error"
timeout 150 python3 scripts/device/step_ab.py /tmp/synth/data.yaml yolo26n.yaml \
  yolofeed_sync_free_loss,yolofeed,ceiling,ceiling_sync_free_loss 2>&1 | grep "STEP_AB\|Error"
source scripts/device/pack_out.sh

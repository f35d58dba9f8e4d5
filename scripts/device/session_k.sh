#!/usr/bin/env bash
# Issue 4 (~3 min): where the sync-free loss's extra GPU time goes in yolofeed (session_j: yolofeed 1,555 img/s at
# 86 % GPU without it, 1,138 at 100 % with it, while the ceiling gained 1,513 -> 1,641). The GPU time a step by
# aten op (scripts/device/kernel_top.py), yolo11n, batch 128. Results in $OUT/results.tgz.
NO_GPU_TESTS=1 source scripts/device/prelude.sh
timeout 400 python3 scripts/device/kernel_top.py /tmp/synth/data.yaml \
  yolofeed_sync_free_loss,yolofeed,ceiling_sync_free_loss yolo11n.yaml 2>&1 | grep -v "it/s\|━" | grep -A32 "GPU time"
source scripts/device/pack_out.sh

#!/usr/bin/env bash
# Device call for issue 4 (~7 min, capped at 440 s of commands): the GPU tests (the sync-free loss among them); the
# syncs left in a yolofeed step (scripts/device/syncs.py); the three-model bench, with ceiling_stock (the ceiling on
# Ultralytics' own step) beside the ceiling for yolo11n and yolo26n. Results in $OUT/results.tgz.
source scripts/device/prelude.sh  # setup, the GPU tests beside the dataset and its pack
timeout 45 python3 scripts/device/syncs.py /tmp/synth/data.yaml yolofeed yolo11n.yaml 2>&1 | grep -v "it/s\|━" | tail -12
b() {  # b MODEL MODES SECONDS: never past 440 s of this script, so that the results are always bundled
  local left=$((440 - SECONDS)); local t=$(( $3 < left ? $3 : left ))
  [ $t -gt 30 ] || { echo "skipped $1: no time left"; return; }
  timeout $t python3 -m yolofeed bench model=$1 modes=$2 data=/tmp/synth/data.yaml batch=128 imgsz=640 steps=100 \
    warmup=30 workers=16 out=$OUT/bench_${1%.yaml} 2>&1 | grep -v "it/s\|━" | tail -9
}
b yolo11n.yaml stock,yolofeed,ceiling,ceiling_stock 160
b yolo26n.yaml stock,yolofeed,ceiling,ceiling_stock 150
b yolo11s.yaml stock,yolofeed,ceiling 130
source scripts/device/pack_out.sh

#!/usr/bin/env bash
# Issue 4 targets on the H200 machine: yolofeed vs stock vs ceiling for yolo11n, yolo26n, yolo11s
# (batch 128, imgsz 640, AMP, mosaic on, 10k synthetic images). Usage: bash scripts/device/train_bench.sh [MODELS]
source scripts/device/setup.sh
set +e
MODELS=${1:-yolo11n.yaml,yolo26n.yaml,yolo11s.yaml}
python3 -m yolofeed synth out=/tmp/synth n_train=10000 n_val=500 seed=0 2>&1 | grep -v "img/s\]"
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 2>&1 | grep -v "img/s\]"
for m in ${MODELS//,/ }; do
  python3 -m yolofeed bench model=$m data=/tmp/synth/data.yaml batch=128 imgsz=640 steps=100 warmup=30 \
    workers=16 out=$OUT/bench_${m%.yaml} 2>&1 | grep -v "it/s\|━" | tail -8
done

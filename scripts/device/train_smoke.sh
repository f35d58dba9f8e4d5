#!/usr/bin/env bash
# Quick GPU smoke of issue 4: GPU tests, then a short 3-mode bench on 1,024 synthetic images.
source scripts/device/setup.sh
set +e
python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -5 | tee "$OUT/gpu_tests.txt"
python3 -m yolofeed synth out=/tmp/synth n_train=1024 n_val=64 seed=0 2>&1 | grep -v "img/s\]"
python3 -m yolofeed bench model=yolo11n.yaml data=/tmp/synth/data.yaml batch=64 imgsz=640 steps=20 warmup=10 \
  window=5 workers=16 out=$OUT/bench 2>&1 | grep -v "it/s\|━" | tail -12

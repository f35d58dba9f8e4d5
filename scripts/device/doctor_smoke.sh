#!/usr/bin/env bash
# Quick GPU check of the doctor: a planted data bottleneck (workers=1), stock vs yolofeed.
source scripts/device/setup.sh
set +e
python3 -m yolofeed synth out=/tmp/synth n_train=512 n_val=64 seed=0 2>&1 | grep -v "img/s\]"
python3 -m yolofeed doctor model=yolo11n.yaml data=/tmp/synth/data.yaml batch=64 imgsz=640 workers=1 steps=12 \
  warmup=5 time_validation=False out=$OUT/doctor 2>&1 | grep -v "it/s\|━" | tail -14

#!/usr/bin/env bash
# One device call: the doctor's disk case with the warm-up now covering Ultralytics' worker queue
# (doctor/profile.py: queued_batches), then whether the loss padding read ahead (train/targets.py) pays:
# yolo11n with and without it, each pair run in both orders, at batch 128 and at a host-bound batch 16.
# Results in $OUT/results.tgz.
source scripts/device/setup.sh
set +e
timeout 200 bash scripts/device/doctor_plant.sh disk  # a shell of its own: only it is capped (cgroup io.max)
python3 -m yolofeed synth out=/tmp/synth n_train=10000 n_val=500 seed=0 2>&1 | grep -v "img/s\]"
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 format=raw 2>&1 | grep -v "img/s\]"
b() {  # b NAME BATCH MODES STEPS SECONDS
  timeout $5 python3 -m yolofeed bench model=yolo11n.yaml modes=$3 data=/tmp/synth/data.yaml batch=$2 imgsz=640 \
    steps=$4 warmup=30 workers=16 out=$OUT/bench_$1 2>&1 | grep -v "it/s\|━" | grep -A8 "steps after" 
}
b b128_a 128 yolofeed,yolofeed_stockloss,ceiling,ceiling_stock 100 130
b b128_b 128 ceiling_stock,ceiling,yolofeed_stockloss,yolofeed 100 130
b b16_a 16 yolofeed,yolofeed_stockloss,ceiling,ceiling_stock 300 90
b b16_b 16 ceiling_stock,ceiling,yolofeed_stockloss,yolofeed 300 90
source scripts/device/pack_out.sh

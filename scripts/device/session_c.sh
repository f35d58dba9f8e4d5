#!/usr/bin/env bash
# One device call: nvJPEG tests, the issue-4 bench with the run's own optimiser (raw vs jpeg packs too),
# the accounting overhead with the sampler in its own process, two planted doctor cases.
source scripts/device/setup.sh
set +e
timeout 75 python3 -m pytest -q -m gpu tests/test_decode.py -p no:cacheprovider 2>&1 | tail -15 | tee $OUT/gpu_tests.txt
python3 -m yolofeed synth out=/tmp/synth n_train=10000 n_val=500 seed=0 2>&1 | grep -v "img/s\]"
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 format=raw 2>&1 | grep -v "img/s\]"
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 format=jpeg 2>&1 | grep -v "img/s\]"
b() {  # b MODEL MODES SECONDS
  timeout $3 python3 -m yolofeed bench model=$1 modes=$2 data=/tmp/synth/data.yaml batch=128 imgsz=640 steps=60 \
    warmup=20 workers=16 out=$OUT/bench_${1%.yaml} 2>&1 | grep -v "it/s\|━" | tail -8
}
b yolo11n.yaml stock,yolofeed,yolofeed_jpeg,ceiling 95
b yolo11s.yaml stock,yolofeed,ceiling 75
b yolo26n.yaml stock,yolofeed,ceiling 75
timeout 90 python3 scripts/device/monitor_overhead.py /tmp/synth/data.yaml 2>&1 | grep -v "it/s\|━" | tail -12 | tee $OUT/overhead.txt
PLANT_DATA=/tmp/synth timeout 70 bash scripts/device/doctor_plant.sh workers,augment
source scripts/device/pack_out.sh

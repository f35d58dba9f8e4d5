#!/usr/bin/env bash
# Short device call: nvJPEG tests with full failure output; raw vs jpeg packs side by side (graph capture with the decoder running).
source scripts/device/setup.sh
set +e
timeout 40 python3 -m pytest -q -m gpu tests/test_decode.py -p no:cacheprovider -x --tb=short 2>&1 | grep -v "Warning\|popen_fork\|self.pid\|^$\|test_decode.py::" | tail -40
python3 -m yolofeed synth out=/tmp/synth n_train=2000 n_val=100 seed=0 2>&1 | grep -v "img/s\]"
timeout 75 python3 -m yolofeed bench model=yolo11n.yaml modes=yolofeed_jpeg,yolofeed data=/tmp/synth/data.yaml batch=128 imgsz=640 \
  steps=20 warmup=10 window=5 workers=16 out=$OUT/bench 2>&1 | grep -v "it/s\|━" | grep -v "^ *[0-9]\+  \|engine/trainer" | tail -12
source scripts/device/pack_out.sh

#!/usr/bin/env bash
# Issues 17 and 18 on one H200 (nvidia-h200, ~3 min): the model's cost at a new batch size in fresh processes
# (shape_cost.py: plain, cuDNN off, the last batch warmed from a background thread), and a jpeg pack's decode
# part by part with its GPU kernels (jpeg_decode.py). Everything lands in $OUT/results.tgz.
# Usage: bash tools/device/shapes_decode.sh
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,5p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
for v in "" --no-cudnn --background "--model yolo26n.yaml"; do
  timeout 60 python3 -m tools.device.shape_cost $v >> $OUT/shape_cost.txt 2>&1
done
python3 -m yolofeed synth out=/tmp/synth n_train=2000 n_val=10 seed=0 2>&1 | tail -1
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 format=jpeg splits=train 2>&1 | grep -v "img/s\]" | tail -2
timeout 90 python3 -m tools.device.jpeg_decode /tmp/synth/yolofeed-packs/data-jpeg-640/train.yfpack > $OUT/jpeg_decode.txt 2>&1
for f in $OUT/*.txt; do echo "== $f"; tail -c 3000 "$f"; done
source tools/device/pack_out.sh

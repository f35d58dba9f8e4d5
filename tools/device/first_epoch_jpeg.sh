#!/usr/bin/env bash
# Issues 17 and 18 on one H200 (nvidia-h200, ~7 min): the model's cost at a new batch size (shape_cost.py: plain,
# cuDNN off, warmed from a background thread); stock and yolofeed each in a fresh process (one bench a mode: the
# time to the first step and the first epoch as a user meets them), yolofeed twice; the GPU time a step of raw
# against jpeg packs (kernel_top.py). Everything lands in $OUT/results.tgz.
# Usage: bash tools/device/first_epoch_jpeg.sh
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,6p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
python3 -m yolofeed synth out=/tmp/synth n_train=10000 n_val=500 seed=0 2>&1 | tail -1
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 format=raw 2>&1 | grep -v "img/s\]" | tail -2
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 format=jpeg 2>&1 | grep -v "img/s\]" | tail -2
python3 -c "from ultralytics.data.dataset import YOLODataset; from ultralytics.data.utils import check_det_dataset
from ultralytics.cfg import get_cfg; d = check_det_dataset('/tmp/synth/data.yaml')
YOLODataset(img_path=d['train'], imgsz=640, augment=False, data=d, hyp=get_cfg())" > /dev/null 2>&1  # labels cache
for v in "" --no-cudnn --background; do
  timeout 60 python3 -m tools.device.shape_cost $v >> $OUT/shape_cost.txt 2>&1
done
B="warmup=30 workers=16 imgsz=640 data=/tmp/synth/data.yaml model=yolo11n.yaml steps=100 batch=128 first_epoch=True"
k=0
for m in stock yolofeed yolofeed; do
  k=$((k + 1))
  timeout 150 python3 -m yolofeed bench $B modes=$m out=$OUT/fresh_${m}_$k > $OUT/fresh_${m}_$k.txt 2>&1
done
timeout 150 python3 -m tools.device.kernel_top /tmp/synth/data.yaml yolofeed,yolofeed_jpeg yolo11n.yaml \
  > $OUT/kernel_top.txt 2>&1
for f in $OUT/*.txt; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v "━\|it/s]\|step/s]" | tail -14; done
find $OUT -name '*.pt' -delete
find $OUT -path '*/runs/*' -type f ! -name results.csv ! -name args.yaml -delete
source tools/device/pack_out.sh

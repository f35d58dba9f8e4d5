#!/usr/bin/env bash
# The bench with each mode in a process of its own (isolate=True), as a user's runs are: stock, a raw pack and
# a jpeg pack, yolo11n, batch 128, imgsz 640, the 10k set with both packs built and stock's label cache written (a
# user's second run); steady rate, first epoch and time to the first step. Then every GPU test. ~7 min on a fresh
# nvidia-h200.
# Usage: bash tools/device/bench_isolated.sh
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,6p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
D=/tmp/synth
[ -f $D/data.yaml ] || python3 -m yolofeed synth out=$D n_train=10000 n_val=500 seed=0 2>&1 | tail -1
for f in raw jpeg; do
  python3 -m yolofeed pack data=$D/data.yaml imgsz=640 format=$f 2>&1 | tr "\r" "\n" | grep "pack train.*built"
done
python3 -c "from ultralytics.data.dataset import YOLODataset; from ultralytics.cfg import get_cfg
from ultralytics.data.utils import check_det_dataset; d = check_det_dataset('$D/data.yaml')
YOLODataset(img_path=d['train'], imgsz=640, augment=False, data=d, hyp=get_cfg())" > /dev/null
timeout 300 python3 -m yolofeed bench model=yolo11n.yaml data=$D/data.yaml imgsz=640 batch=128 workers=16 \
  modes=stock,yolofeed,yolofeed_jpeg steps=60 warmup=20 first_epoch=True isolate=True out=$OUT/bench_isolated 2>&1 \
  | tr '\r' '\n' | grep -v "step/s\]" | tail -8
timeout 200 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -rA 2>&1 | tail -30 > $OUT/gpu_tests.txt
tail -4 $OUT/gpu_tests.txt
find $OUT -name '*.pt' -delete
source tools/device/pack_out.sh

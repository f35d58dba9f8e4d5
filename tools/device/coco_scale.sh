#!/usr/bin/env bash
# COCO scale on one machine: a synthetic set the size of COCO train2017 (118,287 images at 640, JPEG quality 95:
# about 145 KB each, 17 GB), its pack (format=auto: jpeg, since the raw pack, ~110 GB, fits neither the disk nor
# half the memory), then one full epoch each of yolofeed on that jpeg pack and stock (yolo11n, batch 128) in one
# bench: img/s, GPU utilisation and host cores side by side. The bench's mode is yolofeed_jpeg: its yolofeed mode
# is the raw pack, which this disk cannot hold. On the 16-core nvidia-h200: PHASE=data (~7.5 min), then at once,
# on the still-warm machine, PHASE=train (~5.5 min); in one call on nvidia-h200-x2 (32 cores).
# Usage: bash tools/device/coco_scale.sh        Environment: PHASE=all|data|train, N_TRAIN=118287, OPTIMIZER
# (the bench's optimizer=; unset: auto, which picks MuSGD at this length)
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,9p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
D=/tmp/coco-like
if [ "${PHASE:-all}" != train ]; then
  df -h /tmp | tail -1
  t=$SECONDS
  python3 -m yolofeed synth out=$D n_train=${N_TRAIN:-118287} n_val=500 seed=0 quality=95 2>&1 \
    | grep -v "img/s\]" | tail -2
  echo "synth: $((SECONDS - t)) s"; du -sh $D/images/train
  t=$SECONDS
  python3 -m yolofeed pack data=$D/data.yaml imgsz=640 2>&1 | grep -v "img/s\]" | tail -5
  echo "pack: $((SECONDS - t)) s"; t=$SECONDS
  python3 -c "from ultralytics.data.dataset import YOLODataset
from ultralytics.data.utils import check_det_dataset; from ultralytics.cfg import get_cfg
d = check_det_dataset('$D/data.yaml')
YOLODataset(img_path=d['train'], imgsz=640, augment=False, data=d, hyp=get_cfg())" > /dev/null
  echo "stock's label scan: $((SECONDS - t)) s"
fi
if [ "${PHASE:-all}" != data ]; then
  timeout 420 python3 -m yolofeed bench model=yolo11n.yaml data=$D/data.yaml imgsz=640 batch=128 workers=16 \
    modes=yolofeed_jpeg,stock warmup=30 steps=300 first_epoch=True ${OPTIMIZER:+optimizer=$OPTIMIZER} \
    out=$OUT/bench_coco > $OUT/bench_coco.txt 2>&1
  tr '\r' '\n' < $OUT/bench_coco.txt | grep -v "step/s]" | tail -12
  find $OUT -name '*.pt' -delete
  find $OUT -path '*/runs/*' -type f ! -name results.csv ! -name args.yaml -delete
  source tools/device/pack_out.sh
fi

#!/usr/bin/env bash
# The whole run as a user makes it: `yolofeed bench whole_run=E` for stock and yolofeed, each in a process of its
# own (validation every epoch, checkpoints and plots at their defaults, the final validation), yolo11n, batch 128,
# imgsz 640, on the 10k set with its raw pack built and stock's label cache written. EPOCHS=10, OPTS="auto MuSGD"
# (one bench per optimizer=; auto picks AdamW for 10 epochs of 10k images), LIMIT=560 (seconds for all benches).
# ~5.5 min a bench of 10 epochs on a fresh nvidia-h200.
# Usage: bash tools/device/whole_run.sh
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,7p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
D=/tmp/synth
[ -f $D/data.yaml ] || python3 -m yolofeed synth out=$D n_train=10000 n_val=500 seed=0 2>&1 | tail -1
python3 -m yolofeed pack data=$D/data.yaml imgsz=640 format=raw 2>&1 | tr "\r" "\n" | grep "pack .*built"
python3 -c "from ultralytics.data.dataset import YOLODataset; from ultralytics.cfg import get_cfg
from ultralytics.data.utils import check_det_dataset; d = check_det_dataset('$D/data.yaml')
for s in ('train', 'val'):
    YOLODataset(img_path=d[s], imgsz=640, augment=False, data=d, hyp=get_cfg())" > /dev/null
end=$((SECONDS + ${LIMIT:-560}))
for opt in ${OPTS:-auto MuSGD}; do
  timeout $((end - SECONDS)) python3 -m yolofeed bench model=yolo11n.yaml data=$D/data.yaml imgsz=640 batch=128 \
    workers=16 modes=stock,yolofeed whole_run=${EPOCHS:-10} optimizer=$opt out=$OUT/whole_$opt 2>&1 \
    | tr '\r' '\n' | grep -v "step/s\]\|s/step\]" | tail -6
  rm -rf $OUT/whole_$opt/runs/*/weights $OUT/whole_$opt/runs/*/*.jpg
  cp $OUT/whole_$opt/runs/stock/results.csv $OUT/whole_$opt/stock_results.csv 2>/dev/null
  cp $OUT/whole_$opt/runs/yolofeed/results.csv $OUT/whole_$opt/yolofeed_results.csv 2>/dev/null
  rm -rf $OUT/whole_$opt/runs
done
source tools/device/pack_out.sh

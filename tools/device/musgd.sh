#!/usr/bin/env bash
# MuSGD at the GPU's pace: the optimiser phase part by part (optimizer_phase: stock MuSGD, FastMuSGD, AdamW), the
# training step with each (step_ab, one process: the ceiling and yolofeed, stock MuSGD against FastMuSGD), then
# the bench as a user runs it with optimizer=MuSGD (isolate=True: stock, yolofeed, ceiling; first epoch and steady)
# and the GPU tests of the step. yolo11n, batch 128, imgsz 640, the 10k set. PARTS: a comma-separated
# subset of phase,ab,bench,tests (default all). ~9 min on a fresh nvidia-h200.
# Usage: bash tools/device/musgd.sh  (PARTS=phase,tests to run some)
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,7p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
PARTS=${PARTS:-phase,ab,bench,tests}
D=/tmp/synth
has() { [[ ",$PARTS," == *",$1,"* ]]; }
if has ab || has bench; then
  [ -f $D/data.yaml ] || python3 -m yolofeed synth out=$D n_train=10000 n_val=500 seed=0 2>&1 | tail -1
  python3 -m yolofeed pack data=$D/data.yaml imgsz=640 format=raw 2>&1 | tr "\r" "\n" | grep "pack train.*built"
fi
if has phase; then
  timeout 120 python3 -m tools.device.optimizer_phase yolo11n.yaml yolo26n.yaml 2>&1 | grep -v "optimizer:" \
    | tee $OUT/optimizer_phase.txt
fi
if has tests; then
  timeout 150 python3 -m pytest -q -m gpu tests/test_musgd.py tests/test_step.py -p no:cacheprovider -rA 2>&1 \
    | tail -30 > $OUT/gpu_tests_step.txt
  tail -4 $OUT/gpu_tests_step.txt
fi
if has ab; then
  timeout 300 python3 -m tools.device.step_ab $D/data.yaml yolo11n.yaml \
    ceiling_stock_musgd,ceiling,yolofeed_stock_musgd,yolofeed --optimizer MuSGD --steps 60 --warmup 30 2>&1 \
    | grep -A2 "^STEP_AB" | tee $OUT/step_ab.txt
fi
if has bench; then
  python3 -c "from ultralytics.data.dataset import YOLODataset; from ultralytics.cfg import get_cfg
from ultralytics.data.utils import check_det_dataset; d = check_det_dataset('$D/data.yaml')
YOLODataset(img_path=d['train'], imgsz=640, augment=False, data=d, hyp=get_cfg())" > /dev/null
  timeout 330 python3 -m yolofeed bench model=yolo11n.yaml data=$D/data.yaml imgsz=640 batch=128 workers=16 \
    modes=stock,yolofeed,ceiling steps=60 warmup=20 first_epoch=True isolate=True optimizer=MuSGD \
    out=$OUT/bench_musgd 2>&1 | tr '\r' '\n' | grep -v "step/s\]" | tail -12
fi
find $OUT -name '*.pt' -delete
source tools/device/pack_out.sh

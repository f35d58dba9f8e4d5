#!/usr/bin/env bash
# Model quality, stock vs yolofeed, on 2 GPUs (nvidia-h200-x2, ~9 min): `yolofeed parity` for yolo11n and yolo26n
# at once (each on its own share of the cores, both spread over the two GPUs) on a synthetic set yolo11n learns to
# mid-range mAP (8 classes that differ in shape and colour, 1-20 figures from 8 px). The GPU tests run first beside
# the dataset's generation (NO_GPU_TESTS=1 skips them), then a one-epoch yolofeed smoke run: parity only starts if
# that trains. Writes $OUT/p11.json, p26.json (each parity.json), p11.png, p26.png and parity_runs.tgz.
# Usage: bash tools/device/parity.sh
# Environment: SEEDS11=4 FIRST11=0 PAR11=4 CORES11=0-17 SEEDS26=3 FIRST26=0 PAR26=3 CORES26=18-31 EPOCHS=30
# N_TRAIN=2000 N_VAL=200 LIMIT=420 (seconds for the parity commands) NO_SMOKE=1 DEVICES=0,1 (one GPU: DEVICES=0;
# the GPU tests then share it) EXTRA="optimizer=MuSGD" (more keys for both sides). SEEDS11=0 or SEEDS26=0 skips that
# model. TASK=pose (or obb) makes a set of that task and trains MODEL11 (default yolo11n.yaml; e.g. yolo11n-pose.yaml).
# GPU_TESTS_BESIDE=1 runs the whole GPU test set beside the parity runs (quality is measured, not time), in up to
# GPU_TESTS_LIMIT seconds (default 150; 330 beside).
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,11p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=/tmp/parity${TASK:+-$TASK}
TASK=${TASK:-detect}
MODEL11=${MODEL11:-yolo11n.yaml}
DEVICES=${DEVICES:-0,1}
GT_LIMIT=${GPU_TESTS_LIMIT:-150}; [ -n "$GPU_TESTS_BESIDE" ] && GT_LIMIT=${GPU_TESTS_LIMIT:-330}
if [ -z "$NO_GPU_TESTS" ]; then
  (CUDA_VISIBLE_DEVICES=${DEVICES##*,} timeout $GT_LIMIT python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -rA 2>&1 \
    | grep -E "PASSED|FAILED|SKIPPED|Error|assert|passed|failed" | tail -40 > $OUT/gpu_tests.txt) &
fi
python3 -m yolofeed synth out=$D n_train=${N_TRAIN:-2000} n_val=${N_VAL:-200} imgsz=320 classes=8 boxes=20 min_box=8 \
  seed=0 task=$TASK 2>&1 | grep -v "img/s\]"
SMOKE=0
if [ -z "$NO_SMOKE" ]; then
  CUDA_VISIBLE_DEVICES=${DEVICES%%,*} timeout 120 python3 -m yolofeed train model=yolo26n.yaml data=$D/data.yaml \
    imgsz=320 epochs=1 batch=64 project=/tmp/smoke name=smoke exist_ok=True plots=False $EXTRA > $OUT/smoke.txt 2>&1
  SMOKE=$?
fi
grep -v "it/s\|━" $OUT/smoke.txt 2>/dev/null | tail -4
if [ -z "$GPU_TESTS_BESIDE" ]; then wait; cat $OUT/gpu_tests.txt 2>/dev/null; fi
if [ $SMOKE = 0 ]; then
  python3 -m yolofeed pack data=$D/data.yaml imgsz=320 task=$TASK 2>&1 | grep -v "img/s\]"  # both commands find it built
  python3 -c "from ultralytics.data.dataset import YOLODataset; from ultralytics.data.utils import check_det_dataset
from ultralytics.cfg import get_cfg; d = check_det_dataset('$D/data.yaml')
for s in ('train', 'val'):
    YOLODataset(img_path=d[s], imgsz=320, augment=False, data=d, hyp=get_cfg(), task='$TASK')" > /dev/null 2>&1
  common="data=$D/data.yaml epochs=${EPOCHS:-30} imgsz=320 batch=64 device=$DEVICES $EXTRA"
  sides=""
  if [ "${SEEDS11:-4}" != 0 ]; then
    sides="$sides p11"
    taskset -c ${CORES11:-0-17} timeout ${LIMIT:-420} python3 -m yolofeed parity model=$MODEL11 \
      seeds=${SEEDS11:-4} first_seed=${FIRST11:-0} parallel=${PAR11:-4} $common out=$OUT/p11 > $OUT/p11.txt 2>&1 &
  fi
  if [ "${SEEDS26:-3}" != 0 ]; then
    sides="$sides p26"
    taskset -c ${CORES26:-18-31} timeout ${LIMIT:-420} python3 -m yolofeed parity model=yolo26n.yaml \
      seeds=${SEEDS26:-3} first_seed=${FIRST26:-0} parallel=${PAR26:-3} $common out=$OUT/p26 > $OUT/p26.txt 2>&1 &
  fi
  wait
  [ -n "$GPU_TESTS_BESIDE" ] && cat $OUT/gpu_tests.txt 2>/dev/null
  for p in $sides; do
    tr '\r' '\n' < $OUT/$p.txt | grep -v "parity runs:\|Scanning\|Fast image" | tail -14
    cp $OUT/$p/parity.png $OUT/$p.png 2>/dev/null; cp $OUT/$p/parity.json $OUT/$p.json 2>/dev/null
  done
  tar czf $OUT/parity_runs.tgz -C $OUT $(cd $OUT && ls -d p*/logs p*/runs/*/results.csv) 2>/dev/null
  rm -rf $OUT/p11 $OUT/p26 $OUT/p11.txt $OUT/p26.txt
fi

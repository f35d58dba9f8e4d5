#!/usr/bin/env bash
# Issue 4 on nvidia-h200-x2: accuracy parity (stock on GPU 0 / cores 0-15, yolofeed on GPU 1 / cores 16-31, at the
# same time), val metrics through both val loaders on the same weights, then a 2-GPU DDP run of yolofeed train.
# PARITY=0: the DDP run alone (~3 min with the machine's start).
source scripts/device/setup.sh
set +e
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
P=/tmp/parity
python3 -m yolofeed synth out=$P n_train=3000 n_val=500 imgsz=320 seed=0 2>&1 | grep -v "img/s\]"
python3 -m yolofeed pack data=$P/data.yaml imgsz=320 2>&1 | grep -v "img/s\]"
if [ "${PARITY:-1}" = 1 ]; then
  CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 timeout 420 python3 scripts/device/parity_train.py stock $P/data.yaml $OUT/parity \
    > $OUT/parity_stock.txt 2>&1 &
  CUDA_VISIBLE_DEVICES=1 taskset -c 16-31 timeout 420 python3 scripts/device/parity_train.py yolofeed $P/data.yaml $OUT/parity \
    > $OUT/parity_yolofeed.txt 2>&1 &
  wait
  python3 scripts/device/parity_summary.py $OUT/parity
  for side in stock yolofeed; do  # the same weights through Ultralytics' val loader and through yolofeed's
    timeout 60 python3 scripts/device/val_equality.py $OUT/parity/$side/weights/best.pt $P/data.yaml imgsz=320 batch=32 \
      device=0 2>&1 | tail -16 | tee $OUT/val_equality_$side.txt
  done
fi
timeout 150 python3 -m yolofeed train model=yolo11n.yaml data=$P/data.yaml imgsz=320 epochs=3 batch=128 device=0,1 \
  project=$OUT/ddp name=yolofeed exist_ok=True plots=False 2>&1 | grep -v "it/s\|━" | tail -25 | tee $OUT/ddp.txt
python3 -c "from ultralytics import YOLO; m = YOLO('$OUT/ddp/yolofeed/weights/best.pt'); print('DDP best.pt val mAP50-95', m.val(data='$P/data.yaml', imgsz=320, plots=False).box.map)" 2>&1 | tail -2
find $OUT -name "*.pt" -delete
source scripts/device/pack_out.sh

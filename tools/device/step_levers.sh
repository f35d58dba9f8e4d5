#!/usr/bin/env bash
# Levers on the training step itself, each measured on its own beside the step without it (issue 29's "a faster
# step for every optimiser"): step_ab in one process for the ceiling (GPU-resident batches) and yolofeed, with and
# without channels_last, yolo11n and yolo26n, batch 128, imgsz 640, optimizer=auto (AdamW) on the 10k set; then
# kernel_top on the ceiling with and without it (where the GPU time moved). LEVERS=channels_last (suffixes of
# step_ab), MODELS="yolo11n.yaml yolo26n.yaml". ~8 min on a fresh nvidia-h200.
# Usage: bash tools/device/step_levers.sh
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,7p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
D=/tmp/synth
[ -f $D/data.yaml ] || python3 -m yolofeed synth out=$D n_train=10000 n_val=500 seed=0 2>&1 | tail -1
python3 -m yolofeed pack data=$D/data.yaml imgsz=640 format=raw 2>&1 | tr "\r" "\n" | grep "pack train.*built"
for model in ${MODELS:-yolo11n.yaml yolo26n.yaml}; do
  variants="ceiling"
  for lever in ${LEVERS:-channels_last}; do variants="$variants,ceiling_$lever"; done
  variants="$variants,ceiling"
  for lever in ${LEVERS:-channels_last}; do variants="$variants,yolofeed_$lever"; done
  variants="$variants,yolofeed"
  timeout 300 python3 -m tools.device.step_ab $D/data.yaml $model $variants --steps 60 --warmup 30 2>&1 \
    | grep -A2 "^STEP_AB" | tee -a $OUT/step_levers.txt
done
first=${LEVERS:-channels_last}; first=${first%% *}
timeout 150 python3 -m tools.device.kernel_top $D/data.yaml ceiling,ceiling_$first yolo11n.yaml 2>&1 | tail -40 \
  > $OUT/kernel_top_levers.txt
source tools/device/pack_out.sh

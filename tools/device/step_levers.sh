#!/usr/bin/env bash
# Levers on the step itself, each measured alone at the ceiling (batches already on the GPU, isolate=True):
# Ultralytics' compile=True (torch.compile, inductor, of the model's forward and backward) against compile=False,
# yolo11n then yolo26n, batch 128, imgsz 640, the 10k set; then yolofeed itself with compile=True. The first
# step's time holds the compile. MODELS="yolo11n yolo26n", LIMIT=540 (seconds for all benches).
# ~9 min on a fresh nvidia-h200.
# Usage: bash tools/device/step_levers.sh
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,6p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
D=/tmp/synth
[ -f $D/data.yaml ] || python3 -m yolofeed synth out=$D n_train=10000 n_val=500 seed=0 2>&1 | tail -1
python3 -m yolofeed pack data=$D/data.yaml imgsz=640 format=raw 2>&1 | tr "\r" "\n" | grep "pack .*built"
end=$((SECONDS + ${LIMIT:-540}))
for m in ${MODELS:-yolo11n yolo26n}; do
  for c in False True; do
    modes=ceiling; [ $m = yolo11n ] && [ $c = True ] && modes=ceiling,yolofeed
    echo "== $m compile=$c modes=$modes"
    timeout $((end - SECONDS)) python3 -m yolofeed bench model=$m.yaml data=$D/data.yaml imgsz=640 batch=128 \
      workers=16 modes=$modes steps=60 warmup=30 first_epoch=False isolate=True compile=$c \
      out=$OUT/levers_${m}_compile$c 2>&1 | tr '\r' '\n' | grep -v "step/s\]\|s/step\]" | tail -8
  done
done
find $OUT -name '*.pt' -delete
source tools/device/pack_out.sh

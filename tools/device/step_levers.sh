#!/usr/bin/env bash
# Levers on the step itself, each measured alone at the ceiling (batches already on the GPU, isolate=True), batch 128,
# imgsz 640, the 10k set. LEVERS=compile (default): Ultralytics' compile=False against True (torch.compile, inductor,
# the model's forward and backward; the first step holds the compile) for yolo11n and yolo26n, and yolofeed with
# compile=True. LEVERS=deterministic: yolo11n with Ultralytics' deterministic=True (its default) against False.
# LIMIT=540 (seconds for all benches). ~9 min (compile) or ~3 min (deterministic) on a fresh nvidia-h200.
# Usage: bash tools/device/step_levers.sh
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,7p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
D=/tmp/synth
[ -f $D/data.yaml ] || python3 -m yolofeed synth out=$D n_train=10000 n_val=500 seed=0 2>&1 | tail -1
python3 -m yolofeed pack data=$D/data.yaml imgsz=640 format=raw 2>&1 | tr "\r" "\n" | grep "pack .*built"
end=$((SECONDS + ${LIMIT:-540}))
if [ "${LEVERS:-compile}" = compile ]; then
  RUNS=("yolo11n ceiling compile=False" "yolo11n ceiling,yolofeed compile=True" "yolo26n ceiling compile=False"
        "yolo26n ceiling compile=True")
else
  RUNS=("yolo11n ceiling deterministic=True" "yolo11n ceiling deterministic=False")
fi
for run in "${RUNS[@]}"; do
  read -r m modes opts <<< "$run"
  name=$(echo "${m}_$opts" | tr ' =' '_-')
  echo "== $m modes=$modes $opts"
  timeout $((end - SECONDS)) python3 -m yolofeed bench model=$m.yaml data=$D/data.yaml imgsz=640 batch=128 \
    workers=16 modes=$modes steps=60 warmup=30 first_epoch=False isolate=True $opts out=$OUT/levers_$name 2>&1 \
    | tr '\r' '\n' | grep -v "step/s\]\|s/step\]" | grep "^mode\|^ceiling\|^yolofeed \|error"
done
find $OUT -name '*.pt' -delete
source tools/device/pack_out.sh

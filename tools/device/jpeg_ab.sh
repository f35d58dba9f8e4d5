#!/usr/bin/env bash
# Where a jpeg pack's step loses time against a raw pack's, yolo11n, batch 128, the 10k set: the decode and the
# resize and write of a batch alone on the GPU (place_cost.py); raw and jpeg steps side by side in one process,
# three of each, beside the jpeg loader with the resize and write in torch ops instead of one Triton kernel, and
# without them, in both orders; the GPU's idle gaps and each thread's and stream's time under the profiler without
# Python stacks; then the raw pack's loader in a 6 GiB memory cgroup, its pages evicted (posix_fadvise(WILLNEED)
# reads each batch). ~11 min on nvidia-h200; PARTS splits it where a call allows less.
# Usage: bash tools/device/jpeg_ab.sh
# Environment: PARTS="steps gaps memory" (the default: all three; "first" adds the time to the first step and the
# first epoch of a jpeg pack, a raw pack and stock, in fresh processes; "storage" adds raw and jpeg steps beside
# jpeg and raw read from storage every epoch, step_ab's _uncached, ~3 min; "setup" adds where the time to the
# first step goes for the same three, setup_timeline.py, ~3 min); VARIANTS (step_ab's, comma-separated)
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,12p' "$0"; exit 0; fi
PARTS="${PARTS:-steps gaps memory}"
J=yolofeed_jpeg
VARIANTS="${VARIANTS:-yolofeed,$J,${J}_torch_place,${J}_no_place,yolofeed,$J,${J}_torch_place,${J}_no_place,\
${J}_no_place,${J}_torch_place,$J,yolofeed}"
source tools/device/setup.sh
set +e
lscpu | grep -E "^(Model name|Thread|Core|Socket|CPU\(s\))"
D=/tmp/synth
[ -f $D/data.yaml ] || python3 -m yolofeed synth out=$D n_train=10000 n_val=500 seed=0 2>&1 | tail -1
for f in raw jpeg; do
  python3 -m yolofeed pack data=$D/data.yaml imgsz=640 format=$f 2>&1 | tr "\r" "\n" | grep "pack train.*built"
done
[[ $PARTS == *steps* ]] && python3 -m tools.device.place_cost $D/yolofeed-packs/data-jpeg-640/train.yfpack \
  | grep PLACE_COST
[[ $PARTS == *steps* ]] && timeout 480 python3 -m tools.device.step_ab $D/data.yaml yolo11n.yaml $VARIANTS 2>&1 \
  | grep -A2 STEP_AB
[[ $PARTS == *storage* ]] && timeout 300 python3 -m tools.device.step_ab $D/data.yaml yolo11n.yaml \
  yolofeed,$J,${J}_uncached,yolofeed_uncached,${J}_uncached,$J,yolofeed 2>&1 | grep -E -A2 "STEP_AB|_uncached:"
[[ $PARTS == *gaps* ]] && for m in yolofeed_jpeg yolofeed; do
  timeout 90 python3 -m tools.device.gpu_gaps $D/data.yaml $m --no-stack --steps 20 2>&1 | grep -A60 "under torch"
done
if [[ $PARTS == *first* ]]; then  # a process each: cuDNN's and nvJPEG's one-off costs are paid once a process
  for m in yolofeed_jpeg yolofeed stock; do
    timeout 150 python3 -m yolofeed bench model=yolo11n.yaml data=$D/data.yaml imgsz=640 batch=128 workers=16 \
      modes=$m steps=60 warmup=20 first_epoch=True out=$OUT/first_$m 2>&1 | tr '\r' '\n' | grep -A3 "^mode "
  done
fi
[[ $PARTS == *setup* ]] && timeout 300 python3 -m tools.device.setup_timeline $D/data.yaml yolo11n.yaml \
  yolofeed_jpeg,yolofeed,stock
RAW=$D/yolofeed-packs/data-raw-640/train.yfpack
if [[ $PARTS == *memory* ]]; then
  python3 -m tools.device.evict $RAW
  timeout 120 bash tools/device/in_memory_limit.sh 6442450944 python3 -m tools.device.loader_memory $RAW --epochs 3 \
    --label raw-limit 2>&1 | tail -6
fi
[[ $PARTS == *steps* || $PARTS == *storage* ]] && python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_decode.py 2>&1 | tail -3
source tools/device/pack_out.sh

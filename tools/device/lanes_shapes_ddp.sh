#!/usr/bin/env bash
# Issues 17 and 18 on nvidia-h200-x2 (~9 min). First two lanes at once, one GPU and half the cores each:
#   lane 0 (GPU 0, cores 0-15): stock and yolofeed each in a fresh process (one bench a mode): the time to the
#     first step and the first epoch as a user meets them, then a second yolofeed bench (run to run spread).
#   lane 1 (GPU 1, cores 16-31): the model's cost at a new batch size (shape_cost.py: plain, cuDNN off, warmed
#     from a background thread), then the GPU time a step of raw against jpeg packs (kernel_top.py).
# Then both GPUs: the all-reduce bandwidth (allreduce_bw.py), and yolofeed and stock under DDP (device=0,1,
# batch 256) against yolofeed on one GPU (batch 128), each a bench through its first epoch and on.
# Everything lands in $OUT/results.tgz.
# Usage: bash tools/device/lanes_shapes_ddp.sh
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,11p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off
python3 -m yolofeed synth out=/tmp/synth n_train=10000 n_val=500 seed=0 2>&1 | tail -1
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 format=raw 2>&1 | grep -v "img/s\]" | tail -2
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 format=jpeg 2>&1 | grep -v "img/s\]" | tail -2
python3 -c "from ultralytics.data.dataset import YOLODataset; from ultralytics.data.utils import check_det_dataset
from ultralytics.cfg import get_cfg; d = check_det_dataset('/tmp/synth/data.yaml')
YOLODataset(img_path=d['train'], imgsz=640, augment=False, data=d, hyp=get_cfg())" > /dev/null 2>&1  # labels cache
B="warmup=30 workers=16 imgsz=640 data=/tmp/synth/data.yaml model=yolo11n.yaml"
mkdir -p $OUT/lane0 $OUT/lane1 $OUT/ddp
(
  export CUDA_VISIBLE_DEVICES=0 OUT=$OUT/lane0
  for m in stock yolofeed yolofeed; do
    timeout 150 taskset -c 0-15 python3 -m yolofeed bench $B steps=100 batch=128 modes=$m first_epoch=True \
      out=$OUT/fresh_$m > $OUT/fresh_$m.txt 2>&1
    mv $OUT/fresh_$m $OUT/fresh_${m}_$((++k)); mv $OUT/fresh_$m.txt $OUT/fresh_${m}_$k.txt
  done
) &
(
  export CUDA_VISIBLE_DEVICES=1 OUT=$OUT/lane1
  for v in "" --no-cudnn --background; do
    timeout 60 taskset -c 16-31 python3 -m tools.device.shape_cost $v >> $OUT/shape_cost.txt 2>&1
  done
  timeout 150 taskset -c 16-31 python3 -m tools.device.kernel_top /tmp/synth/data.yaml yolofeed,yolofeed_jpeg \
    yolo11n.yaml > $OUT/kernel_top.txt 2>&1
) &
wait
(
  export OUT=$OUT/ddp
  timeout 60 python3 -m tools.device.allreduce_bw --gpus 2 --model yolo11n.yaml > $OUT/allreduce_bw.txt 2>&1
  timeout 150 python3 -m yolofeed bench $B steps=120 batch=256 device=0,1 modes=yolofeed,stock first_epoch=True \
    out=$OUT/bench_2gpu > $OUT/bench_2gpu.txt 2>&1
  timeout 100 taskset -c 0-15 python3 -m yolofeed bench $B steps=120 batch=128 device=0 modes=yolofeed \
    first_epoch=True out=$OUT/bench_1gpu > $OUT/bench_1gpu.txt 2>&1
)
for f in $OUT/*/*.txt; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v "━\|it/s]\|step/s]" | tail -14; done
find $OUT -name '*.pt' -delete
find $OUT -path '*/runs/*' -type f ! -name results.csv ! -name args.yaml -delete
source tools/device/pack_out.sh

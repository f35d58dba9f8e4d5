#!/usr/bin/env bash
# Scaling from one GPU to two on nvidia-h200-x2 (~7 min): the all-reduce bandwidth (allreduce_bw.py), then yolofeed and
# stock under Ultralytics' DDP (device=0,1, batch 256: 128 a GPU) against one GPU (device=0, batch 128, on 16
# cores, one bench process a mode), each a bench through its first epoch (its wall time: the epoch-time scaling)
# and on (the step rate). 10,000 synthetic images at 640, yolo11n. Everything lands in $OUT/results.tgz.
# Usage: bash tools/device/ddp_scaling.sh
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,6p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off
python3 -m yolofeed synth out=/tmp/synth n_train=10000 n_val=500 seed=0 2>&1 | tail -1
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 format=raw 2>&1 | grep -v "img/s\]" | tail -2
python3 -c "from ultralytics.data.dataset import YOLODataset; from ultralytics.data.utils import check_det_dataset
from ultralytics.cfg import get_cfg; d = check_det_dataset('/tmp/synth/data.yaml')
YOLODataset(img_path=d['train'], imgsz=640, augment=False, data=d, hyp=get_cfg())" > /dev/null 2>&1  # labels cache
B="warmup=30 steps=120 workers=16 imgsz=640 data=/tmp/synth/data.yaml model=yolo11n.yaml first_epoch=True"
timeout 60 python3 -m tools.device.allreduce_bw --gpus 2 --model yolo11n.yaml > $OUT/allreduce_bw.txt 2>&1
timeout 200 python3 -m yolofeed bench $B batch=256 device=0,1 modes=yolofeed,stock out=$OUT/bench_2gpu \
  > $OUT/bench_2gpu.txt 2>&1
for m in yolofeed stock; do  # a process a mode, as each DDP rank is: each pays its own one-off costs
  timeout 120 taskset -c 0-15 python3 -m yolofeed bench $B batch=128 device=0 modes=$m \
    out=$OUT/bench_1gpu_$m > $OUT/bench_1gpu_$m.txt 2>&1
done
for f in $OUT/*.txt; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v "━\|it/s]\|step/s]" | tail -14; done
find $OUT -name '*.pt' -delete
find $OUT -path '*/runs/*' -type f ! -name results.csv ! -name args.yaml -delete
source tools/device/pack_out.sh

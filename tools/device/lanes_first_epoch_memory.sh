#!/usr/bin/env bash
# Issues 17 and 18 on nvidia-h200-x2 (~8 min), two lanes at once, each on one GPU and half the cores:
#   lane 0 (GPU 0, cores 0-15): the GPU tests; the augmentation's one-off costs (capture_cost.py); the first
#     epoch and steady rate of yolofeed, yolofeed without the partner pool, and the ceiling (one bench process).
#   lane 1 (GPU 1, cores 16-31): the loader's memory and rate on raw and jpeg packs, unlimited and in a memory
#     cgroup smaller than the raw pack (loader_memory.py); the jpeg decode's parts (jpeg_decode.py); the bench of
#     raw against jpeg, unlimited and under the limit.
# Each lane has its own 10k-image dataset and packs: lane 1 evicts its packs from the page cache, lane 0's stay.
# Logs and JSON land in $OUT/lane0 and $OUT/lane1.
# Usage: bash tools/device/lanes_first_epoch_memory.sh      Environment: LIMIT=6G (the cgroup's memory limit)
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,11p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
LIMIT=${LIMIT:-6G}
limit_bytes=$(numfmt --from=iec "$LIMIT")
python3 -m yolofeed synth out=/tmp/synth n_train=10000 n_val=500 seed=0 2>&1 | tail -1
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 format=raw 2>&1 | grep -v "img/s\]" | tail -4
BENCH="steps=100 warmup=30 workers=16 batch=128 imgsz=640 data=/tmp/synth/data.yaml model=yolo11n.yaml"
mkdir -p $OUT/lane0 $OUT/lane1
(
  export CUDA_VISIBLE_DEVICES=0 OUT=$OUT/lane0
  cd "$PWD"
  timeout 200 taskset -c 0-15 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -rA 2>&1 | tail -40 \
    > $OUT/gpu_tests.txt
  timeout 90 taskset -c 0-15 python3 tools/device/capture_cost.py > $OUT/capture_cost.txt 2>&1
  timeout 240 taskset -c 0-15 python3 -m yolofeed bench $BENCH modes=yolofeed,yolofeed_nopool,ceiling \
    first_epoch=True out=$OUT/bench_pool > $OUT/bench_pool.txt 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1 OUT=$OUT/lane1
  run() { timeout "$1" taskset -c 16-31 "${@:2}"; }
  lim="bash tools/device/in_memory_limit.sh $limit_bytes"
  # evict one file's pages from the page cache (the other lane's files stay cached)
  evict() { python3 -c "import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd); \
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$1"; }
  D=/tmp/synth1  # this lane's own dataset: evicting its packs leaves lane 0's first epoch alone
  run 120 python3 -m yolofeed synth out=$D n_train=10000 n_val=500 seed=1 2>&1 | tail -1
  run 60 python3 -m yolofeed pack data=$D/data.yaml imgsz=640 format=raw 2>&1 | grep -v "img/s\]" | tail -3
  run 60 python3 -m yolofeed pack data=$D/data.yaml imgsz=640 format=jpeg 2>&1 | grep -v "img/s\]" | tail -3
  RAW=$D/yolofeed-packs/data-raw-640/train.yfpack
  JPEG=$D/yolofeed-packs/data-jpeg-640/train.yfpack
  run 60 python3 -m tools.device.loader_memory $RAW --label raw > $OUT/loader_memory.txt 2>&1
  run 60 python3 -m tools.device.loader_memory $JPEG --label jpeg >> $OUT/loader_memory.txt 2>&1
  evict $RAW; evict $JPEG
  run 120 $lim python3 -m tools.device.loader_memory $RAW --epochs 3 --label raw-limit >> $OUT/loader_memory.txt 2>&1
  run 60 $lim python3 -m tools.device.loader_memory $JPEG --epochs 3 --label jpeg-limit >> $OUT/loader_memory.txt 2>&1
  evict $RAW; evict $JPEG
  run 200 $lim python3 -m yolofeed bench ${BENCH/\/tmp\/synth\//$D/} modes=yolofeed_jpeg,yolofeed first_epoch=True \
    out=$OUT/bench_limit > $OUT/bench_limit.txt 2>&1
  run 60 python3 -m tools.device.jpeg_decode $JPEG > $OUT/jpeg_decode.txt 2>&1
  run 130 python3 -m yolofeed bench ${BENCH/\/tmp\/synth\//$D/} modes=yolofeed,yolofeed_jpeg first_epoch=False \
    out=$OUT/bench_jpeg > $OUT/bench_jpeg.txt 2>&1
) &
wait
for f in $OUT/lane*/*.txt; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v "━\|it/s]\|img/s]" | tail -30; done
find $OUT -name '*.pt' -delete

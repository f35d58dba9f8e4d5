#!/usr/bin/env bash
# Issues 17 and 18 on one H200 (nvidia-h200, ~8 min): the warm-up's GPU tests; stock and yolofeed each in a fresh
# process (one bench a mode: the time to the first step and the first epoch as a user meets them), yolofeed twice;
# then the raw pack read from storage in a memory cgroup smaller than it (LIMIT, default 6G): the loader alone
# (loader_memory.py, 3 epochs) and yolofeed training (a bench). Everything lands in $OUT/results.tgz.
# Usage: bash tools/device/warmup_memory.sh
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,6p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
limit_bytes=$(numfmt --from=iec "${LIMIT:-6G}")
python3 -m pytest -q -m gpu tests/test_warmup.py tests/test_pack.py -p no:cacheprovider -rA 2>&1 | tail -5 \
  > $OUT/gpu_tests.txt
python3 -m yolofeed synth out=/tmp/synth n_train=10000 n_val=500 seed=0 2>&1 | tail -1
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 format=raw 2>&1 | grep -v "img/s\]" | tail -2
python3 -c "from ultralytics.data.dataset import YOLODataset; from ultralytics.data.utils import check_det_dataset
from ultralytics.cfg import get_cfg; d = check_det_dataset('/tmp/synth/data.yaml')
YOLODataset(img_path=d['train'], imgsz=640, augment=False, data=d, hyp=get_cfg())" > /dev/null 2>&1  # labels cache
B="workers=16 imgsz=640 data=/tmp/synth/data.yaml model=yolo11n.yaml batch=128"
k=0
for m in yolofeed stock yolofeed; do
  k=$((k + 1))
  timeout 150 python3 -m yolofeed bench $B warmup=30 steps=100 first_epoch=True modes=$m out=$OUT/fresh_${m}_$k \
    > $OUT/fresh_${m}_$k.txt 2>&1
done
RAW=/tmp/synth/yolofeed-packs/data-raw-640/train.yfpack
evict() { python3 -c "import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$1"; }
lim="bash tools/device/in_memory_limit.sh $limit_bytes"
evict $RAW
timeout 100 $lim python3 -m tools.device.loader_memory $RAW --epochs 3 --label raw-limit > $OUT/loader_memory.txt 2>&1
evict $RAW
timeout 150 $lim python3 -m yolofeed bench $B warmup=20 steps=60 first_epoch=False modes=yolofeed \
  out=$OUT/bench_limit > $OUT/bench_limit.txt 2>&1
for f in $OUT/*.txt; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v "━\|it/s]\|step/s]" | tail -8; done
find $OUT -name '*.pt' -delete
find $OUT -path '*/runs/*' -type f ! -name results.csv ! -name args.yaml -delete
source tools/device/pack_out.sh

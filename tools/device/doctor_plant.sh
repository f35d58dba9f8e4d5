#!/usr/bin/env bash
# Plant each bottleneck for real on a GPU machine (nvidia-h200, 16 cores) and record the doctor's verdict.
# Usage: bash tools/device/doctor_plant.sh [CASES]   CASES: comma-separated, default all of
#   workers,augment,small_batch,contention,validation,gpu_bound,disk   (disk last: it caps its own shell's reads)
# Writes $OUT/plant_<case>/report.json and the verdicts to $OUT/plant.txt. About a minute a case.
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,5p' "$0"; exit 0; fi
source tools/device/setup.sh
set +e
CASES=${1:-workers,augment,small_batch,contention,validation,gpu_bound,disk}
D=${PLANT_DATA:-/tmp/plant}  # PLANT_DATA=<folder of an existing synth dataset> skips generating one
[ -n "$PLANT_DATA" ] || python3 -m yolofeed synth out=$D n_train=4000 n_val=2000 seed=0 2>&1 | grep -v "img/s\]"
doc() {  # doc NAME ARGS...
  name=$1; shift
  python3 -m yolofeed doctor model=yolo11n.yaml data=$D/data.yaml imgsz=640 steps=20 warmup=8 \
    out=$OUT/plant_$name "$@" 2>&1 | grep -v "it/s\|━" | grep -A30 "^yolofeed doctor:" | tee -a $OUT/plant.txt
}
for c in ${CASES//,/ }; do
  echo "=== $c ===" | tee -a $OUT/plant.txt
  case $c in
    workers)     doc workers batch=64 workers=1 time_validation=False ;;
    augment)     doc augment batch=128 workers=16 mixup=1.0 cutmix=1.0 degrees=10 time_validation=False ;;
    small_batch) doc small_batch batch=4 workers=8 time_validation=False yolofeed=False ;;
    contention)  # 12 busy processes in a session of their own, killed as a group afterwards (a pattern such as
                 # pkill -f takes is a regular expression and can miss them: they would run on into the next cases)
                 setsid python3 -c "import multiprocessing as m
for _ in range(12): m.Process(target=lambda: [0 for _ in iter(int, 1)]).start()" &
                 HOG=$!; sleep 2; doc contention batch=128 workers=16 time_validation=False; kill -- -$HOG; sleep 1 ;;
    validation)  doc validation batch=64 workers=16 ;;
    gpu_bound)   python3 -m yolofeed doctor model=yolo11x.yaml data=$D/data.yaml imgsz=640 batch=32 workers=16 \
                   steps=16 warmup=8 time_validation=False yolofeed=False out=$OUT/plant_gpu_bound 2>&1 \
                   | grep -A30 "^yolofeed doctor:" | tee -a $OUT/plant.txt ;;
    disk)        # the dataset's files evicted from the page cache (posix_fadvise DONTNEED: the libraries stay cached;
                 # dropping every cache made torch's own imports crawl at the cap) and, where cgroup v2 has the io
                 # controller, this shell's reads capped at 10 MB/s (~110 synthetic images/s of 90 KB)
                 # Before capping: Ultralytics' label cache (its first build opens every image, which would read
                 # them all at the cap and leave them in the page cache, so that training reads mostly from
                 # memory), and the libraries' pages (a cold machine page-faults torch's CUDA libraries at the
                 # cap, and the main loop crawls while the loader idles)
                 python3 - $D <<'PY'
import sys
from ultralytics.data.dataset import YOLODataset
from ultralytics.data.utils import check_det_dataset
d = check_det_dataset(sys.argv[1] + "/data.yaml")
for split in ("train", "val"):
    YOLODataset(img_path=d[split], imgsz=640, data=d, task="detect", augment=False)
PY
                 sp=$(python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
                 find $sp/torch/lib $sp/nvidia $sp/cv2 -name "*.so*" -type f -exec cat {} + > /dev/null 2>&1
                 sync  # DONTNEED leaves dirty pages: the files synth just wrote must reach the disk first
                 python3 -c "import os, sys, pathlib
for p in pathlib.Path(sys.argv[1]).rglob('*'):
    if p.is_file():
        fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)" $D
                 src=$(df --output=source $D | tail -1); disk=$(lsblk -no PKNAME "$src" 2>/dev/null | head -1)
                 [ -n "$disk" ] && src=/dev/$disk  # io.max takes the whole disk, not a partition
                 dev=$(lsblk -dno MAJ:MIN "$src" 2>/dev/null | tr -d ' ')
                 echo "dataset on $src ($dev), $(findmnt -no FSTYPE -T $D)" | tee -a $OUT/plant.txt
                 if [ -w /sys/fs/cgroup/cgroup.subtree_control ]; then
                   mkdir -p /sys/fs/cgroup/slowio && echo "+io" > /sys/fs/cgroup/cgroup.subtree_control
                   echo "$dev rbps=10485760" > /sys/fs/cgroup/slowio/io.max \
                     && echo $$ > /sys/fs/cgroup/slowio/cgroup.procs \
                     && echo "reads capped: $(cat /sys/fs/cgroup/slowio/io.max)" | tee -a $OUT/plant.txt
                 fi
                 # batch 32: the warm-up covers the 16 workers' queue (64 batches, measure/profile.py), so warm-up and
                 # measured steps read 2,368 of the 4,000 images once; a second epoch would come from the page cache
                 doc disk batch=32 workers=16 time_validation=False yolofeed=False steps=10 warmup=4 ;;
  esac
done

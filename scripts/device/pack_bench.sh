#!/usr/bin/env bash
# Issue 2 on the device machine: synth 10k COCO-like images, pack them (raw and jpeg), report rates.
# Usage (from the repo root, via the device tool): bash scripts/device/pack_bench.sh [quick]
source scripts/device/setup.sh
D=/tmp/synth
log() { tee -a "$OUT/pack_bench.txt"; }
pack() { python3 -m yolofeed pack data=$D/data.yaml imgsz=640 "$@" 2>&1 | grep -v "img/s\]" | grep -v "^  ->" | log; }

echo "== synth 10,000 + 1,000 images, imgsz 640 ==" | log
/usr/bin/time -f "synth wall %e s, cpu %P" python3 -m yolofeed synth out=$D n_train=10000 n_val=1000 seed=0 2>&1 | grep -v "img/s\]" | log
du -sh $D/images/train | log
[ "$1" = quick ] || for w in 16 8 2; do python3 scripts/device/decode_ceiling.py $D/data.yaml $w 2>&1 | log; done

# Page cache warm (the files were just written). Three repeats each: medians go in BENCHMARKS.md.
for rep in 1 2 3; do echo "== pack raw, 16 workers, rep $rep ==" | log; pack splits=train rebuild=always; done
for rep in 1 2 3; do echo "== pack raw, 16 workers, sync=True, rep $rep ==" | log; pack splits=train rebuild=always sync=True; done
[ "$1" = quick ] || { echo "== pack raw, 2 workers ==" | log; pack splits=train rebuild=always workers=2; }
if sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
  echo "== pack raw, cold page cache, 16 workers ==" | log; pack splits=train rebuild=always
fi
echo "== pack jpeg, 16 workers ==" | log; pack format=jpeg rebuild=always
ls -la $D/yolofeed-packs/* | log

#!/usr/bin/env bash
# The pack build rate on this machine (nvidia-h200: 16 cores; no GPU used, ~5 min): synthesise 10,000 COCO-like
# JPEGs, pack the training split three times each without and with sync=True (the medians are the figures), once
# after dropping the page cache (where this shell may), once as jpeg; the decode ceiling at 16/8/2 processes; and
# the writer's raw write rates (io_probe: 9.2 GB written five times). Output in $OUT/pack_bench.txt.
# Usage: bash tools/device/pack_bench.sh [quick]   quick: no decode ceiling, no 2-worker build, no io_probe.
# Environment: N_TRAIN=10000 (images), D=/tmp/synth (dataset folder).
if [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,7p' "$0"; exit 0; fi
source tools/device/setup.sh
D=${D:-/tmp/synth}
N=${N_TRAIN:-10000}
log() { tee -a "$OUT/pack_bench.txt"; }
pack() { python3 -m yolofeed pack data=$D/data.yaml imgsz=640 "$@" 2>&1 | grep -v "img/s\]" | grep -v "^  ->" | log; }

echo "== synth $N + $((N / 10)) images, imgsz 640 ==" | log
/usr/bin/time -f "synth wall %e s, cpu %P" python3 -m yolofeed synth out=$D n_train=$N n_val=$((N / 10)) seed=0 2>&1 \
  | grep -v "img/s\]" | log
du -sh $D/images/train | log
[ "$1" = quick ] || for w in 16 8 2; do python3 -m tools.device.decode_ceiling $D/data.yaml $w 2>&1 | log; done

# Page cache warm (the files were just written). Three repeats each: the medians are the figures.
for rep in 1 2 3; do echo "== pack raw, 16 workers, rep $rep ==" | log; pack splits=train rebuild=always; done
for rep in 1 2 3; do
  echo "== pack raw, 16 workers, sync=True, rep $rep ==" | log; pack splits=train rebuild=always sync=True
done
[ "$1" = quick ] || { echo "== pack raw, 2 workers ==" | log; pack splits=train rebuild=always workers=2; }
if sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
  echo "== pack raw, cold page cache, 16 workers ==" | log; pack splits=train rebuild=always
fi
echo "== pack jpeg, 16 workers ==" | log; pack format=jpeg rebuild=always
ls -la $D/yolofeed-packs/* | log
[ "$1" = quick ] || { echo "== io_probe ==" | log; python3 -m tools.device.io_probe $D/io_probe.bin 2>&1 | log; }

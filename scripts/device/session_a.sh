#!/usr/bin/env bash
# One device call for issue 4: the GPU tests, then the three-model bench (yolofeed vs stock vs ceiling) on 10k
# synthetic images, batch 128, imgsz 640. Results bundled in $OUT/results.tgz. BENCH_JPEG=1 adds the jpeg pack for yolo11n,
# CEILING_STOCK=1 the ceiling on Ultralytics' own step and loss.
source scripts/device/prelude.sh  # setup, the GPU tests beside the dataset and its pack
b() {  # b MODEL MODES SECONDS
  timeout $3 python3 -m yolofeed bench model=$1 modes=$2 data=/tmp/synth/data.yaml batch=128 imgsz=640 steps=100 \
    warmup=30 workers=16 out=$OUT/bench_${1%.yaml} 2>&1 | grep -v "it/s\|━" | tail -8
}
b yolo11n.yaml stock,yolofeed,ceiling${BENCH_JPEG:+,yolofeed_jpeg}${CEILING_STOCK:+,ceiling_stock} 240
b yolo11s.yaml stock,yolofeed,ceiling 140
b yolo26n.yaml stock,yolofeed,ceiling 140
[ -n "$NO_PACK" ] || source scripts/device/pack_out.sh  # NO_PACK=1: a caller bundles

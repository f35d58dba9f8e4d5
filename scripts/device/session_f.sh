#!/usr/bin/env bash
# Next device call for issue 4's GPU-utilisation target (~6 min): where the GPU idles in a step, for the data-free
# ceiling and for yolofeed (yolo11n and yolo26n, batch 128, imgsz 640), under torch.profiler
# (scripts/device/gpu_gaps.py). Results in $OUT/results.tgz.
source scripts/device/setup.sh
set +e
python3 -m yolofeed synth out=/tmp/synth n_train=10000 n_val=500 seed=0 2>&1 | grep -v "img/s\]"
python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 format=raw 2>&1 | grep -v "img/s\]"
for m in yolo11n.yaml yolo26n.yaml; do
  for mode in ceiling yolofeed; do
    timeout 150 python3 scripts/device/gpu_gaps.py /tmp/synth/data.yaml $mode $m 2>&1 | grep -v "it/s\|━" | tail -72
    mv $OUT/gpu_gaps_$mode.txt $OUT/gpu_gaps_${mode}_${m%.yaml}.txt 2>/dev/null
  done
done
source scripts/device/pack_out.sh

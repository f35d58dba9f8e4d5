#!/usr/bin/env bash
# Issue 13 on nvidia-h200-x2: `yolofeed parity` on a set yolo11n learns (8 classes that differ in shape and colour,
# 1-8 figures of >= 16 px), stock vs yolofeed, SEEDS seeds a side, PARALLEL runs at once on each GPU. The GPU tests
# run first beside the dataset's generation, then a one-epoch yolofeed smoke run: parity only starts if that trains.
# MODEL=yolo11n.yaml SEEDS=6 PARALLEL=6 EPOCHS=40 N_TRAIN=3000 LIMIT=470 (seconds for the parity command).
source scripts/device/setup.sh
set +e
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MODEL=${MODEL:-yolo11n.yaml}; D=/tmp/parity
if [ -z "$NO_GPU_TESTS" ]; then
  (CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -rA 2>&1 \
    | grep -E "PASSED|FAILED|SKIPPED|Error|assert|passed|failed" | tail -40 > $OUT/gpu_tests.txt) &
fi
python3 -m yolofeed synth out=$D n_train=${N_TRAIN:-3000} n_val=300 imgsz=320 classes=8 boxes=8 min_box=16 seed=0 \
  2>&1 | grep -v "img/s\]"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m yolofeed train model=$MODEL data=$D/data.yaml imgsz=320 epochs=1 batch=64 \
  project=/tmp/smoke name=smoke exist_ok=True plots=False > $OUT/smoke.txt 2>&1
SMOKE=$?
grep -v "it/s\|━" $OUT/smoke.txt | tail -12
wait; cat $OUT/gpu_tests.txt 2>/dev/null
if [ $SMOKE = 0 ]; then
  timeout ${LIMIT:-470} python3 -m yolofeed parity model=$MODEL data=$D/data.yaml epochs=${EPOCHS:-40} seeds=${SEEDS:-6} \
    imgsz=320 batch=64 device=0,1 parallel=${PARALLEL:-6} out=$OUT/parity 2>&1 | tr '\r' '\n' | grep -v "parity runs:" \
    | grep -v "Scanning\|Fast image" | tail -30
  cp $OUT/parity/parity.png $OUT/ 2>/dev/null; cp $OUT/parity/parity.json $OUT/ 2>/dev/null
  (cd $OUT/parity && tar czf $OUT/parity_runs.tgz logs runs/*/results.csv runs/*/args.yaml 2>/dev/null)
  rm -rf $OUT/parity
fi
nvidia-smi --query-gpu=index,memory.used --format=csv

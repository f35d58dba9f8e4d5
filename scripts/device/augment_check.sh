#!/usr/bin/env bash
# Issue 3 on the device machine: GPU tests (Triton == reference exactly, no host sync), then the benchmark.
source scripts/device/setup.sh
set +e
python3 -m yolofeed synth out=/tmp/synth n_train=1024 n_val=8 seed=0 2>&1 | grep -v "img/s\]"
python3 scripts/device/diag_gpu.py /tmp/synth/data.yaml 2>&1 | tee "$OUT/diag.txt"
python3 -m pytest -q -m gpu tests/test_augment_gpu.py -p no:cacheprovider 2>&1 | tail -30 | tee "$OUT/gpu_tests.txt"
python3 scripts/device/augment_bench.py /tmp/synth/data.yaml 2>&1 | tee "$OUT/augment_bench.txt"

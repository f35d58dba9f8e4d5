#!/usr/bin/env bash
# One device call: issue 4's three-model bench, then issue 5's accounting overhead on the same 10k dataset.
source scripts/device/setup.sh
set +e
timeout 440 bash scripts/device/train_bench.sh 2>&1 | tee $OUT/train_bench.txt
timeout 130 python3 scripts/device/monitor_overhead.py /tmp/synth/data.yaml 2>&1 | grep -v "it/s\|━" | tail -15 | tee $OUT/overhead.txt
source scripts/device/pack_out.sh

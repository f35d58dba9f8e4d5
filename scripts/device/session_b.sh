#!/usr/bin/env bash
# One device call for issue 5: the planted bottlenecks, the accounting's overhead, and where a ceiling step's host time goes.
source scripts/device/setup.sh
set +e
timeout 340 bash scripts/device/doctor_plant.sh workers,augment,small_batch,contention,validation,gpu_bound,disk
timeout 110 python3 scripts/device/monitor_overhead.py /tmp/synth/data.yaml 2>&1 | grep -v "it/s\|━" | tail -15 | tee $OUT/overhead.txt
timeout 50 python3 scripts/device/ceiling_profile.py /tmp/synth/data.yaml 2>&1 | grep -v "it/s\|━" | tail -45
source scripts/device/pack_out.sh

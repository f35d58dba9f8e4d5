#!/usr/bin/env bash
# One device call for issue 5: every planted bottleneck through the doctor, then the accounting's overhead
# (paired on/off windows in one run). Results bundled in $OUT/results.tgz.
source scripts/device/setup.sh
set +e
timeout 470 bash scripts/device/doctor_plant.sh workers,augment,contention,small_batch,validation,gpu_bound,disk
timeout 110 python3 scripts/device/monitor_overhead.py /tmp/plant/data.yaml 2>&1 | grep -v "it/s\|━" | tail -8 | tee $OUT/overhead.txt
source scripts/device/pack_out.sh

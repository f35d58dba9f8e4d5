#!/usr/bin/env bash
# One device call for issue 5's remaining plants: the batch-4 case under the fixed small-batch rule, validation
# without leftover hogs, and the disk case (last: it caps its own shell's reads). Results in $OUT/results.tgz.
source scripts/device/setup.sh
set +e
timeout ${PLANT_SECONDS:-400} bash scripts/device/doctor_plant.sh small_batch,validation,disk
source scripts/device/pack_out.sh

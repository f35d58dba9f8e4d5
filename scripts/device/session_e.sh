#!/usr/bin/env bash
# One device call: session_a.sh (GPU tests, the three-model bench), then the doctor's disk case (last: its shell
# caps its own reads). Results in $OUT/results.tgz.
export OUT=${OUT:-/tmp/out}
NO_PACK=1 bash scripts/device/session_a.sh
set +e
timeout 200 bash scripts/device/doctor_plant.sh disk
source scripts/device/pack_out.sh

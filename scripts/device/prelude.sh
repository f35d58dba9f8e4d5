# Source me first in a device session script: setup.sh, then the GPU tests (pytest -m gpu, into $OUT/gpu_tests.txt)
# beside the 10k-image synthetic dataset's generation and its raw pack (BENCH_JPEG=1: a jpeg pack too). No timing is
# taken from either. Leaves `set +e`. NO_GPU_TESTS=1 skips the tests.
source scripts/device/setup.sh
set +e
([ -n "$NO_GPU_TESTS" ] || timeout 150 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -rA 2>&1 | grep -v "Warning\|popen_fork\|self.pid\|^$" \
  | grep -E "PASSED|FAILED|SKIPPED|Error|assert|nvJPEG|passed|failed" | tail -40 > $OUT/gpu_tests.txt) &
TESTS=$!
python3 -m yolofeed synth out=/tmp/synth n_train=10000 n_val=500 seed=0 2>&1 | grep -v "img/s\]"
for f in raw ${BENCH_JPEG:+jpeg}; do python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640 format=$f 2>&1 | grep -v "img/s\]"; done
wait $TESTS; cat $OUT/gpu_tests.txt 2>/dev/null

# Source me first on a GPU machine (tools/reproduce.py does): installs the Ultralytics wheels carried in .whl/
# where there is such a folder (no network there), puts src/ on the path, and records the machine and versions
# in $OUT/env.txt. Leaves `set -eo pipefail`.
set -eo pipefail
if compgen -G ".whl/*.whl" > /dev/null; then
  wheels="$(ls .whl/*.whl | xargs -n1 basename | sort | tr '\n' ' ')"
  if [ "$(cat /tmp/site/.wheels 2>/dev/null)" != "$wheels" ]; then  # installed once a machine
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    echo "$wheels" > /tmp/site/.wheels
  fi
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export YOLO_OFFLINE=1 PYTHONUNBUFFERED=1
export OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
{
  date -u +%FT%TZ; git describe --always --dirty 2>/dev/null || true; nproc; free -g | head -2
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import sys, torch, torchvision, cv2, numpy, ultralytics as u; print(sys.version.split()[0], \
    'torch', torch.__version__, 'tv', torchvision.__version__, 'cv2', cv2.__version__, 'numpy', numpy.__version__, \
    'ultralytics', u.__version__)"
} 2>&1 | tee "$OUT/env.txt"

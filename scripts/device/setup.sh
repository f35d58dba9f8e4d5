# Source me on the device machine: installs the carried wheels (.whl/, see README "Device runs")
# and puts yolofeed on the path. Nothing is downloaded there.
set -eo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export YOLO_OFFLINE=1 PYTHONUNBUFFERED=1
export OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
{
  date -u +%FT%TZ; nproc; free -g | head -2; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch, torchvision, cv2, numpy, ultralytics; print(sys.version.split()[0], 'torch', torch.__version__, 'tv', torchvision.__version__, 'cv2', cv2.__version__, 'numpy', numpy.__version__, 'ultralytics', ultralytics.__version__)"
} 2>&1 | tee "$OUT/env.txt"

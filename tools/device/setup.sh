# Source me first on a GPU machine (tools/reproduce.py does): installs the Ultralytics wheels carried in .whl/
# where there is such a folder (no network there), compiles the packages' bytecode, puts src/ on the path, and
# records the machine and versions in $OUT/env.txt. Leaves `set -eo pipefail`.
set -eo pipefail
# Bytecode as a user's machine has it: pip compiles every module it installs, and Python writes what is missing as
# it imports. This machine's Python writes none (PYTHONDONTWRITEBYTECODE=1) and its packages ship none, so every
# process compiled what it imported from source: torch._inductor's import alone (Ultralytics' init_seeds) took
# 4.4-5.1 s against 1.1 s from bytecode on an H100 machine. Compiled once a machine, before anything is timed, for
# every side alike; in place, or in a cache folder where the packages cannot be written.
unset PYTHONDONTWRITEBYTECODE
if [ ! -f /tmp/.bytecode ]; then
  t0=$(date +%s)
  packages="$(python3 -c "import site; print(site.getsitepackages()[0])")"
  [ -w "$packages/torch" ] || export PYTHONPYCACHEPREFIX=/tmp/pycache
  roots=("$(python3 -c "import sysconfig; print(sysconfig.get_path('stdlib'))")")
  for name in torch torchvision triton numpy scipy sympy mpmath matplotlib PIL cv2 networkx jinja2 fsspec filelock \
              yaml psutil tqdm requests urllib3 packaging pyparsing dateutil kiwisolver contourpy fontTools \
              prometheus_client pynvml tensorboard google; do
    [ -e "$packages/$name" ] && roots+=("$packages/$name")
  done
  python3 -m compileall -q -j 0 "${roots[@]}" > /dev/null 2>&1 || true  # a test file in py2 syntax is no matter
  echo "${PYTHONPYCACHEPREFIX:-in place}" > /tmp/.bytecode
  echo "bytecode compiled ($(cat /tmp/.bytecode)) in $(( $(date +%s) - t0 )) s"
fi
[ "$(cat /tmp/.bytecode)" = "in place" ] || export PYTHONPYCACHEPREFIX="$(cat /tmp/.bytecode)"
if compgen -G ".whl/*.whl" > /dev/null; then
  wheels="$(ls .whl/*.whl | xargs -n1 basename | sort | tr '\n' ' ')"
  if [ "$(cat /tmp/site/.wheels 2>/dev/null)" != "$wheels" ]; then  # installed once a machine
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
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
  echo "bytecode: $(cat /tmp/.bytecode)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import sys, torch, torchvision, cv2, numpy, ultralytics as u; print(sys.version.split()[0], \
    'torch', torch.__version__, 'tv', torchvision.__version__, 'cv2', cv2.__version__, 'numpy', numpy.__version__, \
    'ultralytics', u.__version__)"
} 2>&1 | tee "$OUT/env.txt"

"""What cuDNN's set-up at a new batch size costs, and what decides it: each case in a fresh process.

    python -m tools.device.plan_cost [model=yolo11n.yaml] [imgsz=640] [out=DIR]

A case is an environment and a determinism: yolo11n's cold forward and backward pass at batch 128, then 16, under
float16 autocast (the warm-up's passes, train/warmup.py), then the steady forward and backward at 128 (the mean of 5
after 2), so that a cheaper set-up that picks slower kernels shows. Each process also says which of cuDNN's and
NVRTC's libraries it mapped (cuDNN 9 compiles some engines at run time with NVRTC). The cases:

- ``deterministic``: Ultralytics' default (``init_seeds(deterministic=True)``), twice, in two processes: a second
  process shows what a cache across processes keeps;
- ``not_deterministic``: ``deterministic=False``;
- ``jit_cache``: the driver's JIT cache in a fresh folder with 4 GB of room, twice;
- ``eager_modules``: ``CUDA_MODULE_LOADING=EAGER`` (every kernel module loaded at the start, not at first use);
- ``v7_api``: ``TORCH_CUDNN_V8_API_DISABLED=1``, torch's convolutions through cuDNN's legacy API (an algorithm picked
  by ``cudnnGetConvolution*Algorithm_v7``, no execution plan built), read once a process;
- ``heuristic_mode_b``: ``TORCH_CUDNN_USE_HEURISTIC_MODE_B=1``, cuDNN's slower and more accurate heuristics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

JIT_CACHE = {"CUDA_CACHE_PATH": "/tmp/plan_cost_jit", "CUDA_CACHE_MAXSIZE": "4294967296"}
CASES = [  # the cases most likely to move the cost first, so that a time limit cuts the least telling
    ("deterministic", {}, True),
    ("v7_api", {"TORCH_CUDNN_V8_API_DISABLED": "1"}, True),
    ("not_deterministic", {}, False),
    ("v7_api, not_deterministic", {"TORCH_CUDNN_V8_API_DISABLED": "1"}, False),
    ("deterministic, a second process", {}, True),
    ("jit_cache", JIT_CACHE, True),
    ("jit_cache, a second process", JIT_CACHE, True),
    ("eager_modules", {"CUDA_MODULE_LOADING": "EAGER"}, True),
    ("heuristic_mode_b", {"TORCH_CUDNN_USE_HEURISTIC_MODE_B": "1"}, True),
]


def one(model_yaml: str, imgsz: int, deterministic: bool) -> dict:
    """The cold passes and the steady step of one process (see the module's doc)."""
    t0 = time.perf_counter()
    import torch
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.torch_utils import init_seeds
    init_seeds(0, deterministic=deterministic)
    model = DetectionModel(model_yaml, nc=80, verbose=False).cuda().train()
    torch.cuda.synchronize()
    got: dict = {"import_and_build_s": round(time.perf_counter() - t0, 2), "cudnn": torch.backends.cudnn.version()}

    def passes(n: int) -> tuple[float, float]:
        x = torch.zeros(n, 3, imgsz, imgsz, device="cuda")
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(x)
        values = out.values() if isinstance(out, dict) else out
        loss = sum(v.float().sum() for v in values if isinstance(v, torch.Tensor))
        torch.cuda.synchronize()
        f = time.perf_counter() - t
        t = time.perf_counter()
        loss.backward()
        torch.cuda.synchronize()
        model.zero_grad(set_to_none=True)
        return f, time.perf_counter() - t

    for n in (128, 16):
        f, b = passes(n)
        got[f"cold_{n}"] = {"forward_s": round(f, 3), "backward_s": round(b, 3)}
    steady = [sum(passes(128)) for _ in range(7)][2:]
    got["steady_128_ms"] = round(1000 * sum(steady) / len(steady), 2)
    maps = Path("/proc/self/maps").read_text()
    got["libraries"] = sorted({Path(line.split()[-1]).name for line in maps.splitlines()
                               if ("cudnn" in line or "nvrtc" in line) and "/" in line})
    return got


def main(argv: list[str]) -> None:
    args = dict(a.split("=", 1) for a in argv)
    if "case" in args:  # a child: one case
        print(json.dumps(one(args.get("model", "yolo11n.yaml"), int(args.get("imgsz", 640)),
                             args["deterministic"] == "1")))
        return
    out = Path(args.get("out", "."))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name, env, deterministic in CASES:
        cmd = [sys.executable, "-m", "tools.device.plan_cost", "case=1", f"deterministic={int(deterministic)}",
               *(f"{k}={v}" for k, v in args.items() if k in ("model", "imgsz"))]
        done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        row = {"case": name, "env": env, "rc": done.returncode,
               **(json.loads(lines[-1]) if lines else {"error": done.stderr[-1500:]})}
        results.append(row)
        print(json.dumps(row), flush=True)
    (out / "plan_cost.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])

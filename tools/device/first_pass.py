"""Where a model's first pass at a new batch size spends its seconds, and whether a thread other than the training
one can pay them: each case in a fresh process.

Usage: python -m tools.device.first_pass [MODEL] [--cases CASE[,CASE...]]

Each case times, in the order a training run meets them: the first forward + backward at batch 128 under float16
autocast (a training step), a second one, the first at batch 16 (an epoch's last batch), and the first float16 eval
forward at batch 256 and 244 (the validation's batches: Ultralytics validates the EMA in half precision at twice the
batch), then the fused model's at 1, 256 and 244 (the final validation's: best.pt fused, its warm-up at batch 1). The
model is in channels_last, as Ultralytics puts it on CUDA. Each line gives wall and CPU seconds (CPU well above wall:
threads compiling; CPU near wall: one thread's work; CPU far below: waiting for the GPU).

Cases:
    default        as a training run is set up
    thread         a side thread runs the batch-128 pass first; then the main thread's first pass is timed: where it
                   is quick, the set-up is shared by the process's threads, and a warm-up can run beside other work
    thread_busy    the same, the main thread busy in pure Python meanwhile (holding the GIL, as a set-up does)
    thread_all     a side thread runs every pass first (train, validation, the fused final validation's)
    eager_modules  CUDA_MODULE_LOADING=EAGER (every kernel module loaded at start): is the cost loading modules?
    no_cudnn       torch.backends.cudnn.enabled = False: the cost without cuDNN, and the steady pass without it
    benchmark      torch.backends.cudnn.benchmark = True (what Ultralytics does not set)
Writes one line per case and $OUT/first_pass.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

CASES = ("default", "thread", "thread_busy", "thread_all", "eager_modules", "no_cudnn", "benchmark")


def _timed(fn) -> tuple[float, float]:
    import torch

    torch.cuda.synchronize()
    w, c = time.perf_counter(), time.process_time()
    fn()
    torch.cuda.synchronize()
    return round(time.perf_counter() - w, 3), round(time.process_time() - c, 3)


def child(model_name: str, case: str) -> dict:
    import copy

    import torch
    from ultralytics.nn.tasks import DetectionModel

    if case == "no_cudnn":
        torch.backends.cudnn.enabled = False
    if case == "benchmark":
        torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    out: dict = {"case": case}
    out["init"] = _timed(lambda: torch.zeros(1, device=dev))
    model = DetectionModel(model_name, verbose=False).to(dev).to(memory_format=torch.channels_last).train()
    half = copy.deepcopy(model).eval().half()  # the validation's: the EMA in half precision
    fused = copy.deepcopy(model).eval().fuse(verbose=False).half()  # the final validation's: best.pt fused

    def train_pass(n: int) -> None:
        x = torch.zeros(n, 3, 640, 640, device=dev)
        with torch.autocast("cuda", dtype=torch.float16):
            y = model(x)
        ys = y.values() if isinstance(y, dict) else y
        sum(t.float().sum() for t in ys if isinstance(t, torch.Tensor)).backward()
        model.zero_grad(set_to_none=True)

    def eval_pass(m, n: int) -> None:
        with torch.no_grad():
            m(torch.zeros(n, 3, 640, 640, device=dev, dtype=torch.float16))

    every = {"first_128": lambda: train_pass(128), "first_16": lambda: train_pass(16),
             "val_first_256": lambda: eval_pass(half, 256), "val_first_244": lambda: eval_pass(half, 244),
             "fused_first_1": lambda: eval_pass(fused, 1), "fused_first_256": lambda: eval_pass(fused, 256),
             "fused_first_244": lambda: eval_pass(fused, 244)}
    side = {"thread": ["first_128"], "thread_busy": ["first_128"], "thread_all": list(every)}.get(case, [])
    if side:
        def warm() -> None:
            for name in side:
                out[f"side_{name}"] = _timed(every[name])

        t = threading.Thread(target=warm)
        t.start()
        if case == "thread_busy":  # the main thread holds the GIL in pure Python meanwhile (Ultralytics' set-up)
            n, t0 = 0, time.perf_counter()
            while t.is_alive():
                n += sum(i * i for i in range(1000))
            out["main_busy_s"] = round(time.perf_counter() - t0, 3)
        t.join()
    for name, fn in every.items():
        out[name] = _timed(fn)
        if name == "first_128":
            out["second_128"] = _timed(fn)
            out["steady_128"] = _timed(lambda: [train_pass(128) for _ in range(5)])
    out["val_second_256"] = _timed(every["val_first_256"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="yolo11n.yaml")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--child", default=None)
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a.model, a.child)), flush=True)
        return 0
    results = []
    for case in a.cases.split(","):
        env = dict(os.environ)
        if case == "eager_modules":
            env["CUDA_MODULE_LOADING"] = "EAGER"
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "tools.device.first_pass", a.model, "--child", case], env=env,
                           capture_output=True, text=True, timeout=300)
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        r = json.loads(line[7:]) if line else {"case": case, "error": (p.stderr or p.stdout)[-400:]}
        r["process"] = round(time.perf_counter() - t0, 1)
        results.append(r)
        print(json.dumps(r), flush=True)
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "first_pass.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

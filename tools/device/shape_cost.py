"""What a model's first forward and backward pass at a new batch size costs, in a fresh process.

A training's first epoch meets two batch sizes: the full batch (its first step) and the epoch's last,
smaller batch. Each new shape's first pass pays one-off costs (cuDNN plan selection or kernel compiles,
lazy kernel loading, allocator growth). This times, synchronised, each pass of the Ultralytics model under
autocast with Ultralytics' cuDNN settings (``init_seeds(deterministic=True)``): batch B three times, the
last batch r twice, B + 1 once. Variants: ``--background`` first warms batch r in a second thread on its own
stream while the main thread runs batch B (is a warm-up that overlaps training worth anything?);
``--no-cudnn`` turns cuDNN off (is cuDNN the cost?). Appends a JSON line to ``$OUT/shape_cost.jsonl``.

Usage: python -m tools.device.shape_cost [--model yolo11n.yaml] [--batch 128] [--last 16] [--background]
       [--no-cudnn]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import threading
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="yolo11n.yaml")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--last", type=int, default=16)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--background", action="store_true")
    ap.add_argument("--no-cudnn", action="store_true")
    a = ap.parse_args()
    t_start = time.perf_counter()
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.torch_utils import init_seeds

    init_seeds(0, deterministic=True)
    if a.no_cudnn:
        torch.backends.cudnn.enabled = False
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = DetectionModel(a.model, nc=80, verbose=False).to(dev).train()
    calls: list[tuple[str, float]] = []

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def tensors(x) -> list[torch.Tensor]:  # the head's outputs: a dict (boxes, scores, feats), lists or a tensor
        if isinstance(x, torch.Tensor):
            return [x]
        return [t for v in (x.values() if isinstance(x, dict) else x) for t in tensors(v)]

    def step(m: torch.nn.Module, n: int) -> None:
        x = torch.rand(n, 3, a.imgsz, a.imgsz, device=dev)
        with torch.autocast(dev.type, dtype=torch.float16, enabled=dev.type == "cuda"):
            out = m(x)
        sum(t.float().sum() for t in tensors(out)).backward()

    def timed(name: str, n: int) -> None:
        sync()
        t0 = time.perf_counter()
        step(model, n)
        sync()
        calls.append((name, round(1e3 * (time.perf_counter() - t0), 1)))

    warm_s = None
    timed(f"batch {a.batch}, first", a.batch)
    if a.background:
        other = copy.deepcopy(model)
        side = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        done = {}

        def warm() -> None:
            t0 = time.perf_counter()
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                step(other, a.last)
            sync()
            done["s"] = time.perf_counter() - t0

        th = threading.Thread(target=warm)
        th.start()
        during = []
        while th.is_alive():
            timed("", a.batch)
            during.append(calls.pop()[1])
        th.join()
        median = sorted(during)[len(during) // 2]
        calls.append((f"batch {a.batch} during the warm-up: {len(during)} passes, median", median))
        warm_s = round(done["s"], 2)
    for _ in range(2):
        timed(f"batch {a.batch}, again", a.batch)
    timed(f"batch {a.last}, first", a.last)
    timed(f"batch {a.last}, again", a.last)
    timed(f"batch {a.batch + 1}, first", a.batch + 1)
    report = {"model": a.model, "batch": a.batch, "last": a.last, "background": a.background,
              "cudnn": not a.no_cudnn, "cudnn_version": torch.backends.cudnn.version(), "torch": torch.__version__,
              "background_warm_s": warm_s, "total_s": round(time.perf_counter() - t_start, 2), "calls_ms": calls}
    print(json.dumps(report))
    with open(Path(os.environ.get("OUT", ".")) / "shape_cost.jsonl", "a") as f:
        f.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()

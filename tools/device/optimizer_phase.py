"""The optimiser phase of a training step, part by part: Ultralytics' ``optimizer_step`` on a model's real parameter
groups, fed random gradients, with Ultralytics' MuSGD or AdamW against yolofeed's FastMuSGD.

Usage: python -m tools.device.optimizer_phase [MODEL...] [--steps 50] [--device cuda]
    MODEL: model yamls (default yolo11n.yaml yolo26n.yaml). Prints a table, writes $OUT/optimizer_phase.json.

Each part of ``optimizer_step`` (GradScaler's unscale, the gradient clip, ``scaler.step`` with the optimiser,
``scaler.update``, ``zero_grad``, the EMA) is timed twice over the same steps: host time (what the training loop
spends launching it) and device time between CUDA events (what the GPU spends, idle gaps included). No forward or
backward runs, so the GPU has nothing queued ahead: a part the host launches more slowly than the GPU runs reads
about the same on both, as it does after a host sync. The first 10 steps (the graph's warm-up and capture) are left
out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from types import SimpleNamespace

import torch

PARTS = ("unscale", "clip", "step", "update", "zero_grad", "ema")


def measure(model_yaml: str, optimizer: str, steps: int, device: str) -> dict:
    """Median host and device milliseconds of each part of ``optimizer_step`` for one optimiser: ``MuSGD`` (stock),
    ``FastMuSGD`` or ``AdamW`` (fused, as Ultralytics builds it on CUDA)."""
    from ultralytics.utils.torch_utils import ModelEMA  # a tool, outside the package's one-seam rule

    from yolofeed.train.musgd import FastMuSGD
    from yolofeed.ultralytics_seam import DetectionModel, DetectionTrainer

    torch.manual_seed(0)
    model = DetectionModel(model_yaml, nc=80, verbose=False).to(device)
    name = "AdamW" if optimizer == "AdamW" else "MuSGD"
    opt = DetectionTrainer.build_optimizer(SimpleNamespace(), model, name, 0.01, 0.9, 5e-4)
    if optimizer == "FastMuSGD":
        opt = FastMuSGD.adopt(opt)
    scaler = torch.amp.GradScaler(device, enabled=device == "cuda")
    ema = ModelEMA(model)
    cuda = device == "cuda"
    host = {k: [] for k in PARTS}
    gpu = {k: [] for k in PARTS}
    params = [p for p in model.parameters() if p.requires_grad]
    for k in range(steps + 10):
        scaler.scale(torch.zeros((), device=device))
        for p in params:
            p.grad = torch.randn_like(p) * scaler.get_scale()
        if cuda:
            torch.cuda.synchronize()
        marks, events = [time.perf_counter()], [torch.cuda.Event(enable_timing=True)] if cuda else []
        if cuda:
            events[0].record()
        for part in PARTS:
            if part == "unscale":
                scaler.unscale_(opt)
            elif part == "clip":
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
            elif part == "step":
                scaler.step(opt)
            elif part == "update":
                scaler.update()
            elif part == "zero_grad":
                opt.zero_grad()
            else:
                ema.update(model)
            marks.append(time.perf_counter())
            if cuda:
                events.append(torch.cuda.Event(enable_timing=True))
                events[-1].record()
        if cuda:
            torch.cuda.synchronize()
        if k >= 10:
            for i, part in enumerate(PARTS):
                host[part].append((marks[i + 1] - marks[i]) * 1e3)
                if cuda:
                    gpu[part].append(events[i].elapsed_time(events[i + 1]))
    med = {part: round(statistics.median(v), 3) for part, v in host.items()}
    med_gpu = {part: round(statistics.median(v), 3) for part, v in gpu.items()} if cuda else {}
    return {"model": model_yaml, "optimizer": optimizer, "host_ms": med, "gpu_ms": med_gpu,
            "host_total_ms": round(sum(med.values()), 3), "gpu_total_ms": round(sum(med_gpu.values()), 3)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["yolo11n.yaml", "yolo26n.yaml"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    rows = [measure(m, o, a.steps, a.device) for m in a.models for o in ("MuSGD", "FastMuSGD", "AdamW")]
    print(f"{'model':<14} {'optimizer':<10} {'host ms':>8} {'GPU ms':>8}   parts, host / GPU ms")
    for r in rows:
        parts = ", ".join(f"{p} {r['host_ms'][p]:.2f}/{r['gpu_ms'].get(p, 0):.2f}" for p in PARTS)
        print(f"{r['model']:<14} {r['optimizer']:<10} {r['host_total_ms']:8.2f} {r['gpu_total_ms']:8.2f}   {parts}")
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "optimizer_phase.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

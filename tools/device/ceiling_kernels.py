"""Where the ceiling's step spends the GPU's time: every kernel of a few training steps, inside the graphs and out.

    python -m tools.device.ceiling_kernels model=yolo11n.yaml data=/tmp/synth/data.yaml batch=128 imgsz=640 \\
        steps=40 profile=5 out=$OUT/ceiling_kernels

The ceiling as ``yolofeed bench modes=ceiling`` trains it (Ultralytics' trainer on GPU-resident batches, yolofeed's
step as the library makes it: the graphed forward and backward, the eager loss and optimiser phase). After ``steps``
steps, ``profile`` steps run under torch's profiler (CUDA activity: the kernels a graph replays are traced one by
one). Prints and writes ``out/ceiling_kernels.json``: the wall time a step, the kernels' time a step (the GPU's idle
time is the difference), and both split by where a kernel was launched (in a graph's replay: the forward and
backward; eager: the loss, the optimiser step, the EMA, the batch's preprocessing) and by kind (step_levers'
categories); the 40 largest kernels of each.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
import yaml

from tools.step_levers import CATEGORIES


def kernels_by_place(trace: dict, steps: int) -> dict:
    """A Chrome trace's kernels a step: {"graph"/"eager": {"ms", "by_category_ms", "top"}} (a kernel is in a graph
    where the runtime call its correlation id names is a graph launch)."""
    events = trace.get("traceEvents", [])
    launches = {e.get("args", {}).get("correlation"): e.get("name", "") for e in events
                if e.get("cat") == "cuda_runtime"}
    out: dict = {}
    for place in ("graph", "eager"):
        out[place] = {"ms": 0.0, "by_category_ms": defaultdict(float), "kernels": defaultdict(lambda: [0.0, 0])}
    for e in events:
        if e.get("cat") != "kernel" or "dur" not in e:
            continue
        place = "graph" if "GraphLaunch" in launches.get(e.get("args", {}).get("correlation"), "") else "eager"
        ms = e["dur"] / 1e3 / steps
        name = e.get("name", "")
        cat = next((c for c, rx in CATEGORIES if re.search(rx, name, re.I)), "other")
        p = out[place]
        p["ms"] += ms
        p["by_category_ms"][cat] += ms
        k = p["kernels"][name[:110]]
        k[0] += ms
        k[1] += 1
    for p in out.values():
        p["by_category_ms"] = dict(sorted(p["by_category_ms"].items(), key=lambda kv: -kv[1]))
        p["top"] = sorted(([ms, n // steps, name] for name, (ms, n) in p.pop("kernels").items()), reverse=True)[:40]
    return out


def main(argv: list[str]) -> None:
    from yolofeed.bench.modes import trainer_class
    from yolofeed.ultralytics_seam import StopTraining, train_until_stopped

    args = {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in argv)}  # numbers as numbers
    steps, n = int(args.pop("steps", 40)), int(args.pop("profile", 5))
    out = Path(args.pop("out", "/tmp/ceiling_kernels"))
    out.mkdir(parents=True, exist_ok=True)
    overrides = {"val": False, "plots": False, "save": False, "close_mosaic": 0, "verbose": False, "exist_ok": True,
                 "name": "ceiling_kernels", "project": tempfile.mkdtemp(), **args}
    trainer = trainer_class("ceiling")(overrides=overrides)
    state = {"i": 0, "prof": None, "t0": 0.0}

    def on_batch_end(t) -> None:
        state["i"] += 1
        if state["i"] == steps:
            torch.cuda.synchronize()
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
            state["prof"], state["t0"] = prof, time.perf_counter()
        elif state["i"] == steps + n:
            torch.cuda.synchronize()
            state["wall"] = (time.perf_counter() - state["t0"]) / n * 1e3
            state["prof"].__exit__(None, None, None)
            raise StopTraining

    trainer.add_callback("on_train_batch_end", on_batch_end)
    train_until_stopped(trainer)
    if "wall" not in state:
        raise SystemExit(f"ceiling_kernels: training ended after {state['i']} of {steps + n} steps: fewer steps=, "
                         "or more images an epoch")
    path = out / "trace.json"
    state["prof"].export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    path.unlink()
    places = kernels_by_place(trace, n)
    report = {"args": overrides, "steps": steps, "profiled": n, "wall_ms": state["wall"],
              "kernels_ms": sum(p["ms"] for p in places.values()), **places}
    (out / "ceiling_kernels.json").write_text(json.dumps(report, indent=1))
    print(f"a step: {report['wall_ms']:.2f} ms wall, {report['kernels_ms']:.2f} ms of kernels "
          f"(graph {places['graph']['ms']:.2f}, eager {places['eager']['ms']:.2f})")
    for place, p in places.items():
        print(f"{place}: " + ", ".join(f"{c} {ms:.2f}" for c, ms in p["by_category_ms"].items()))
        for ms, count, name in p["top"][:25]:
            print(f"  {ms:6.3f} ms {count:4d}x {name}")


if __name__ == "__main__":
    main(sys.argv[1:])

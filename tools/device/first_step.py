"""Where a yolofeed run's one-off seconds go: set-up, the first step, the first validation, the final validation.

Usage: python -m tools.device.first_step DATA_YAML MODEL [--epochs 1] [--batch 128] [--imgsz 640] [--runs 2]
        [--keys "k=v ..."]   (training keys, and yolofeed's options such as graphed_step=False)

Trains MODEL on DATA_YAML with yolofeed's trainer for the task (validation and plots at their defaults) ``--runs``
times, each in a fresh process (the second finds Triton's compiled kernels in its disk cache, as a user's second
run does). Each run prints the seconds from the process's start to each of Ultralytics' callbacks (the first of
each), and the wall seconds of the calls that pay one-off costs, each time it is called (up to 4):
``warm_up`` (cuDNN for each batch size), ``capture`` (the graph's three passes and capture), ``augment`` (the GPU
augmentation), ``loss`` (the criterion), ``optimizer_step``, ``validate`` (an epoch's validation) and
``final_eval``. Each timed call ends with a CUDA synchronize, so the seconds are the work's, not its launch's.
Writes $OUT/first_step_<model>.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

T0 = time.perf_counter()
KEEP = 4


def _timer(owner: object, name: str, label: str, log: dict) -> None:
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def timed(*a, **k):
        import torch

        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            if torch.cuda.is_available() and not torch.cuda.is_current_stream_capturing():  # a sync ends a capture
                torch.cuda.synchronize()
            calls = log.setdefault(label, [])
            if len(calls) < KEEP:
                calls.append([round(t - T0, 2), round(time.perf_counter() - t, 3)])

    setattr(owner, name, timed)


def child(data: str, model: str, epochs: int, batch: int, imgsz: int, keys: str) -> dict:
    from ultralytics import YOLO

    import yolofeed.train.graphed as graphed
    import yolofeed.train.step as step
    import yolofeed.train.tasks as tasks
    import yolofeed.train.trainer as trainer_mod
    from yolofeed.augment.pipeline import GpuAugment
    from yolofeed.train import options

    log: dict = {"imports": round(time.perf_counter() - T0, 2)}
    events: dict = {}
    _timer(trainer_mod, "warm_up", "warm_up", log)
    _timer(graphed._Graph, "_capture", "capture", log)
    _timer(GpuAugment, "__call__", "augment", log)
    _timer(step.HostLossItems, "__call__", "loss", log)
    yolo = YOLO(model)
    cls = tasks.TRAINERS[yolo.task]
    for name in ("optimizer_step", "validate", "final_eval", "save_model", "plot_training_labels"):
        if hasattr(cls, name):
            _timer(cls, name, name, log)

    def on(event):
        return lambda t: events.setdefault(event, round(time.perf_counter() - T0, 2))

    for event in ("on_pretrain_routine_start", "on_pretrain_routine_end", "on_train_start", "on_train_epoch_start",
                  "on_train_batch_end", "on_train_epoch_end", "on_fit_epoch_end", "on_train_end"):
        yolo.add_callback(event, on(event))
    extra = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in keys.split())}
    own = {k: extra.pop(k) for k in list(extra) if k in options.OPTIONS}  # yolofeed's options: the trainer's
    if own:
        cls = cls.with_options(**own)
    args = {"data": data, "epochs": epochs, "batch": batch, "imgsz": imgsz, "workers": 16, "exist_ok": True,
            "project": "/tmp/first_step", "name": Path(model).stem, "verbose": False, **extra}
    yolo.train(trainer=cls, **args)
    return {"events": events, "calls": log, "end": round(time.perf_counter() - T0, 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("model")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--keys", default="")
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a.data, a.model, a.epochs, a.batch, a.imgsz, a.keys)), flush=True)
        return 0
    results = []
    for i in range(a.runs):
        argv = [sys.executable, "-m", "tools.device.first_step", a.data, a.model, "--child", "--epochs", str(a.epochs),
                "--batch", str(a.batch), "--imgsz", str(a.imgsz), "--keys", a.keys]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=400)
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        r = json.loads(line[7:]) if line else {"error": (p.stderr or p.stdout)[-1500:]}
        r["run"] = i + 1
        results.append(r)
        print(json.dumps(r), flush=True)
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"first_step_{Path(a.model).stem}.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

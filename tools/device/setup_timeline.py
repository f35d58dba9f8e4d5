"""Where the time from building a trainer to the end of its first step goes, mode by mode, each in a fresh process.

Each mode (a ``yolofeed bench`` mode, or a step_ab variant) runs in its own process, as a user's run would: its
trainer class gets timers around the set-up methods it has (``SETUP``: the model, the packs and loaders, the
optimizer, the validator...), yolofeed's warm-up gets them too (``FUNCTIONS``: cuDNN's plans, Triton's compiles;
CUDA only), every Ultralytics callback gets a first-occurrence time, and the trainer trains
through ``measure.profile`` (``--steps`` steps after ``--warmup``). The result is one line per event, in order:
seconds since the trainer was built, and how long each call of a timed method took (a method that runs inside
another, a pack inside a loader, shows inside it). Writes ``$OUT/setup_timeline.json``.

Usage: python -m tools.device.setup_timeline DATA_YAML MODEL MODE[,MODE...] [--batch 128] [--imgsz 640]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any
from unittest import mock

# Trainer methods timed where the class has them: Ultralytics' set-up and yolofeed's own.
SETUP = ("_setup_train", "setup_model", "set_model_attributes", "_build_train_pipeline", "get_dataloader", "_pack",
         "build_dataset", "build_optimizer", "get_validator", "set_class_weights", "_check_data", "auto_batch")


# Module functions timed the same way, where they are looked up: the warm-up as the trainer calls it (CUDA only; the
# trainer registers its own ``_warm_up`` as a callback, which a subclass's timer would not see), its model passes
# (cuDNN's plans, one batch size after another) and its augmentation (Triton's compiles, the CUDA-graph capture).
FUNCTIONS = (("yolofeed.train.trainer", "warm_up"), ("yolofeed.train.warmup", "warm_model"),
             ("yolofeed.train.warmup", "warm_augmentation"))


def _timer(name: str, fn, events: list[dict[str, Any]], t0: list[float]):
    """``fn`` recording each call in ``events``: its start since ``t0[0]`` and its seconds."""

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:  # every call: the set-up methods run a few times (the train and the val loader), not per step
            events.append({"event": name, "at_s": round(start - t0[0], 3),
                           "took_s": round(time.perf_counter() - start, 3)})
    return timed


def timed_class(base: type, events: list[dict[str, Any]], t0: list[float]) -> type:
    """``base`` with each call of its ``SETUP`` methods recorded in ``events`` (start, seconds), and ``t0[0]`` set
    when the trainer is built."""

    def __init__(self, *args, **kwargs):
        t0[0] = time.perf_counter()
        base.__init__(self, *args, **kwargs)

    attrs = {name: _timer(name, getattr(base, name), events, t0) for name in SETUP
             if callable(getattr(base, name, None))}
    return type(base.__name__, (base,), {"__init__": __init__, **attrs})


def one(data: str, model: str, mode: str, batch: int, imgsz: int, steps: int, warmup: int) -> dict[str, Any]:
    """The timeline of ``mode`` in this process."""
    from ultralytics.utils.callbacks.base import default_callbacks

    from tools.device.step_ab import patched, trainer_class
    from yolofeed.measure.profile import profile

    events: list[dict[str, Any]] = []
    t0 = [time.perf_counter()]
    timed = timed_class(trainer_class(mode), events, t0)
    seen: set[str] = set()

    def first(name: str):
        def callback(trainer) -> None:
            if name not in seen:
                seen.add(name)
                events.append({"event": name, "at_s": round(time.perf_counter() - t0[0], 3)})
        return callback

    class Trainer(timed):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for name in default_callbacks:
                self.add_callback(name, first(name))

    Trainer.__name__ = timed.__name__
    with contextlib.ExitStack() as stack:
        for module, name in FUNCTIONS:
            owner = importlib.import_module(module)
            stack.enter_context(mock.patch.object(owner, name, _timer(name, getattr(owner, name), events, t0)))
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        stack.enter_context(patched(mode))
        p = profile(mode, Trainer, {"model": model, "data": data, "imgsz": imgsz, "batch": batch, "workers": 16,
                                    "project": tmp}, steps=steps, warmup=warmup)
    return {"mode": mode, "first_step_s": p.first_step_s, "images_per_s": p.images_per_s,
            "events": sorted(events, key=lambda e: e["at_s"])}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("model", help="e.g. yolo11n.yaml")
    ap.add_argument("modes", help="comma-separated, e.g. yolofeed_jpeg,yolofeed,stock")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--one", action="store_true", help="run the one mode named in this process and print its JSON")
    a = ap.parse_args(argv)
    if a.one:
        print("SETUP_TIMELINE " + json.dumps(one(a.data, a.model, a.modes, a.batch, a.imgsz, a.steps, a.warmup)),
              flush=True)
        return
    rows = []
    for mode in a.modes.split(","):  # a process each: cuDNN's, Triton's and nvJPEG's one-off costs are per process
        r = subprocess.run([sys.executable, "-m", "tools.device.setup_timeline", a.data, a.model, mode, "--one",
                            "--batch", str(a.batch), "--imgsz", str(a.imgsz), "--steps", str(a.steps),
                            "--warmup", str(a.warmup)], capture_output=True, text=True)
        line = next((x for x in r.stdout.splitlines() if x.startswith("SETUP_TIMELINE ")), None)
        if line is None:
            print(f"{mode}: failed (exit {r.returncode})\n{r.stderr[-3000:]}", flush=True)
            continue
        row = json.loads(line.removeprefix("SETUP_TIMELINE "))
        rows.append(row)
        print(f"{mode}: first step at {row['first_step_s']} s", flush=True)
        for e in row["events"]:
            took = f"  took {e['took_s']:7.3f} s" if "took_s" in e else ""
            print(f"  {e['at_s']:8.3f} s  {e['event']}{took}", flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "setup_timeline.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""Where the time from building a trainer to the end of its first step goes, mode by mode, each in a fresh process.

Each mode (a ``yolofeed bench`` mode, or a step_ab variant) runs in its own process, as a user's run would: its
trainer class gets timers around the set-up methods it has (``SETUP``: the model, the packs and loaders, the
validator, cuDNN's and Triton's warm-up...) and a first-occurrence time for every Ultralytics callback, and trains
through ``monitor.profile`` (``--steps`` steps after ``--warmup``). The result is one line per event, in order:
seconds since the trainer was built, and how long each timed method took the first time it ran (a method that
runs inside another, a pack inside a loader, shows inside it). Writes ``$OUT/setup_timeline.json``.

Usage: python -m tools.device.setup_timeline DATA_YAML MODEL MODE[,MODE...] [--batch 128] [--imgsz 640]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

# Trainer methods timed where the class has them: Ultralytics' set-up and yolofeed's own.
SETUP = ("_setup_train", "setup_model", "set_model_attributes", "get_dataloader", "_pack", "build_dataset",
         "get_validator", "_warm_up", "_check_data", "auto_batch")


def timed_class(base: type, events: list[dict[str, Any]], t0: list[float]) -> type:
    """``base`` with the first call of each ``SETUP`` method it has recorded in ``events`` (start, seconds), and
    ``t0[0]`` set when the trainer is built."""

    def wrap(name: str, method):
        @functools.wraps(method)
        def timed(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                if not any(e["event"] == name for e in events):
                    events.append({"event": name, "at_s": round(start - t0[0], 3),
                                   "took_s": round(time.perf_counter() - start, 3)})
        return timed

    def __init__(self, *args, **kwargs):
        t0[0] = time.perf_counter()
        base.__init__(self, *args, **kwargs)

    attrs = {name: wrap(name, getattr(base, name)) for name in SETUP if callable(getattr(base, name, None))}
    return type(base.__name__, (base,), {"__init__": __init__, **attrs})


def one(data: str, model: str, mode: str, batch: int, imgsz: int, steps: int, warmup: int) -> dict[str, Any]:
    """The timeline of ``mode`` in this process."""
    from ultralytics.utils.callbacks.base import default_callbacks

    from tools.device.step_ab import patched, trainer_class
    from yolofeed.monitor.profile import profile

    events: list[dict[str, Any]] = []
    t0 = [time.perf_counter()]
    cls = timed_class(trainer_class(mode), events, t0)
    seen: set[str] = set()

    def first(name: str):
        def callback(trainer) -> None:
            if name not in seen:
                seen.add(name)
                events.append({"event": name, "at_s": round(time.perf_counter() - t0[0], 3)})
        return callback

    original = cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        for name in default_callbacks:
            self.add_callback(name, first(name))

    cls.__init__ = __init__
    with tempfile.TemporaryDirectory() as tmp, patched(mode):
        p = profile(mode, cls, {"model": model, "data": data, "imgsz": imgsz, "batch": batch, "workers": 16,
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

"""Epoch by epoch, what a run of a few epochs spends at each epoch's start, mode by mode, each in a fresh process.

Each mode (a ``yolofeed bench`` mode, or a step_ab variant such as ``yolofeed_epoch_alone``: each epoch starts its
loading when it is iterated) trains ``--epochs`` epochs in its own process, as a user's run does, with Ultralytics'
own loop (checkpoints saved every epoch, validation off, mosaic on throughout). Callbacks record, on the host, when
the trainer was built, when each epoch starts and ends, and when each step ends. For each epoch: its wall time, its
first step's (from the epoch's start: the wait for its first batch, and in the first epoch the one-off costs), and
its rate against the steady one (the median step of the later epochs, at the full batch). Writes
``$OUT/epochs_ab.json``.

Usage: python -m tools.device.epochs_ab DATA_YAML MODEL MODE[,MODE...] [--epochs 4] [--batch 128] [--imgsz 640]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any


def one(data: str, model: str, mode: str, epochs: int, batch: int, imgsz: int) -> dict[str, Any]:
    """The epoch timeline of ``mode`` in this process: seconds since the trainer was built."""
    from tools.device.step_ab import patched, trainer_class

    t0 = time.perf_counter()
    starts: list[float] = []
    ends: list[float] = []
    steps: list[list[float]] = []

    def now() -> float:
        return round(time.perf_counter() - t0, 4)

    base = trainer_class(mode)

    class Trainer(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback("on_train_epoch_start", lambda t: (starts.append(now()), steps.append([])))
            self.add_callback("on_train_batch_end", lambda t: steps[-1].append(now()))
            self.add_callback("on_train_epoch_end", lambda t: ends.append(now()))

    Trainer.__name__ = base.__name__
    with tempfile.TemporaryDirectory() as tmp, patched(mode):
        trainer = Trainer(overrides={"model": model, "data": data, "imgsz": imgsz, "batch": batch, "epochs": epochs,
                                     "workers": 16, "val": False, "plots": False, "close_mosaic": 0,
                                     "project": tmp, "name": mode, "exist_ok": True, "verbose": False})
        trainer.train()
        images = len(trainer.train_loader.dataset)
    return {"mode": mode, "images": images, "batch": batch, "epoch_start_s": starts, "epoch_end_s": ends,
            "step_end_s": steps}


def summary(row: dict[str, Any]) -> dict[str, Any]:
    """Per epoch: wall time, first step, rate against the steady one (later epochs' median full-batch step)."""
    starts, ends, steps, n = row["epoch_start_s"], row["epoch_end_s"], row["step_end_s"], row["images"]
    later = [b - a for s in steps[1:] for a, b in zip(s[1:-2], s[2:-1])]  # full batches, neither first nor last
    steady_step = statistics.median(later) if later else float("nan")
    steady = row["batch"] / steady_step
    epochs = []
    for e, (a, b) in enumerate(zip(starts, ends)):
        rate = n / (b - a)
        epochs.append({"epoch": e + 1, "wall_s": round(b - a, 3), "img_s": round(rate, 1),
                       "of_steady": round(rate / steady, 3),
                       "first_step_s": round(steps[e][0] - a, 3) if steps[e] else None,
                       "gap_before_s": round(a - ends[e - 1], 3) if e else None})
    return {"mode": row["mode"], "first_step_at_s": round(steps[0][0], 2) if steps and steps[0] else None,
            "steady_img_s": round(steady, 1), "steady_step_ms": round(1000 * steady_step, 1), "epochs": epochs}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("model", help="e.g. yolo11n.yaml")
    ap.add_argument("modes", help="comma-separated, e.g. yolofeed_epoch_alone,yolofeed")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--one", action="store_true", help="run the one mode named in this process and print its JSON")
    a = ap.parse_args(argv)
    if a.one:
        print("EPOCHS_AB " + json.dumps(one(a.data, a.model, a.modes, a.epochs, a.batch, a.imgsz)), flush=True)
        return
    rows = []
    for mode in a.modes.split(","):  # a process each, as a user's run: its one-off costs are its own
        r = subprocess.run([sys.executable, "-m", "tools.device.epochs_ab", a.data, a.model, mode, "--one",
                            "--epochs", str(a.epochs), "--batch", str(a.batch), "--imgsz", str(a.imgsz)],
                           capture_output=True, text=True)
        line = next((x for x in r.stdout.splitlines() if x.startswith("EPOCHS_AB ")), None)
        if line is None:
            print(f"{mode}: failed (exit {r.returncode})\n{r.stderr[-3000:]}", flush=True)
            continue
        row = json.loads(line.removeprefix("EPOCHS_AB "))
        row["summary"] = s = summary(row)
        rows.append(row)
        print(f"{mode}: first step at {s['first_step_at_s']} s, steady {s['steady_img_s']:,.0f} img/s "
              f"({s['steady_step_ms']} ms a step)", flush=True)
        for e in s["epochs"]:
            gap = "" if e["gap_before_s"] is None else f", {e['gap_before_s']:.3f} s since the last epoch's end"
            print(f"  epoch {e['epoch']}: {e['wall_s']:.2f} s, {e['img_s']:,.0f} img/s = {e['of_steady']:.3f} of "
                  f"steady; first step {e['first_step_s']:.3f} s{gap}", flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "epochs_ab.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

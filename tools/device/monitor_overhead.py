"""What the live accounting costs a training step, as paired windows inside one training run.

One yolofeed training run; every ``--window`` steps the accounting (phase marks on the model and the optimiser
step, and the system sampler) is switched on or off, in turn, ``--windows`` times each after ``--warmup`` steps.
Neighbouring windows share the machine's state (clocks, page cache, allocator), which separate runs do not: the
spread between runs (about ±4 %) hides a 1 % effect. The sampler's probe process is paused (SIGSTOP) in "off"
windows rather than restarted: starting it takes ~0.3 s. Prints the medians and writes
``$OUT/monitor_overhead.json``. On the CPU it runs too (a smoke run: the figures mean nothing there).

Usage: python -m tools.device.monitor_overhead DATA_YAML [--model yolo11n.yaml] [--batch 128] [--imgsz 640]
       [--windows 20] [--window 20] [--warmup 30] [--device DEVICE]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time


def measure(data: str, model: str, batch: int, imgsz: int, windows: int, window: int, warmup: int,
            device: str | None = None) -> dict:
    """Images a second in each "on" and "off" window, their medians and the overhead (1 - on / off)."""
    from yolofeed.monitor.steps import StepClock
    from yolofeed.monitor.system import SystemSampler
    from yolofeed.train import FastDetectionTrainer
    from yolofeed.ultralytics_seam import StopTraining, mark_phases, train_until_stopped, unbounded_epochs

    clock, sampler = StepClock(), SystemSampler()
    state: dict = {"n": 0, "on": False, "unmark": None, "t": None, "rates": {True: [], False: []}}

    def switch(trainer, on: bool) -> None:
        if on:
            state["unmark"] = mark_phases(trainer, clock.mark)
            os.kill(sampler._proc.pid, signal.SIGCONT)
        else:
            if state["unmark"] is not None:
                state["unmark"]()
            state["unmark"] = None
            os.kill(sampler._proc.pid, signal.SIGSTOP)
        state["on"] = on

    def on_train_start(trainer) -> None:
        unbounded_epochs(trainer)  # the window count ends the run
        clock.cuda = trainer.device.type == "cuda"
        sampler.start(trainer.device)
        switch(trainer, False)

    def on_batch_start(trainer) -> None:
        if state["on"]:
            clock.batch_ready()

    def on_batch_end(trainer) -> None:
        if state["on"]:
            clock.step_done(trainer.batch_size)
        n = state["n"] = state["n"] + 1
        if n < warmup or (n - warmup) % window:
            return
        now = time.perf_counter()
        if state["t"] is not None:
            state["rates"][state["on"]].append(window * trainer.batch_size / (now - state["t"]))
        if (n - warmup) // window >= 2 * windows:
            raise StopTraining
        switch(trainer, not state["on"])
        state["t"] = time.perf_counter()  # the switch itself is not timed

    with tempfile.TemporaryDirectory() as tmp:
        overrides = {"model": model, "data": data, "imgsz": imgsz, "batch": batch, "project": tmp, "val": False,
                     "plots": False, "save": False, "close_mosaic": 0, "verbose": False}
        if device is not None:
            overrides["device"] = device
        trainer = FastDetectionTrainer(overrides=overrides)
        for event, fn in (("on_train_start", on_train_start), ("on_train_batch_start", on_batch_start),
                          ("on_train_batch_end", on_batch_end)):
            trainer.add_callback(event, fn)
        try:
            train_until_stopped(trainer)
        finally:
            if sampler._proc is not None:
                os.kill(sampler._proc.pid, signal.SIGCONT)
            sampler.stop()
    on, off = state["rates"][True], state["rates"][False]
    pairs = [1 - a / b for a, b in zip(on, off)]  # each "on" window against the "off" window right after it
    return {"windows_on": [round(r, 1) for r in on], "windows_off": [round(r, 1) for r in off],
            "median_on": statistics.median(on), "median_off": statistics.median(off),
            "overhead_median_of_pairs": statistics.median(pairs),
            "overhead_fraction": 1 - statistics.median(on) / statistics.median(off)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--model", default="yolo11n.yaml")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--windows", type=int, default=20, help="windows with the accounting on (and as many off)")
    ap.add_argument("--window", type=int, default=20, help="steps a window")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--device", help="as for yolo train; default Ultralytics' choice")
    a = ap.parse_args(argv)
    res = measure(a.data, a.model, a.batch, a.imgsz, a.windows, a.window, a.warmup, a.device)
    print(json.dumps({k: v for k, v in res.items() if not k.startswith("windows")}, indent=1))
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "monitor_overhead.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

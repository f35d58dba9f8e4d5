"""Issue 5: the accounting's cost, as paired windows inside one training run.

One yolofeed training run (yolo11n, batch 128, 640 px by default); every WINDOW steps the accounting
(phase marks on the model and optimiser step + the system sampler) is switched on or off, in turn.
Pairs of neighbouring windows share the machine's state (clocks, page cache, allocator), which
separate runs do not: the spread between runs (±4 %) hid a 1 % effect before. The sampler's probe
process is paused (SIGSTOP) in "off" windows rather than restarted: starting it takes ~0.3 s.

Usage: python3 scripts/device/monitor_overhead.py DATA_YAML [MODEL] [BATCH] [WINDOWS] [WINDOW]
"""

import json
import os
import signal
import statistics
import sys
import tempfile
import time

from yolofeed.monitor.live import install_phase_marks
from yolofeed.monitor.phases import PhaseTimer
from yolofeed.monitor.system import SystemSampler
from yolofeed.train import FastDetectionTrainer

data = sys.argv[1]
model = sys.argv[2] if len(sys.argv) > 2 else "yolo11n.yaml"
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 128
windows = int(sys.argv[4]) if len(sys.argv) > 4 else 40
window = int(sys.argv[5]) if len(sys.argv) > 5 else 20
warmup = int(os.environ.get("OVERHEAD_WARMUP", 30))
imgsz = int(os.environ.get("OVERHEAD_IMGSZ", 640))


class _Done(Exception):
    pass


phases, sampler = PhaseTimer(), SystemSampler()
state = {"n": 0, "on": False, "hooks": [], "t": None, "rates": {True: [], False: []}}


def switch(trainer, on: bool) -> None:
    if on:
        state["hooks"] = install_phase_marks(trainer, phases)
        os.kill(sampler._proc.pid, signal.SIGCONT)
    else:
        for h in state["hooks"]:
            h.remove()
        state["hooks"] = []
        trainer.__dict__.pop("optimizer_step", None)  # the wrapper install_phase_marks set on the instance
        os.kill(sampler._proc.pid, signal.SIGSTOP)
    state["on"] = on


def on_train_start(trainer) -> None:
    trainer.epochs = 10**6
    sampler.start(trainer.device)
    switch(trainer, False)


def on_batch_start(trainer) -> None:
    if state["on"]:
        phases.batch_ready()


def on_batch_end(trainer) -> None:
    if state["on"]:
        phases.step_done(trainer.batch_size)
    n = state["n"] = state["n"] + 1
    if n < warmup or (n - warmup) % window:
        return
    now = time.perf_counter()
    if state["t"] is not None:
        state["rates"][state["on"]].append(window * trainer.batch_size / (now - state["t"]))
    if (n - warmup) // window >= windows:
        raise _Done
    switch(trainer, not state["on"])
    state["t"] = time.perf_counter()  # the switch itself is not timed


with tempfile.TemporaryDirectory() as tmp:
    trainer = FastDetectionTrainer(overrides={"model": model, "data": data, "imgsz": imgsz, "batch": batch,
                                              "project": tmp, "val": False, "plots": False, "save": False,
                                              "close_mosaic": 0, "verbose": False})
    for event, fn in (("on_train_start", on_train_start), ("on_train_batch_start", on_batch_start),
                      ("on_train_batch_end", on_batch_end)):
        trainer.add_callback(event, fn)
    try:
        trainer.train()
    except _Done:
        pass
    finally:
        if sampler._proc is not None:
            os.kill(sampler._proc.pid, signal.SIGCONT)
        sampler.stop()
on, off = state["rates"][True], state["rates"][False]
pairs = [1 - a / b for a, b in zip(on, off)]  # each "on" window against the "off" window right after it
res = {"windows_on": [round(r, 1) for r in on], "windows_off": [round(r, 1) for r in off],
       "median_on": statistics.median(on), "median_off": statistics.median(off),
       "overhead_median_of_pairs": statistics.median(pairs),
       "overhead_fraction": 1 - statistics.median(on) / statistics.median(off)}
print(json.dumps({k: v for k, v in res.items() if not k.startswith("windows")}, indent=1))
with open(os.path.join(os.environ.get("OUT", "/tmp"), "monitor_overhead.json"), "w") as f:
    json.dump(res, f, indent=1)

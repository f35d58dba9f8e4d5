"""Count the host syncs in a training step and say where they are (issue 4: each one drains the GPU's queue).

Usage: python3 scripts/device/syncs.py DATA_YAML [VARIANT] [MODEL]
    VARIANT as in step_ab.py (ceiling, ceiling_stock_step, yolofeed, yolofeed_stock_step). Batch 128,
    imgsz 640. Trains 20 warm-up steps, then 10 under ``torch.cuda.set_sync_debug_mode("warn")``: torch
    warns at every synchronising CUDA call, and each warning is charged to the innermost Ultralytics or
    yolofeed line on the stack. Writes $OUT/syncs_<variant>_<model>.txt.
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import traceback
import warnings

import torch

sys.path.insert(0, os.path.dirname(__file__))
import step_ab  # noqa: E402  (its variants)
from run_steps import Enough, run_steps  # noqa: E402

import yolofeed.doctor.profile as prof  # noqa: E402


def where() -> str:
    frames = [f for f in traceback.extract_stack()[:-2] if "ultralytics/" in f.filename or "yolofeed/" in f.filename]
    if not frames:
        return "-"
    f = frames[-1]
    return f"{f.filename.split('site-packages/')[-1].split('src/')[-1]}:{f.lineno} {f.line}"


def main() -> None:
    data = sys.argv[1]
    variant = sys.argv[2] if len(sys.argv) > 2 else "ceiling"
    model = sys.argv[3] if len(sys.argv) > 3 else "yolo11n.yaml"
    warmup, steps = 20, 10
    counts: collections.Counter = collections.Counter()
    state = {"n": 0}
    show = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchronizing CUDA operation" in str(message):
            counts[where()] += 1
        else:
            show(message, category, filename, lineno, file, line)

    def on_batch_end(trainer):
        state["n"] += 1
        if state["n"] == warmup:
            warnings.simplefilter("always")
            warnings.showwarning = record
            if torch.cuda.is_available():
                torch.cuda.set_sync_debug_mode("warn")
        elif state["n"] == warmup + steps:
            if torch.cuda.is_available():
                torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = show
            raise Enough

    prof.TRAINER_CLASS = prof.trainer_class
    with tempfile.TemporaryDirectory() as tmp:
        args = {"model": model, "data": data, "imgsz": int(os.environ.get("AB_IMGSZ", 640)),
                "batch": int(os.environ.get("AB_BATCH", 128)), "project": tmp, "name": variant}
        run_steps(step_ab.trainer_class(variant), args, on_batch_end)
    lines = [f"{variant}, {model}: {sum(counts.values()) / steps:.1f} synchronising CUDA calls a step "
             f"({steps} steps), by the innermost Ultralytics/yolofeed line:"]
    lines += [f"  {n / steps:5.1f}  {w}" for w, n in counts.most_common(25)]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), f"syncs_{variant}_{model.removesuffix('.yaml')}.txt"),
              "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()

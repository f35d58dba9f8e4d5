"""Count the host syncs in a training step and say where they are: each one drains the GPU's queue.

Usage: python -m tools.device.syncs DATA_YAML [VARIANT] [MODEL] [--batch 128] [--imgsz 640]

VARIANT as in ``step_ab`` (``ceiling``, ``ceiling_stock``, ``yolofeed``, ``yolofeed_stock_step``,
``yolofeed_stock_loss``...). Trains 20 warm-up steps, then 10 under ``torch.cuda.set_sync_debug_mode("warn")``:
torch warns at every synchronising CUDA call, and each warning is charged to the innermost Ultralytics or
yolofeed line on the stack. Needs CUDA: torch's sync debug mode counts nothing on the CPU. Writes
``$OUT/syncs_<variant>_<model>.txt``.
"""

from __future__ import annotations

import argparse
import collections
import os
import tempfile
import traceback
import warnings

import torch

from tools.device.run_steps import Enough, run_steps
from tools.device.step_ab import trainer_class


def where() -> str:
    """The innermost Ultralytics or yolofeed line on the caller's stack, as ``path:line code``."""
    frames = [f for f in traceback.extract_stack()[:-2] if "ultralytics/" in f.filename or "yolofeed/" in f.filename]
    if not frames:
        return "-"
    f = frames[-1]
    return f"{f.filename.split('site-packages/')[-1].split('src/')[-1]}:{f.lineno} {f.line}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("variant", nargs="?", default="ceiling")
    ap.add_argument("model", nargs="?", default="yolo11n.yaml")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    a = ap.parse_args(argv)
    cls = trainer_class(a.variant)
    if not torch.cuda.is_available():
        raise SystemExit("syncs: needs CUDA (torch's sync debug mode counts nothing on the CPU)")
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
            torch.cuda.set_sync_debug_mode("warn")
        elif state["n"] == warmup + steps:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = show
            raise Enough

    with tempfile.TemporaryDirectory() as tmp:
        args = {"model": a.model, "data": a.data, "imgsz": a.imgsz, "batch": a.batch, "project": tmp, "name": a.variant}
        run_steps(cls, args, on_batch_end)
    lines = [f"{a.variant}, {a.model}: {sum(counts.values()) / steps:.1f} synchronising CUDA calls a step "
             f"({steps} steps), by the innermost Ultralytics/yolofeed line:"]
    lines += [f"  {n / steps:5.1f}  {w}" for w, n in counts.most_common(25)]
    text = "\n".join(lines)
    print(text)
    name = f"syncs_{a.variant}_{a.model.removesuffix('.yaml')}.txt"
    with open(os.path.join(os.environ.get("OUT", "/tmp"), name), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()

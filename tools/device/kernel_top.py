"""What the GPU spends a training step on, by aten op: where a variant's extra GPU time goes.

Usage: python -m tools.device.kernel_top DATA_YAML VARIANT[,VARIANT...] [MODEL] [--batch 128] [--imgsz 640]

VARIANT as in ``step_ab``. Per variant: 40 warm-up steps, then 10 under torch.profiler (CPU ops and kernels, no
Python stacks: the host slows, the GPU's time per op does not). Prints the GPU time a step and the ops with the
most of it (self device time); writes ``$OUT/kernel_top_<variant>_<model>.txt``. On the CPU it runs, but every
op's device time is 0: a smoke run only.
"""

from __future__ import annotations

import argparse
import os
import tempfile

from torch.autograd import DeviceType

from tools.device.run_steps import profile_steps, run_steps
from tools.device.step_ab import trainer_class


def top(variant: str, data: str, model: str, batch: int = 128, imgsz: int = 640, warmup: int = 40,
        steps: int = 10) -> str:
    """The report of one variant: GPU time a step, then the 30 ops with the most self device time."""
    on_batch_end, state = profile_steps(warmup, steps)
    with tempfile.TemporaryDirectory() as tmp:
        args = {"model": model, "data": data, "imgsz": imgsz, "batch": batch, "project": tmp, "name": variant}
        run_steps(trainer_class(variant), args, on_batch_end)
    events = state["prof"].key_averages()
    key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    # the GPU's own events (kernels, copies) hold its time; an op's self device time is its kernels' again
    total = sum(getattr(e, key) for e in events if e.device_type == DeviceType.CUDA)
    ops = [e for e in events if e.device_type == DeviceType.CPU]
    rows = sorted(ops, key=lambda e: getattr(e, key), reverse=True)[:30]
    lines = [f"{variant}, {model}: GPU time {total / 1e3 / steps:.1f} ms a step ({steps} steps); by op (self):"]
    lines += [f"  {getattr(e, key) / 1e3 / steps:8.2f} ms  {e.count / steps:7.1f} calls  {e.key[:90]}" for e in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("variants", help="comma-separated, as for step_ab")
    ap.add_argument("model", nargs="?", default="yolo11n.yaml")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args(argv)
    variants = a.variants.split(",")
    for v in variants:
        trainer_class(v)  # an unknown variant stops here, before any training
    for v in variants:
        text = top(v, a.data, a.model, a.batch, a.imgsz, a.warmup, a.steps)
        print(text, flush=True)
        name = f"kernel_top_{v}_{a.model.removesuffix('.yaml')}.txt"
        with open(os.path.join(os.environ.get("OUT", "/tmp"), name), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

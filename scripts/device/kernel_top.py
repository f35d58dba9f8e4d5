"""What the GPU spends a training step on, by aten op (issue 4: where a variant's extra GPU time goes).

Usage: python3 scripts/device/kernel_top.py DATA_YAML VARIANT[,VARIANT...] [MODEL]
    VARIANT as in step_ab.py. Batch 128, imgsz 640 (AB_BATCH, AB_IMGSZ change them). Per variant: 40 warm-up
    steps, then 10 under torch.profiler (CPU ops and kernels, no Python stacks: the host slows, the GPU's
    time per op does not). Prints the GPU time a step and the ops with the most of it (self CUDA time);
    writes $OUT/kernel_top_<variant>_<model>.txt.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import step_ab  # noqa: E402  (its variants)
from run_steps import profile_steps, run_steps  # noqa: E402

import yolofeed.doctor.profile as prof  # noqa: E402


def top(variant: str, data: str, model: str, warmup: int = 40, steps: int = 10) -> str:
    on_batch_end, state = profile_steps(warmup, steps)

    with tempfile.TemporaryDirectory() as tmp:
        args = {"model": model, "data": data, "imgsz": int(os.environ.get("AB_IMGSZ", 640)),
                "batch": int(os.environ.get("AB_BATCH", 128)), "project": tmp, "name": variant}
        run_steps(step_ab.trainer_class(variant), args, on_batch_end)
    events = state["prof"].key_averages()
    key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    total = sum(getattr(e, key) for e in events)
    rows = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:30]
    lines = [f"{variant}, {model}: GPU time {total / 1e3 / steps:.1f} ms a step ({steps} steps); by op (self):"]
    lines += [f"  {getattr(e, key) / 1e3 / steps:8.2f} ms  {e.count / steps:7.1f} calls  {e.key[:90]}" for e in rows]
    return "\n".join(lines)


def main() -> None:
    data, variants = sys.argv[1], sys.argv[2].split(",")
    model = sys.argv[3] if len(sys.argv) > 3 else "yolo11n.yaml"
    prof.TRAINER_CLASS = prof.trainer_class
    for v in variants:
        text = top(v, data, model)
        print(text, flush=True)
        with open(os.path.join(os.environ.get("OUT", "/tmp"), f"kernel_top_{v}_{model.removesuffix('.yaml')}.txt"),
                  "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

"""Where the run's end goes: yolofeed's trainer for ``epochs`` epochs with the final validation's parts timed, each
call of the functions below with its thread, start and length, printed as a timeline from that validation's start.

    python -m tools.device.end_profile data=DATA.yaml [epochs=2] [batch=128] [imgsz=640] [trainer=stock] out=DIR
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
from pathlib import Path

CALLS: list[tuple[str, str, float, float]] = []  # (what, thread, start, seconds)


def timed(owner, name: str, label: str) -> None:
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            CALLS.append((label, threading.current_thread().name, t, time.perf_counter() - t))

    setattr(owner, name, wrapper)


def main(argv: list[str]) -> None:
    args = dict(a.split("=", 1) for a in argv)
    out = Path(args.get("out", "."))
    out.mkdir(parents=True, exist_ok=True)
    import ultralytics.utils.metrics as metrics
    import ultralytics.utils.plotting as plotting
    from ultralytics import YOLO
    from ultralytics.data import utils as data_utils
    from ultralytics.engine import validator as base_validator
    from ultralytics.models.yolo.detect import val as detect_val
    from ultralytics.nn import autobackend
    from ultralytics.utils import torch_utils

    from yolofeed import FastDetectionTrainer
    V = detect_val.DetectionValidator
    timed(base_validator.BaseValidator, "__call__", "validator")
    for name in ("preprocess", "postprocess", "update_metrics", "plot_val_samples", "plot_predictions", "get_stats",
                 "finalize_metrics", "print_results", "get_dataloader", "init_metrics"):
        timed(V, name, name)
    timed(autobackend.AutoBackend, "__init__", "AutoBackend")
    timed(autobackend.AutoBackend, "forward", "forward")
    timed(autobackend.AutoBackend, "warmup", "warmup")
    timed(torch_utils, "get_flops", "get_flops")
    timed(base_validator, "check_det_dataset", "check_det_dataset")
    for name in ("plot_pr_curve", "plot_mc_curve", "ap_per_class"):
        timed(metrics, name, name)
    timed(metrics.ConfusionMatrix, "plot", "ConfusionMatrix.plot")
    timed(metrics.ConfusionMatrix, "process_batch", "ConfusionMatrix.process_batch")
    timed(plotting, "plot_images", "plot_images")  # not the validators' name for it, which yolofeed's grids route
    del data_utils
    from ultralytics.models.yolo.detect import DetectionTrainer
    trainer = DetectionTrainer if args.get("trainer") == "stock" else FastDetectionTrainer
    t0 = time.perf_counter()
    YOLO("yolo11n.yaml").train(trainer=trainer, data=args["data"], epochs=int(args.get("epochs", 2)),
                               batch=int(args.get("batch", 128)), imgsz=int(args.get("imgsz", 640)),
                               project=str(out / "runs"), name="t", exist_ok=True)
    wall = time.perf_counter() - t0
    finals = [c for c in CALLS if c[0] == "validator"]
    start = finals[-1][2] if finals else t0
    lines = [f"wall {wall:.1f} s; validations: " + ", ".join(f"{c[3]:.2f}" for c in finals)]
    summary: dict[str, list[float]] = {}
    for what, _, t, s in sorted(CALLS, key=lambda c: c[2]):
        if t >= start - 1e-6:
            summary.setdefault(what, []).append(s)
    for what, values in sorted(summary.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"{what:32s} n={len(values):4d} total {sum(values):7.3f} s  max {max(values):6.3f} s")
    lines.append("timeline of the final validation (start, seconds, thread, what), calls over 20 ms:")
    for what, thread, t, s in sorted(CALLS, key=lambda c: c[2]):
        if t >= start - 1e-6 and s > 0.02:
            lines.append(f"  {t - start:7.3f} {s:7.3f} {thread[:24]:24s} {what}")
    text = "\n".join(lines)
    (out / f"end_{args.get('trainer', 'yolofeed')}.txt").write_text(text)
    calls = [(w, th, t - start, s) for w, th, t, s in CALLS]
    (out / f"calls_{args.get('trainer', 'yolofeed')}.json").write_text(json.dumps(calls))
    print(text, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

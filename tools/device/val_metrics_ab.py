"""A validation with Ultralytics' per-image statistics against one with yolofeed's batched ones, side by side.

``model.val`` of the same model on DATA_YAML's val split, in turns (stock, batched, stock, batched, ...), after one
untimed validation of each: wall seconds of each validation and the mean of each side, plus their metrics (which
must be equal). An untrained model scores every box below Ultralytics' conf=0.001, so ``--conf`` defaults lower:
each image then keeps its 300 detections (max_det), as a model early in training does.

Usage: python -m tools.device.val_metrics_ab DATA_YAML [--model yolo11n.yaml] [--imgsz 640] [--batch 256]
       [--turns 3] [--conf 1e-9]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--model", default="yolo11n.yaml")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--conf", type=float, default=1e-9)
    a = ap.parse_args()
    from ultralytics import YOLO

    from yolofeed.train.val_metrics import BatchedDetectionValidator

    torch.manual_seed(0)
    model = YOLO(a.model)
    kw = dict(data=a.data, imgsz=a.imgsz, batch=a.batch, plots=False, verbose=False, conf=a.conf,
              device=0 if torch.cuda.is_available() else "cpu")
    sides = {"stock": {}, "batched": {"validator": BatchedDetectionValidator}}
    times: dict[str, list[float]] = {k: [] for k in sides}
    metrics = {}
    for turn in range(a.turns + 1):
        for name, extra in sides.items():
            t0 = time.perf_counter()
            m = model.val(**kw, **extra)
            if turn:  # the first turn of each: cuDNN's set-up, the label cache
                times[name].append(round(time.perf_counter() - t0, 3))
            metrics[name] = {k: round(float(v), 6) for k, v in m.results_dict.items()}
            metrics[name + "_speed_ms_per_image"] = {k: round(float(v), 3) for k, v in m.speed.items()}
    res = {"config": vars(a), "seconds": times, "mean_s": {k: round(statistics.mean(v), 3) for k, v in times.items()},
           "metrics": metrics, "equal": metrics["stock"] == metrics["batched"]}
    print(json.dumps(res, indent=1))
    out = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "val_metrics_ab.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

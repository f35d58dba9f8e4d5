"""Issue 4 accuracy parity: train one side (stock or yolofeed) from scratch and record wall time.

Usage: python3 scripts/device/parity_train.py stock|yolofeed DATA_YAML PROJECT [epochs=30 imgsz=320 batch=64 ...]
Writes PROJECT/<side>/results.csv (Ultralytics) and PROJECT/<side>/wall.json.
"""

import json
import sys
import time
from pathlib import Path

from ultralytics import YOLO

from yolofeed.cli import smart_value

side, data, project = sys.argv[1], sys.argv[2], Path(sys.argv[3])
args = {"epochs": 30, "imgsz": 320, "batch": 64, "seed": 0, "workers": 8, "plots": False, "exist_ok": True}
args.update({k: smart_value(v) for k, v in (a.split("=", 1) for a in sys.argv[4:])})
trainer = None
if side == "yolofeed":
    from yolofeed import FastDetectionTrainer as trainer
t0 = time.perf_counter()
YOLO("yolo11n.yaml").train(data=data, project=str(project), name=side, trainer=trainer, **args)
wall = time.perf_counter() - t0
(project / side / "wall.json").write_text(json.dumps({"side": side, "wall_s": round(wall, 1), "args": args}))
print(f"parity {side}: {wall:.0f} s")

"""Issue 4: the same weights validated through Ultralytics' own val loader and through yolofeed's (from the pack).

Usage: python3 scripts/device/val_equality.py WEIGHTS DATA_YAML [imgsz=320 batch=32 device=0 ...]
Prints both metric sets and the largest difference (target: mAP50-95 within 1e-3).
"""

import json
import sys

from ultralytics import YOLO
from ultralytics.models.yolo.detect import DetectionValidator

from yolofeed.cli import smart_value
from yolofeed.loader import ValLoader
from yolofeed.pack import open_or_build

weights, data = sys.argv[1], sys.argv[2]
args = {"data": data, "imgsz": 320, "batch": 32, "plots": False, "verbose": False, "rect": True, "half": False}
args.update({k: smart_value(v) for k, v in (a.split("=", 1) for a in sys.argv[3:])})


def validate(dataloader=None) -> dict:
    model = YOLO(weights).model  # fresh each time: validation fuses the model
    return dict(DetectionValidator(dataloader=dataloader, args=dict(args))(model=model))


stock = validate()
pack = open_or_build(data, "val", args["imgsz"], rebuild="auto", progress=False)
stride = max(int(YOLO(weights).model.stride.max()), 32)
ours = validate(ValLoader(pack, args["batch"], "cpu", stride=stride))  # the validator moves batches to its device
diff = {k: abs(ours[k] - stock[k]) for k in stock}
print(json.dumps({"stock": stock, "yolofeed_val_loader": ours, "largest_difference": max(diff.values())}, indent=1))

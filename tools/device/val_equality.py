"""The same weights validated through Ultralytics' own val loader and through yolofeed's (built from the pack).

Usage: python -m tools.device.val_equality WEIGHTS DATA_YAML [imgsz=320 batch=32 device=0 ...]

Any ``key=value`` goes to Ultralytics' validator. Prints both metric sets and the largest difference as JSON
(the bar: mAP50-95 within 1e-3; equal batches give equal metrics). On the CPU it runs as well (``device=cpu``).
"""

from __future__ import annotations

import json
import sys

from yolofeed.cli import smart_value


def compare(weights: str, data: str, overrides: dict) -> dict:
    """Both validators' metrics on ``weights`` and the largest absolute difference between them."""
    from ultralytics import YOLO
    from ultralytics.models.yolo.detect import DetectionValidator

    from yolofeed.loader import ValLoader
    from yolofeed.pack import open_or_build

    args = {"data": data, "imgsz": 320, "batch": 32, "plots": False, "verbose": False, "rect": True, "half": False,
            **overrides}

    def validate(dataloader=None) -> dict:
        model = YOLO(weights).model  # fresh each time: validation fuses the model
        return dict(DetectionValidator(dataloader=dataloader, args=dict(args))(model=model))

    stock = validate()
    pack = open_or_build(data, "val", args["imgsz"], rebuild="auto", progress=False)
    stride = max(int(YOLO(weights).model.stride.max()), 32)
    ours = validate(ValLoader(pack, args["batch"], "cpu", stride=stride))  # the validator moves batches to its device
    diff = {k: abs(ours[k] - stock[k]) for k in stock}
    return {"stock": stock, "yolofeed_val_loader": ours, "largest_difference": max(diff.values())}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] in ("-h", "--help") or any("=" not in a for a in argv[2:]):
        raise SystemExit(__doc__)
    overrides = {k: smart_value(v) for k, v in (a.split("=", 1) for a in argv[2:])}
    print(json.dumps(compare(argv[0], argv[1], overrides), indent=1))


if __name__ == "__main__":
    main()

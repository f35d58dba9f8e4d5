"""How much a detection run's boxes depend on its polygon labels, in Ultralytics itself.

Usage: python -m tools.detect_polygon_boxes DATA_YAML [--images N] [--imgsz S] [key=value ...]

Ultralytics' detection dataset keeps a split's polygons where every label row is one, and its augmentation makes
each box of its moved polygon (``RandomPerspective``: ``segment2box``). This builds the training split's
``YOLODataset(task="detect")`` twice, as it is and with the polygons dropped (boxes moved as boxes), draws each
image's augmentation with the same seed on both, and compares: the images whose count of boxes differs (the box
candidates' filter), and the IoU of the boxes of the others, row for row (where a count differs, other rows may
have been filtered on each side: those images are counted, not paired). ``key=value`` sets augmentation keys
(``degrees=10``). CPU only; about a second per 20 images at 320.
"""

from __future__ import annotations

import argparse
import random

import numpy as np
import torch
import yaml


def compare(data_yaml: str, images: int, imgsz: int, keys: dict[str, float]) -> dict[str, float]:
    """The counts above for the first ``images`` training images."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.dataset import YOLODataset
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.utils.metrics import box_iou
    from ultralytics.utils.ops import xywh2xyxy

    data = check_det_dataset(data_yaml)
    hyp = get_cfg(overrides=keys)

    def dataset(polygons: bool) -> YOLODataset:
        ds = YOLODataset(img_path=data["train"], imgsz=imgsz, augment=True, data=data, hyp=hyp, task="detect")
        if not polygons:
            for label in ds.labels:
                label["segments"] = []
        return ds

    with_polygons, boxes_only = dataset(True), dataset(False)
    n = min(images, len(with_polygons))
    ious, counts_differ, boxes = [], 0, [0, 0]
    for i in range(n):
        out = []
        for ds in (with_polygons, boxes_only):  # the same draws: each seeded alike
            random.seed(i)
            np.random.seed(i)
            torch.manual_seed(i)
            out.append(ds[i]["bboxes"])
        a, b = out
        boxes[0] += len(a)
        boxes[1] += len(b)
        if len(a) != len(b):
            counts_differ += 1
        elif len(a):
            ious.append(box_iou(xywh2xyxy(a), xywh2xyxy(b)).diagonal())
    iou = torch.cat(ious) if ious else torch.ones(0)
    return {"images": n, "polygon_rows": sum(len(x["segments"]) for x in with_polygons.labels[:n]),
            "boxes_with_polygons": boxes[0], "boxes_without": boxes[1], "images_count_differs": counts_differ,
            "matched_boxes": len(iou), "iou_mean": float(iou.mean()) if len(iou) else 1.0,
            **{f"iou_below_{t}": float((iou < t).float().mean()) if len(iou) else 0.0 for t in (0.99, 0.9, 0.7)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("keys", nargs="*", help="augmentation keys, key=value")
    args = parser.parse_intermixed_args()
    keys = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in args.keys)}  # 10, 0.5, true, a name
    r = compare(args.data, args.images, args.imgsz, keys)
    print(f"{keys or 'default keys'}: {r['images']} images ({r['polygon_rows']} polygon rows); boxes "
          f"{r['boxes_with_polygons']} with the polygons, {r['boxes_without']} without; images whose count differs "
          f"{r['images_count_differs']}; of {r['matched_boxes']} matched boxes IoU mean {r['iou_mean']:.4f}, "
          f"< 0.99 {r['iou_below_0.99']:.1%}, < 0.9 {r['iou_below_0.9']:.1%}, < 0.7 {r['iou_below_0.7']:.1%}")


if __name__ == "__main__":
    main()

"""What Ultralytics' detection validator spends per image outside the model, on the CPU.

``python -m tools.val_host_cost [--images 500] [--batch 256] [--candidates 0,30,300,3000,30000] [--profile]``

Raw head outputs (B, 4+nc, anchors) are built with a chosen number of (anchor, class) scores above conf=0.001 per
image (``--candidates``: a trained model leaves tens, an early one thousands; NMS caps them at 30,000), half of them on
anchors whose boxes are jittered copies of the image's targets (the target's class first), half on random boxes. The
targets are those of ``yolofeed synth``'s val images (1-20 boxes of 80 classes), letterboxed into Ultralytics' rect
batches. The validator is Ultralytics' own ``DetectionValidator`` (conf 0.001, iou 0.7, max_det 300, plots off as in
the epochs before the last), and the three parts are timed as ``BaseValidator.__call__`` runs them:
``postprocess`` (NMS), ``update_metrics`` (per image: targets, IoU, ``match_predictions``, stats) and ``get_stats``
(concatenation, ``ap_per_class``). Columns: ms per image; ``ops/img``: the aten ops each part dispatches per image,
which on a GPU are kernel launches or host syncs (each costs the host microseconds there, whatever its size).
The columns on the right are yolofeed's: its validator's NMS (``val_nms.batched_nms``, each image's candidates found a
group of images at a time) and its batched ``update_metrics``, with whether the mAP is the same. ``--profile`` adds
cProfile's top functions of each part at the largest candidate count.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from yolofeed.loader.val import rect_batches
from yolofeed.synth import CLASS_NAMES, render

STRIDES = (8, 16, 32)


def targets(n: int, imgsz: int, seed: int = 0) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """The first ``n`` val images of ``yolofeed synth`` (seed 0): their (h, w) and (boxes xyxy px, classes)."""
    shapes, labels = [], []
    for i in range(n):
        s = render(seed, "val", i, imgsz=imgsz)
        shapes.append(s.image.shape[:2])
        labels.append((s.boxes.astype(np.float32), s.classes))
    return np.array(shapes), labels


def raw_outputs(boxes: list[np.ndarray], classes: list[np.ndarray], hw: tuple[int, int], nc: int, candidates: int,
                rng: np.random.Generator) -> torch.Tensor:
    """Raw head outputs with ``candidates`` (anchor, class) scores above 0.001 per image.

    Shape:
        boxes[i]: (T, 4) xyxy pixels in the letterboxed batch; returns (B, 4 + nc, anchors), xywh pixels.
    """
    h, w = hw
    a = sum((h // s) * (w // s) for s in STRIDES)
    out = np.empty((len(boxes), 4 + nc, a), np.float32)
    out[:, 4:] = 5e-4  # below conf: filtered before NMS, whatever the value
    out[:, 0], out[:, 1] = rng.uniform(0, w, a), rng.uniform(0, h, a)  # random boxes for the candidates below
    out[:, 2:4] = rng.uniform(8, 200, (2, a))
    for i, (b, c) in enumerate(zip(boxes, classes)):
        if not candidates:
            continue
        pairs = rng.choice(a * nc, size=min(candidates, a * nc), replace=False)
        anchor, cls = pairs % a, pairs // a
        near = rng.random(len(pairs)) < 0.5 if len(b) else np.zeros(len(pairs), bool)
        t = rng.integers(0, max(len(b), 1), len(pairs))
        if len(b):  # near a target: its box jittered by ~10 % of its side, its class first, a high score
            wh = b[t, 2:] - b[t, :2]
            xy = (b[t, :2] + b[t, 2:]) / 2
            jittered_xy = xy + rng.normal(0, 0.1, xy.shape) * wh
            jittered_wh = wh * np.exp(rng.normal(0, 0.1, wh.shape))
            out[i, 0:2, anchor[near]] = jittered_xy[near]
            out[i, 2:4, anchor[near]] = jittered_wh[near]
            right = near & (rng.random(len(pairs)) < 0.5)
            cls = np.where(right, c[t], cls)
        score = np.exp(rng.uniform(np.log(1.1e-3), np.log(0.1), len(pairs)))
        score = np.where(near, np.exp(rng.uniform(np.log(1.1e-3), np.log(0.95), len(pairs))), score)
        out[i, 4 + cls, anchor] = score
    return torch.from_numpy(out)


def batches(n: int, batch: int, imgsz: int, nc: int, candidates: int, seed: int = 0) -> list[tuple[torch.Tensor, dict]]:
    """(raw outputs, validator batch) for ``n`` synth val images in Ultralytics' rect batches."""
    ori, labels = targets(n, imgsz, seed)
    order, groups, shapes = rect_batches(ori, batch, imgsz, max(STRIDES))
    rng = np.random.default_rng(seed)
    out = []
    for group, (h, w) in zip(groups, shapes.tolist()):
        boxes, classes, bidx, ratio_pad = [], [], [], []
        for j, k in enumerate(group):
            oh, ow = ori[k]
            top, left = (h - oh) // 2, (w - ow) // 2  # pack images are stored at imgsz: no resize here
            b, c = labels[k]
            boxes.append(b + np.array([left, top, left, top], np.float32))
            classes.append(c)
            bidx.append(np.full(len(c), j))
            ratio_pad.append(((1.0, 1.0), (left, top)))
        xyxy = np.concatenate(boxes)
        xywh = np.concatenate([(xyxy[:, :2] + xyxy[:, 2:]) / 2, xyxy[:, 2:] - xyxy[:, :2]], 1) / [w, h, w, h]
        batch = {"img": torch.zeros(len(group), 3, h, w),
                 "cls": torch.from_numpy(np.concatenate(classes))[:, None].float(),
                 "bboxes": torch.from_numpy(xywh).float(), "batch_idx": torch.from_numpy(np.concatenate(bidx)).float(),
                 "ori_shape": [tuple(ori[k]) for k in group], "ratio_pad": ratio_pad,
                 "im_file": [f"val/{k:06d}.jpg" for k in group]}
        out.append((raw_outputs(boxes, classes, (h, w), nc, candidates, rng), batch))
    return out


def validator(nc: int):
    """Ultralytics' DetectionValidator as a training run's epoch sets it up (CPU, no plots, no json)."""
    from ultralytics.models.yolo.detect import DetectionValidator

    v = DetectionValidator(args=dict(conf=0.001, iou=0.7, max_det=300, plots=False, save_json=False, verbose=False))
    v.device, v.training, v.data = torch.device("cpu"), True, {"val": "val"}
    v.dataloader = SimpleNamespace(dataset=SimpleNamespace(im_files=[]), sampler=[])
    v.init_metrics(SimpleNamespace(names=dict(enumerate(CLASS_NAMES[:nc]))))
    return v


class OpCount(TorchDispatchMode):
    """Counts the aten ops dispatched (a GPU launch or sync each)."""

    def __init__(self):
        super().__init__()
        self.n = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def run_once(data, nc: int, profilers: dict | None = None, ops: dict | None = None,
             batched: bool = False, plots: bool = False) -> dict[str, float]:
    """One validation's host parts over ``data``; seconds per part. ``batched``: yolofeed's batched NMS
    (``BatchedDetectionValidator.postprocess``) and update_metrics. ``plots``: update_metrics counts the confusion
    matrix too, as in a run's last epoch and its final validation (its sum of cells returned as ``matrix``; the
    figures are not drawn)."""
    from yolofeed.train.val_metrics import BatchedDetectionValidator, update_metrics
    v = validator(nc)
    v.args.plots = plots
    t = Counter()

    def part(name, fn, *args):
        p = profilers.get(name) if profilers else None
        counter = OpCount() if ops is not None else None
        t0 = time.perf_counter()
        if p:
            p.enable()
        if counter:
            with counter:
                r = fn(*args)
            ops[name] = ops.get(name, 0) + sum(counter.n.values())
        else:
            r = fn(*args)
        if p:
            p.disable()
        t[name] += time.perf_counter() - t0
        return r

    with torch.inference_mode():
        for raw, batch in data:
            preds = part("postprocess", BatchedDetectionValidator.postprocess if batched else type(v).postprocess, v,
                         raw)
            if batched:
                part("update_metrics", update_metrics, v, preds, batch)
            else:
                part("update_metrics", v.update_metrics, preds, batch)
        v.args.plots = False  # the curves are not drawn
        stats = part("get_stats", v.get_stats)
    t["mAP50-95"] = stats["metrics/mAP50-95(B)"]
    t["matrix"] = hash(v.confusion_matrix.matrix.tobytes())
    return t


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=500)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--nc", type=int, default=80)
    p.add_argument("--candidates", default="0,30,300,3000,30000")
    p.add_argument("--repeat", type=int, default=3, help="best of this many runs (the CPU is shared)")
    p.add_argument("--profile", action="store_true", help="cProfile's top functions of each part")
    p.add_argument("--plots", action="store_true", help="update_metrics counts the confusion matrix (a run's last "
                                                         "epoch and final validation)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    parts = ("postprocess", "update_metrics", "get_stats")
    print(f"{a.images} images, batch {a.batch}, imgsz {a.imgsz}, nc {a.nc}, 1 thread, plots {a.plots}; ms per image "
          f"(best of {a.repeat}), aten ops per image")
    print(f"{'cand/img':>9} {'kept/img':>8} " + " ".join(f"{x:>15} {'ops/img':>8}" for x in parts)
          + f" {'total':>7} {'mAP50-95':>8}   batched NMS: {'ms':>3} {'ops':>5}, update_metrics: {'ms':>3} "
            f"{'ops':>5} {'same mAP (and matrix)':>8}")
    counts = [int(c) for c in a.candidates.split(",")]
    for c in counts:
        data = batches(a.images, a.batch, a.imgsz, a.nc, c)
        ops: dict[str, int] = {}
        run_once(data, a.nc, ops=ops, plots=a.plots)
        kept = sum(len(x["conf"]) for raw, _ in data for x in validator(a.nc).postprocess(raw)) / a.images
        best = {k: min(r[k] for r in rs) for rs in [[run_once(data, a.nc, plots=a.plots) for _ in range(a.repeat)]]
                for k in parts}
        m = run_once(data, a.nc, plots=a.plots)
        fast = [run_once(data, a.nc, batched=True, plots=a.plots) for _ in range(a.repeat)]
        fast_ms = min(r["update_metrics"] for r in fast) / a.images * 1e3
        nms_ms = min(r["postprocess"] for r in fast) / a.images * 1e3
        fast_ops: dict[str, int] = {}
        ours = run_once(data, a.nc, ops=fast_ops, batched=True, plots=a.plots)
        same = ours["mAP50-95"] == m["mAP50-95"] and ours["matrix"] == m["matrix"]
        ms = {k: best[k] / a.images * 1e3 for k in parts}
        print(f"{c:>9} {kept:>8.1f} " + " ".join(f"{ms[k]:>15.3f} {ops[k] / a.images:>8.0f}" for k in parts)
              + f" {sum(ms.values()):>7.3f} {m['mAP50-95']:>8.4f}   {nms_ms:>15.3f} "
              f"{fast_ops['postprocess'] / a.images:>5.1f}, {fast_ms:>18.3f} "
              f"{fast_ops['update_metrics'] / a.images:>5.1f} {'yes' if same else 'NO':>8}")
    if a.profile:
        data = batches(a.images, a.batch, a.imgsz, a.nc, counts[-1])
        profilers = {k: cProfile.Profile() for k in parts}
        run_once(data, a.nc, profilers=profilers)
        for k in parts[:2]:
            counter = OpCount()
            v = validator(a.nc)
            with torch.inference_mode(), counter:
                for raw, batch in data:
                    preds = v.postprocess(raw)
                    if k == "update_metrics":
                        counter.n.clear()
                        v.update_metrics(preds, batch)
                        break
                    break
            n = len(data[0][1]["ori_shape"])
            top = ", ".join(f"{name} {c / n:.1f}" for name, c in counter.n.most_common(12))
            print(f"\n-- {k}: aten ops per image, most frequent: {top}")
        for k in parts:
            s = io.StringIO()
            pstats.Stats(profilers[k], stream=s).sort_stats("tottime").print_stats(8)
            body = [ln for ln in s.getvalue().splitlines() if ln.strip()][3:]
            print(f"\n-- {k}, {counts[-1]} candidates/img: cProfile's top functions by own time")
            print("\n".join(body[:11]))


if __name__ == "__main__":
    main()

"""Ultralytics' ``RandomFlip``, twice as ``v8_transforms`` has it: up-down (``flipud``), then left-right (``fliplr``).

A flip is the warp's last step, a reflection of the output index (x -> S - 1 - x) rather than a matrix: that
moves whole pixels, exactly as ``np.fliplr`` after the warp does, where a matrix would resample them. Boxes
reflect about the image edges (x -> S - x, ``Instances.fliplr``), keypoints too, and a flipped row's keypoints
take the data's ``flip_idx`` order (left and right swapped), on either flip as Ultralytics' ``RandomFlip`` does; an
oriented box's segment and a segmentation polygon reflect point by point (``Instances.fliplr``: x -> S - x).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from yolofeed.augment.hyp import AugmentHyp
from yolofeed.augment.op import Draw, GeometricOp, Labels, WarpPlan, coin


@dataclass
class FlipParams:
    """Both flips as the warp reads them. Shape: ud, lr: (B,) bool (``RandomFlip`` vertical, then horizontal)."""

    ud: Tensor
    lr: Tensor


def flip_axis(boxes: Tensor, flip: Tensor, size: int, axis: int) -> Tensor:
    """Reflect the boxes of flipped rows along x (``axis`` 0) or y (1): c -> size - c, the two edges swapped.

    Shape: boxes (B, K, 4) xyxy; flip (B,) bool.
    """
    x1, y1, x2, y2 = boxes.unbind(-1)
    on = flip[:, None]
    if axis == 0:
        x1, x2 = torch.where(on, size - x2, x1), torch.where(on, size - x1, x2)
    else:
        y1, y2 = torch.where(on, size - y2, y1), torch.where(on, size - y1, y2)
    return torch.stack([x1, y1, x2, y2], -1)


def flip_keypoints(keypoints: Tensor, flip: Tensor, size: int, axis: int,
                   flip_idx: tuple[int, ...] | None) -> Tensor:
    """Reflect the keypoints of flipped rows along x (``axis`` 0) or y (1), c -> size - c, and reorder them by
    ``flip_idx`` (``RandomFlip.apply_instances``: ``keypoints[:, flip_idx]``); visibility unchanged.

    Shape: keypoints (B, K, P, 3); flip (B,) bool. Returns (B, K, P, 3).
    """
    on = flip[:, None, None]
    x, y, v = keypoints.unbind(-1)
    if axis == 0:
        x = torch.where(on, size - x, x)
    else:
        y = torch.where(on, size - y, y)
    moved = torch.stack([x, y, v], -1)
    if flip_idx:  # a stack of views (one copy kernel): indexing by a list would copy it from the host
        moved = torch.where(on[..., None], torch.stack([moved[:, :, j] for j in flip_idx], 2), moved)
    return moved


def flip_segments(segments: Tensor, flip: Tensor, size: int, axis: int) -> Tensor:
    """Reflect the segments of flipped rows along x (``axis`` 0) or y (1), c -> size - c (``Instances.flipud``,
    ``fliplr``). Shape: segments (B, K, P, 2); flip (B,) bool. Returns (B, K, P, 2)."""
    c = segments[..., axis]
    moved = torch.where(flip[:, None, None], size - c, c)
    return torch.stack([moved, segments[..., 1]] if axis == 0 else [segments[..., 0], moved], -1)


def flip_boxes(boxes: Tensor, p: FlipParams, size: int) -> Tensor:
    """Both flips of ``p`` (``Instances.flipud``, then ``fliplr``)."""
    return flip_axis(flip_axis(boxes, p.ud, size, 1), p.lr, size, 0)


class RandomFlip(GeometricOp):
    """``RandomFlip("flipud")`` or ``RandomFlip("fliplr")``: each row flips with that probability.

    Its draw is one (R,) bool tensor, its field of ``AugmentParams`` named after its key.
    """

    Params = Tensor

    def __init__(self, key: str):
        if key not in ("flipud", "fliplr"):
            raise ValueError(f"RandomFlip({key!r}): expected 'flipud' or 'fliplr'")
        self.name = key
        self.axis = 1 if key == "flipud" else 0  # the box coordinate it reflects: y, or x
        self.field = "ud" if key == "flipud" else "lr"  # its reflection of the warp's output

    def sample(self, draw: Draw, hyp: AugmentHyp, generator: torch.Generator | None) -> Tensor:
        return coin(generator, draw.rows, getattr(hyp, self.name), draw.device)

    def warp_step(self, plan: WarpPlan, p: Tensor, hyp: AugmentHyp) -> WarpPlan:
        return dataclasses.replace(plan, **{self.field: p})

    def apply_boxes(self, labels: Labels, plan: WarpPlan, p: Tensor, hyp: AugmentHyp) -> Labels:
        return dataclasses.replace(labels, boxes=flip_axis(labels.boxes, p, hyp.imgsz, self.axis))

    def apply_keypoints(self, keypoints: Tensor, plan: WarpPlan, p: Tensor, hyp: AugmentHyp) -> Tensor:
        return flip_keypoints(keypoints, p, hyp.imgsz, self.axis, hyp.flip_idx)

    def apply_corners(self, labels: Labels, moved: Labels, plan: WarpPlan, p: Tensor, hyp: AugmentHyp) -> Labels:
        return dataclasses.replace(moved, segments=flip_segments(labels.segments, p, hyp.imgsz, self.axis))

    def apply_polygons(self, labels: Labels, moved: Labels, plan: WarpPlan, p: Tensor, hyp: AugmentHyp) -> Labels:
        return dataclasses.replace(moved, polygons=flip_segments(labels.polygons, p, hyp.imgsz, self.axis),
                                   polygon_points=labels.polygon_points)

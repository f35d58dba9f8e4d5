"""Ultralytics' ``CopyPaste`` in its ``flip`` mode (``copy_paste_mode``'s default), between the mosaic and the
perspective as ``v8_transforms`` inserts it: each canvas pastes mirrored copies of its own objects.

What 8.4's ``CopyPaste`` does on a canvas of width w whose instances have segments (otherwise nothing):

* every instance is mirrored (``Instances.fliplr``: x -> w - x, box edges swapped);
* a mirrored copy is eligible where its box covers less than 30 % of every original box (``bbox_ioa`` of the copy
  over the original, float32 with eps 1e-7), and the eligible ones are sorted by their largest such cover,
  ascending; the first ``round(copy_paste x eligible)`` are pasted (Python's round: half to even). There is no
  random draw: ``copy_paste`` is a fraction of the eligible copies, not a probability;
* their polygons, cast to int32, are filled (``cv2.drawContours(..., FILLED)``) into one mask, and where it is set
  the canvas takes its mirror's pixel (``cv2.flip``: x -> w - 1 - x) from the canvas as the mosaic left it;
* the copies' classes, boxes and polygons are appended after the originals, in that sorted order.

Here the copies fill the second half of the row's slots (``chosen`` ones first, in that order, then padding), so the
slots double. The mask is ``kernels.polyfill.fill_union`` of the chosen copies at the canvas' resolution, and the
warp reads a mirrored canvas pixel where it is set (``WarpPlan.paste``): no canvas is built. NumPy's ``argsort``
(introsort, or the SIMD sort where the CPU has AVX2 / AVX-512) orders equal covers by the machine; here they keep
their slot order (a stable sort), so where more copies tie than are pasted the ones chosen may differ from
Ultralytics' on that machine; each chosen copy's cover is still at most every unchosen eligible one's. Ties are
common (a copy that overlaps no original covers 0), so with copy_paste below 1 the earlier slots (the mosaic's
first tiles) are preferred among them here, where Ultralytics' order among them is the sort's.

Oriented boxes paste the same way: their segments are their corners resampled to 100 points (``geometry.obb``, as
Ultralytics' ``update_labels_info`` makes them), mirrored point by point and filled as Ultralytics' ``drawContours``
fills them. Their fill cannot run out of event slots: it is given, per copy, the most any quadrilateral's outline
can make, convex or not (``quad_events``).

Cost: the covers are (R, K, K) for R rows of K slots; the fill is the chosen polygons' rasterisation events (about
0.8 MB a copy of 1,000 points on a 1280-pixel canvas, measured on the CPU, made for 512 copies at a time) and a
histogram over each row's canvas with its prefix sum, ``2 x R x H x (W + 1)`` int32 (1.7 GB for 128 rows of a
1280-pixel mosaic canvas).
A training batch bounds both (``GpuAugment``'s ``paste_capacity`` and ``paste_room``): the copies past the capacity
(row-major) are not pasted, labels and pixels alike, and event slots are pooled over each chunk of copies, ``room x
(n + canvas side)`` a copy; what either leaves out is counted (``AugmentedBatch.paste_lost``), never silently: the
segment trainer warns and doubles the room, as it does for its masks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from yolofeed.augment.hyp import AugmentHyp
from yolofeed.augment.op import Draw, GeometricOp, Labels, WarpPlan
from yolofeed.kernels.polyfill import fill_union

COVER_BELOW = 0.30  # a copy is eligible where it covers less than this of every original box
EPS = 1e-7  # bbox_ioa's


def quad_events(points: int, side: int) -> int:
    """The most fill events (``kernels.polyfill``: one per edge and row it crosses, one per edge and row its line
    covers) an oriented box's outline of ``points`` points makes on a canvas of ``side`` rows. The points lie on the
    box's 4 straight sides, and truncated to integers each side stays monotonic in y: each crosses a row at most once
    (4 x side crossings) and its line covers at most side rows, one more a point (4 x side + points). A convex outline
    makes half the crossings and lines; an annotated quadrilateral may be concave (a chevron), which needs the rest."""
    return 8 * side + points


@dataclass
class Picks:
    """The copies of each row. Shape: order (R, K) int64, the slot each copy slot mirrors (chosen ones first, in
    Ultralytics' order); chosen (R, K) bool, the copy slots that hold a pasted copy; width (R,) float32 canvas
    widths."""

    order: Tensor
    chosen: Tensor
    width: Tensor
    lost: Tensor  # () int64, copies left out for want of capacity


def covers(mirrored: Tensor, boxes: Tensor, valid: Tensor) -> Tensor:
    """``bbox_ioa(mirrored, boxes)`` per row: the share of each original box (i) each mirrored box (j) covers, float32
    as NumPy computes it; 0 against an invalid slot. Shape: (R, K, 4) xyxy twice, valid (R, K) -> (R, K, K)."""
    ax1, ay1, ax2, ay2 = (t[:, :, None] for t in mirrored.unbind(-1))
    bx1, by1, bx2, by2 = (t[:, None, :] for t in boxes.unbind(-1))
    inter = (torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1)).clamp(min=0) * (
        torch.minimum(ay2, by2) - torch.maximum(ay1, by1)).clamp(min=0)
    area = (bx2 - bx1) * (by2 - by1)
    return (inter / (area + EPS)).masked_fill(~valid[:, None, :], 0.0)


def mirror_boxes(boxes: Tensor, width: Tensor) -> Tensor:
    """``Instances.fliplr`` of xyxy boxes about each row's canvas width: x -> w - x, the edges swapped."""
    x1, y1, x2, y2 = boxes.unbind(-1)
    w = width[:, None]
    return torch.stack([w - x2, y1, w - x1, y2], -1)


def pick(boxes: Tensor, valid: Tensor, width: Tensor, fraction: float, capacity: int | None = None) -> Picks:
    """Which mirrored copies each row pastes, and in which order (the module's doc).

    Shape: boxes (R, K, 4) float32 xyxy canvas pixels; valid (R, K) bool; width (R,) float32 canvas widths.

    Args:
        capacity: the most copies the batch pastes, the first in row-major order (None: all); the rest are left
            out, counted in ``Picks.lost``.
    """
    ioa = covers(mirror_boxes(boxes, width), boxes, valid)
    eligible = valid & (ioa < COVER_BELOW).all(2)
    key = torch.where(eligible, ioa.amax(2), torch.full_like(ioa[..., 0], float("inf")))
    order = torch.sort(key, dim=1, stable=True).indices
    take = torch.round(fraction * eligible.sum(1).double()).long()  # Python's round(p * n): half to even
    chosen = torch.arange(valid.shape[1], device=valid.device) < take[:, None]
    lost = torch.zeros((), dtype=torch.int64, device=valid.device)
    if capacity is not None:
        within = chosen.flatten().cumsum(0).reshape(chosen.shape) <= capacity
        lost = (chosen & ~within).sum()
        chosen = chosen & within
    return Picks(order, chosen, width, lost)


def _gather(t: Tensor, order: Tensor) -> Tensor:
    """The copies' rows of a per-slot tensor (R, K, ...)."""
    index = order.reshape(*order.shape, *([1] * (t.dim() - 2))).expand(*order.shape, *t.shape[2:])
    return t.gather(1, index)


def canvas_side(hyp: AugmentHyp) -> int:
    """The largest canvas a row can have before the perspective: the mosaic's (2 x imgsz; the 3 x 3 grid's 3 x imgsz
    less ceil(imgsz / 2) cropped off each side, ``geometry.mosaic.mosaic_layout``), else imgsz."""
    s = hyp.imgsz
    if hyp.mosaic <= 0:
        return s
    return 2 * s if hyp.mosaic_grid == 4 else 3 * s - 2 * (-(-s // 2))


class CopyPaste(GeometricOp):
    """``CopyPaste(p=copy_paste, mode="flip")``: no draws; its work is in the label hooks and ``paste_step``."""

    name = "copy_paste"
    Params = type(None)

    def on(self, hyp: AugmentHyp) -> bool:
        return hyp.copy_paste > 0

    def sample(self, draw: Draw, hyp: AugmentHyp, generator: torch.Generator | None) -> None:
        return None

    def warp_step(self, plan: WarpPlan, p: None, hyp: AugmentHyp) -> WarpPlan:
        return plan  # the pixels are pasted by paste_step, once the copies are known

    def _picks(self, labels: Labels, plan: WarpPlan, hyp: AugmentHyp) -> Picks:
        width = plan.tiles.canvas_hw[:, 1].to(labels.boxes.dtype)
        return pick(labels.boxes, labels.valid, width, float(hyp.copy_paste), plan.paste_capacity)

    def apply_boxes(self, labels: Labels, plan: WarpPlan, p: None, hyp: AugmentHyp) -> Labels:
        if not self.on(hyp) or _outlines(labels) is None:  # Ultralytics: nothing without segments
            return labels
        picks = self._picks(labels, plan, hyp)
        mirrored = mirror_boxes(labels.boxes, picks.width)
        return dataclasses.replace(
            labels, cls=torch.cat([labels.cls, _gather(labels.cls, picks.order)], 1),
            boxes=torch.cat([labels.boxes, _gather(mirrored, picks.order)], 1),
            valid=torch.cat([labels.valid, picks.chosen], 1))

    def apply_keypoints(self, keypoints: Tensor, plan: WarpPlan, p: None, hyp: AugmentHyp) -> Tensor:
        return keypoints  # a pose row has no segments: Ultralytics pastes nothing

    def _with_copies(self, outlines: Tensor, labels: Labels, plan: WarpPlan, hyp: AugmentHyp) -> Tensor:
        """(R, K, n, 2) outlines and, in the second K slots, the copies' mirrored ones (``Instances.fliplr``: x -> w -
        x, point by point)."""
        picks = self._picks(labels, plan, hyp)
        x, y = outlines.unbind(-1)
        mirrored = torch.stack([picks.width[:, None, None] - x, y], -1)
        return torch.cat([outlines, _gather(mirrored, picks.order)], 1)

    def apply_corners(self, labels: Labels, moved: Labels, plan: WarpPlan, p: None, hyp: AugmentHyp) -> Labels:
        if not self.on(hyp):
            return dataclasses.replace(moved, segments=labels.segments)
        return dataclasses.replace(moved, segments=self._with_copies(labels.segments, labels, plan, hyp))

    def apply_polygons(self, labels: Labels, moved: Labels, plan: WarpPlan, p: None, hyp: AugmentHyp) -> Labels:
        if not self.on(hyp):
            return dataclasses.replace(moved, polygons=labels.polygons, polygon_points=labels.polygon_points)
        return dataclasses.replace(moved, polygons=self._with_copies(labels.polygons, labels, plan, hyp),
                                   polygon_points=labels.polygon_points)

    def paste_step(self, plan: WarpPlan, labels: Labels, hyp: AugmentHyp) -> WarpPlan:
        """The plan with the paste mask of the copies ``labels`` (as this op left them) hold: the second half of
        each row's slots."""
        outlines = _outlines(labels)
        if not self.on(hyp) or outlines is None:
            return plan
        if plan.matrix is not None:
            raise ValueError("copy-paste after a matrix: it pastes on the mosaic's canvas (augment.pipeline.OPS)")
        r, k2, n, _ = outlines.shape
        k = k2 // 2
        side, dev = canvas_side(hyp), labels.valid.device
        # an oriented box's outline: the most any quadrilateral makes, so that none is dropped; a polygon's are pooled
        events = quad_events(n, side) if labels.polygons is None else plan.paste_room * (n + side)
        polygons, chosen = outlines[:, k:].reshape(r * k, n, 2), labels.valid[:, k:].reshape(-1)
        owner = torch.arange(r, device=dev).repeat_interleave(k)
        clip = plan.tiles.canvas_hw.long().repeat_interleave(k, 0)
        if plan.paste_capacity is not None and plan.paste_capacity < r * k:
            # the chosen copies first (at most the capacity, as pick left them), the fill's cost is theirs
            first = torch.sort((~chosen).to(torch.uint8), stable=True).indices[:plan.paste_capacity]
            polygons, chosen, owner, clip = polygons[first], chosen[first], owner[first], clip[first]
        mask, dropped = fill_union(polygons, chosen, owner, r, side, side, clip=clip, events=events)
        lost = self._picks(dataclasses.replace(labels, boxes=labels.boxes[:, :k], valid=labels.valid[:, :k]),
                           plan, hyp).lost
        return dataclasses.replace(plan, paste=mask, paste_lost=lost + dropped)


def _outlines(labels: Labels) -> Tensor | None:
    """What copy-paste mirrors and fills: the segmentation polygons, or the oriented boxes' segments; None (detection,
    pose): nothing, as Ultralytics pastes nothing without segments."""
    return labels.polygons if labels.polygons is not None else labels.segments

"""Ultralytics' ``RandomPerspective``: rotation, scale, shear, translation and perspective as one (R, 3, 3) matrix.

``M = T @ S @ R @ P @ C`` (Ultralytics' order) maps mosaic canvas pixels to output pixels; the warp samples
the image through it once, and the boxes go through the same matrix here (their corners, then the hull, clipped
and filtered as ``box_candidates``), the keypoints too (``warp_keypoints``: a point that leaves the output is
made invisible; a filtered box takes its keypoints with it, as they share its slot). An oriented box's segment
goes through it point by point and its box is made from the moved points, as Ultralytics' ``apply_segments`` does
(``warp_segments``: clipped to the output as its OBB clip does, filtered with 1 % of the area); a segmentation
polygon likewise, its box the bounds of its part inside the output (``warp_polygons``: ``segment2box``). The draws
are float64 like Python's ``random``, the matrix float32 like OpenCV's, so the warp reproduces ``cv2.warpAffine`` /
``warpPerspective`` bit for bit (OpenCV 5.0; ``kernels.warp`` says how other releases round).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from yolofeed.augment.geometry.obb import clip_obb, segment_bounds
from yolofeed.augment.geometry.polygons import boxes_and_clip
from yolofeed.augment.hyp import AugmentHyp
from yolofeed.augment.op import Draw, GeometricOp, Labels, WarpPlan, clip_keypoints, matmul3, uniform

BOX_WH_MIN = 2.0  # Ultralytics box_candidates: width and height must exceed 2 px
BOX_AR_MAX = 100.0  # ... aspect ratio below 100
BOX_AREA_RATIO = 0.10  # ... and keep more than 10 % of the (scaled) original area
BOX_AREA_RATIO_SEGMENTS = 0.01  # ... 1 % where the labels have segments (apply_instances: OBB, segment)


@dataclass
class PerspectiveParams:
    """Per-sample draws of ``RandomPerspective`` (Ultralytics' names), float64 like Python's ``random``.

    Shape: every field (B,). ``translate`` fields are fractions of the output size.
    """

    persp_x: Tensor
    persp_y: Tensor
    angle: Tensor
    scale: Tensor
    shear_x: Tensor
    shear_y: Tensor
    translate_x: Tensor
    translate_y: Tensor


def sample_perspective(batch_size: int, hyp: AugmentHyp, generator: torch.Generator | None,
                       device: torch.device) -> PerspectiveParams:
    """Draw rotation, scale, shear, translation and perspective as ``RandomPerspective`` does."""
    n = (batch_size,)
    p, d, sh, t = hyp.perspective, hyp.degrees, hyp.shear, hyp.translate
    lo, hi = (hyp.scale if isinstance(hyp.scale, (tuple, list)) else (1 - hyp.scale, 1 + hyp.scale))
    return PerspectiveParams(
        persp_x=uniform(generator, n, -p, p, device), persp_y=uniform(generator, n, -p, p, device),
        angle=uniform(generator, n, -d, d, device), scale=uniform(generator, n, lo, hi, device),
        shear_x=uniform(generator, n, -sh, sh, device), shear_y=uniform(generator, n, -sh, sh, device),
        translate_x=uniform(generator, n, 0.5 - t, 0.5 + t, device),
        translate_y=uniform(generator, n, 0.5 - t, 0.5 + t, device))


def perspective_matrix(p: PerspectiveParams, canvas_hw: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Ultralytics' ``_compute_affine_matrix``: ``M = T @ S @ R @ P @ C`` in float32.

    Returns:
        M: (B, 3, 3) float32, canvas pixel -> output pixel. scale: (B,) float32.
    """
    b, dev = canvas_hw.shape[0], canvas_hw.device
    eye = torch.eye(3, dtype=torch.float32, device=dev).repeat(b, 1, 1)
    C, P, R, S, T = (eye.clone() for _ in range(5))
    C[:, 0, 2] = -canvas_hw[:, 1].to(torch.float32) / 2
    C[:, 1, 2] = -canvas_hw[:, 0].to(torch.float32) / 2
    P[:, 2, 0], P[:, 2, 1] = p.persp_x.float(), p.persp_y.float()
    a = p.angle * (math.pi / 180)  # cv2.getRotationMatrix2D, centre (0, 0): computed in float64
    alpha, beta = torch.cos(a) * p.scale, torch.sin(a) * p.scale
    R[:, 0, 0], R[:, 0, 1], R[:, 1, 0], R[:, 1, 1] = alpha.float(), beta.float(), (-beta).float(), alpha.float()
    S[:, 0, 1] = torch.tan(p.shear_x * (math.pi / 180)).float()
    S[:, 1, 0] = torch.tan(p.shear_y * (math.pi / 180)).float()
    T[:, 0, 2] = (p.translate_x * size).float()
    T[:, 1, 2] = (p.translate_y * size).float()
    return matmul3(T, matmul3(S, matmul3(R, matmul3(P, C)))), p.scale.float()


def transform_boxes(boxes: Tensor, M: Tensor, perspective: bool) -> Tensor:
    """Ultralytics' ``apply_bboxes``: the four corners through ``M``, then their bounding box.

    Shape:
        boxes: (B, K, 4) xyxy. M: (B, 3, 3). Returns (B, K, 4).
    """
    x1, y1, x2, y2 = boxes.unbind(-1)
    corners = torch.stack([torch.stack([x1, y1], -1), torch.stack([x2, y2], -1), torch.stack([x1, y2], -1),
                           torch.stack([x2, y1], -1)], -2)  # (B, K, 4, 2)
    xy1 = torch.cat([corners, torch.ones_like(corners[..., :1])], -1)  # (B, K, 4, 3)
    out = xy1 @ M.transpose(1, 2)[:, None]  # (B, K, 4, 3)
    xy = out[..., :2] / out[..., 2:3] if perspective else out[..., :2]
    return torch.cat([xy.amin(-2), xy.amax(-2)], -1)


def box_candidates(before: Tensor, after: Tensor, area_thr: float = BOX_AREA_RATIO, eps: float = 1e-16) -> Tensor:
    """Ultralytics' ``box_candidates``: wide and tall enough, not too thin, enough area kept.

    Shape: before, after: (..., 4) xyxy. Returns (...) bool.
    """
    w1, h1 = before[..., 2] - before[..., 0], before[..., 3] - before[..., 1]
    w2, h2 = after[..., 2] - after[..., 0], after[..., 3] - after[..., 1]
    ar = torch.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > BOX_WH_MIN) & (h2 > BOX_WH_MIN) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (ar < BOX_AR_MAX)


def warp_boxes(boxes: Tensor, valid: Tensor, M: Tensor, scale: Tensor, size: int,
               perspective: bool) -> tuple[Tensor, Tensor]:
    """``RandomPerspective.apply_instances`` for boxes: transform, clip to the output, filter.

    Returns:
        (B, K, 4) xyxy in output pixels, and the updated (B, K) validity.
    """
    new = transform_boxes(boxes, M, perspective).clamp(0, size)
    old = boxes * scale[:, None, None]  # Ultralytics compares against the original box scaled by s
    return new, valid & box_candidates(old, new)


def warp_keypoints(keypoints: Tensor, M: Tensor, size: int) -> Tensor:
    """Ultralytics' ``apply_keypoints`` then ``Instances.clip``: each point through ``M`` with the perspective divide
    (always: by exactly 1 for an affine ``M``), visibility 0 where it left the output, x and y clipped to it.

    Shape: keypoints (B, K, P, 3) canvas pixels and visibility; M (B, 3, 3). Returns (B, K, P, 3) output pixels.
    """
    xy1 = torch.cat([keypoints[..., :2], torch.ones_like(keypoints[..., :1])], -1)  # (B, K, P, 3)
    out = xy1 @ M.transpose(1, 2)[:, None]
    xy = out[..., :2] / out[..., 2:3]
    return clip_keypoints(torch.cat([xy, keypoints[..., 2:3]], -1), size, size)


def warp_segments(labels: Labels, M: Tensor, scale: Tensor, size: int) -> Labels:
    """``RandomPerspective.apply_instances`` with segments (OBB, ``preserve_obb``): each point through ``M`` with the
    perspective divide (always, as ``apply_segments`` does), each box the bounds of its moved points
    (``segment2box`` of a segment inside the output), ``Instances.clip(preserve_obb=True)`` for the others
    (``clip_obb``), then ``box_candidates`` against the old boxes with 1 % of the area.

    Args:
        labels: canvas pixels; segments (B, K, 100, 2). M: (B, 3, 3). scale: (B,) float32.

    Returns:
        the labels in output pixels: boxes, segments and ``valid`` replaced, classes kept.
    """
    seg = labels.segments
    xy1 = torch.cat([seg, torch.ones_like(seg[..., :1])], -1)  # (B, K, 100, 3): 100 points a box, a few matmuls
    out = xy1 @ M.transpose(1, 2)[:, None]
    seg = out[..., :2] / out[..., 2:3]
    boxes, seg = clip_obb(seg, segment_bounds(seg), size, size)
    old = labels.boxes * scale[:, None, None]
    valid = labels.valid & box_candidates(old, boxes, BOX_AREA_RATIO_SEGMENTS)
    return dataclasses.replace(labels, boxes=boxes, valid=valid, segments=seg)


def warp_polygons(labels: Labels, M: Tensor, scale: Tensor, size: int, capacity: int | None = None) -> Labels:
    """``RandomPerspective.apply_instances`` with segmentation polygons: ``apply_segments`` (each point through ``M``
    with the perspective divide, always; each box ``segment2box`` of its moved points, the bounds of their part inside
    the output: ``polygon_boxes``; each point clipped to its box), ``Instances.clip`` to the output, then
    ``box_candidates`` against the old boxes with 1 % of the area.

    Args:
        labels: canvas pixels; polygons (B, K, W, 2). M: (B, 3, 3). scale: (B,) float32.
        capacity: the polygons moved: the valid slots first (row-major), this many of them; the other slots' boxes
            and polygons are zeros, and valid slots past it are dropped and counted in ``polygons_past``. None: every
            slot. The boxes cost a few hundred elementwise passes per polygon point in torch, one Triton program
            per polygon on CUDA; most slots of a
            padded mosaic batch are padding (4 x the pack's most labels an image).

    Returns:
        the labels in output pixels: boxes, polygons and ``valid`` replaced, classes and polygon_points kept;
        ``polygons_past`` () int64 with a capacity below the slots.
    """
    seg = labels.polygons
    b, k, w, _ = seg.shape
    if capacity is None or capacity >= b * k:
        boxes, seg = _move_polygons(seg, M[:, None], size)
        old = labels.boxes * scale[:, None, None]
        valid = labels.valid & box_candidates(old, boxes, BOX_AREA_RATIO_SEGMENTS)
        return dataclasses.replace(labels, boxes=boxes, valid=valid, polygons=seg)
    live = labels.valid.reshape(-1)
    first = (~live).to(torch.uint8).argsort(stable=True)[:capacity]  # the valid slots first, in row order
    row = first // k
    boxes, moved = _move_polygons(seg.reshape(b * k, w, 2).index_select(0, first), M.index_select(0, row), size)
    kept = live.index_select(0, first) & box_candidates(labels.boxes.reshape(b * k, 4).index_select(0, first)
                                                         * scale.index_select(0, row)[:, None], boxes,
                                                         BOX_AREA_RATIO_SEGMENTS)
    valid = torch.zeros_like(live).index_copy_(0, first, kept).view(b, k)
    return dataclasses.replace(
        labels, boxes=boxes.new_zeros((b * k, 4)).index_copy_(0, first, boxes).view(b, k, 4), valid=valid,
        polygons=moved.new_zeros((b * k, w, 2)).index_copy_(0, first, moved).view(b, k, w, 2),
        polygons_past=(live.sum() - capacity).clamp(min=0))


def _move_polygons(seg: Tensor, M: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """``apply_segments`` and ``Instances.clip`` of polygons (..., W, 2) through ``M`` (..., 3, 3) (broadcast over the
    polygons' leading dimensions): their boxes (..., 4) and the moved points (..., W, 2), clipped (``boxes_and_clip``;
    on CUDA ``kernels.polygon_boxes_triton``, the same bits)."""
    # each point through M term by term, (x m0 + y m1) + m2 (as matmul3): the same bits whatever the polygons' layout
    # (bounded or every slot) and device, where a batched matmul's kernel, and its rounding, follows the shapes
    x, y = seg.unbind(-1)
    row = [(x * M[..., j, 0, None] + y * M[..., j, 1, None]) + M[..., j, 2, None] for j in range(3)]
    seg = torch.stack([row[0] / row[2], row[1] / row[2]], -1)  # the perspective divide, always
    if seg.is_cuda:
        try:
            from yolofeed.kernels import polygon_boxes_triton
        except ImportError:  # no Triton: the torch ops, slower but the same
            pass
        else:  # one program a polygon, where the torch ops make a few hundred passes over every point
            return polygon_boxes_triton.boxes_and_clip(seg, size, size)
    return boxes_and_clip(seg, size, size)


class RandomPerspective(GeometricOp):
    """Ultralytics' ``RandomPerspective`` (``degrees``, ``translate``, ``scale``, ``shear``, ``perspective``): always
    on, the identity where they are all 0; ``perspective != 0`` switches to warpPerspective, as Ultralytics does."""

    name, Params = "perspective", PerspectiveParams

    def sample(self, draw: Draw, hyp: AugmentHyp, generator: torch.Generator | None) -> PerspectiveParams:
        return sample_perspective(draw.rows, hyp, generator, draw.device)

    def warp_step(self, plan: WarpPlan, p: PerspectiveParams, hyp: AugmentHyp) -> WarpPlan:
        M, _ = perspective_matrix(p, plan.tiles.canvas_hw, hyp.imgsz)
        return plan.then(M, projective=hyp.perspective != 0)

    def apply_boxes(self, labels: Labels, plan: WarpPlan, p: PerspectiveParams, hyp: AugmentHyp) -> Labels:
        boxes, valid = warp_boxes(labels.boxes, labels.valid, plan.step, p.scale.float(), hyp.imgsz, plan.projective)
        return dataclasses.replace(labels, boxes=boxes, valid=valid)

    def apply_keypoints(self, keypoints: Tensor, plan: WarpPlan, p: PerspectiveParams, hyp: AugmentHyp) -> Tensor:
        return warp_keypoints(keypoints, plan.step, hyp.imgsz)

    def apply_corners(self, labels: Labels, moved: Labels, plan: WarpPlan, p: PerspectiveParams,
                      hyp: AugmentHyp) -> Labels:
        """The segments through the step, and the boxes made from them in place of ``moved``'s (``warp_segments``)."""
        warped = warp_segments(labels, plan.step, p.scale.float(), hyp.imgsz)
        return dataclasses.replace(warped, keypoints=moved.keypoints)

    def apply_polygons(self, labels: Labels, moved: Labels, plan: WarpPlan, p: PerspectiveParams,
                       hyp: AugmentHyp) -> Labels:
        """The polygons through the step, and the boxes made from them in place of ``moved``'s (``warp_polygons``, the
        first ``plan.polygon_capacity`` valid slots)."""
        warped = warp_polygons(labels, plan.step, p.scale.float(), hyp.imgsz, plan.polygon_capacity)
        return dataclasses.replace(warped, keypoints=moved.keypoints, segments=moved.segments)

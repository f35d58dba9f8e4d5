"""What an augmentation op is: its draws apart from their application, and one hook per label kind (kornia's way).

An op ``sample``s its random parameters (a small dataclass of per-row tensors), so a test can replay them through
Ultralytics' CPU op. It applies them inside one of the two fused passes over pixels: a ``GeometricOp`` adds its
step to the warp (mosaic's tiles, a (R, 3, 3) matrix, a flip's reflection), a ``PixelOp`` its term to compose
(MixUp, CutMix, HSV, the BGR swap). ``apply_boxes`` moves the boxes the same way, ``apply_keypoints`` the pose
task's keypoints, ``apply_corners`` the oriented boxes' segments (and the boxes Ultralytics makes of them),
``apply_polygons`` the segmentation polygons (and the boxes and filters Ultralytics applies where they exist).
``augment.pipeline`` lists the ops in Ultralytics' order and fuses them.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from yolofeed.augment.hyp import AugmentHyp
from yolofeed.augment.partners import Partners
from yolofeed.kernels.warp import Tiles


def uniform(generator: torch.Generator | None, shape: tuple[int, ...], low: Tensor | float, high: Tensor | float,
            device: torch.device) -> Tensor:
    """``random.uniform(low, high)`` per element, float64: ``low + (high - low) * U[0, 1)``."""
    u = torch.rand(shape, generator=generator, device=device, dtype=torch.float64)
    return low + (high - low) * u


def coin(generator: torch.Generator | None, batch_size: int, p: float, device: torch.device) -> Tensor:
    """(B,) bool, each True with probability ``p`` (Ultralytics' ``random.uniform(0, 1) <= p`` per image)."""
    return torch.rand(batch_size, generator=generator, device=device) < p


def matmul3(a: Tensor, b: Tensor) -> Tensor:
    """(B, 3, 3) @ (B, 3, 3) in float32 as (a0 b0 + a1 b1) + a2 b2, one rounding per operation.

    Written out so every device computes the same bits (a BLAS call may fuse or reorder, and the warp
    reproduces OpenCV exactly only from an identical matrix).
    """
    t = a[:, :, :, None] * b[:, None, :, :]  # (B, i, k, j) products
    return (t[:, :, 0] + t[:, :, 1]) + t[:, :, 2]


@dataclass
class Draw:
    """What an op draws for.

    Attributes:
        rows: how many rows: every augmented row for a geometric op (the B samples, then B more per mixing op
            that is on), the B samples for a pixel op.
        partners: where each of those rows takes its source images from (the mosaic's tiles).
        partner: a mixing op's (B,) int64 partner rows among the augmented rows; None for the other ops.
    """

    rows: int
    device: torch.device
    partners: Partners
    partner: Tensor | None = None


def clip_keypoints(kp: Tensor, w: Tensor | float, h: Tensor | float) -> Tensor:
    """Ultralytics' ``Instances.clip`` for keypoints: visibility 0 where a point lies outside [0, w] x [0, h], then
    x and y clipped to it.

    Shape: kp (..., P, 3) pixel x, y, visibility; w, h: numbers, or tensors broadcastable to kp[..., 0].
    """
    x, y, v = kp.unbind(-1)
    out = (x < 0) | (x > w) | (y < 0) | (y > h)
    x, y = (c.clamp(min=0).minimum(hi) if isinstance(hi, Tensor) else c.clamp(0, hi) for c, hi in ((x, w), (y, h)))
    return torch.stack([x, y, v.masked_fill(out, 0)], -1)


@dataclass
class Labels:
    """The labels of each row, padded: the stored normalised xywh boxes before the mosaic, pixel xyxy after.

    Shape: cls (R, K) float32; boxes (R, K, 4) float32; valid (R, K) bool; keypoints (R, K, P, 3) float32 x, y
    (normalised before the mosaic, pixels after) and visibility, or None (detection); segments (R, K, 100, 2)
    float32 x, y of each oriented box (its 4 corners resampled as Ultralytics does, ``geometry.obb``; normalised
    before the mosaic, pixels after), or None. polygons (R, K, W, 2) float32 x, y of each segmentation polygon,
    resampled as Ultralytics' dataset resamples them (``geometry.polygons.source_polygons``; normalised before the
    mosaic, pixels after), or None; polygon_points (R,) int64 how many of the W points are row r's own, where rows
    may differ (a stored polygon of more than 1,000 points; the rest repeat its last point), None where every row has
    W = 1,000; polygons_past () int64, the valid slots the perspective's bound on the polygons it moves left out
    (``WarpPlan.polygon_capacity``), or None where there was none.
    """

    cls: Tensor
    boxes: Tensor
    valid: Tensor
    keypoints: Tensor | None = None
    segments: Tensor | None = None
    polygons: Tensor | None = None
    polygon_points: Tensor | None = None
    polygons_past: Tensor | None = None


@dataclass
class WarpPlan:
    """The warp pass as the geometric ops build it, one after another: the inputs of ``augment.warp.warp``.

    Shape: hw (N, 2) int64 stored sizes of the source images; tiles: the mosaic's ``Layout`` of the R rows;
    matrix (R, 3, 3) float32 canvas -> output, the product of the ops' matrices; step: the latest op's own
    matrix, which its label hooks move labels by; ud, lr (R,) bool reflections of the output (the flips); paste
    (R, H, W) bool, where a canvas pixel is its mirror's (copy-paste), and paste_lost () int64, the copies it left
    out for want of capacity plus the rasterisation events its fill dropped for want of slots; paste_capacity and
    paste_room: copy-paste's bound on the copies a batch pastes (None: every slot) and its fill's event slots, in
    multiples of its default; polygon_capacity: the perspective's bound on the polygons it moves, the valid slots
    first (None: every slot) (``GpuAugment``'s).
    """

    size: int
    hw: Tensor
    tiles: Tiles | None = None
    matrix: Tensor | None = None
    step: Tensor | None = None
    projective: bool = False  # a matrix has a perspective row: warpPerspective instead of warpAffine
    ud: Tensor | None = None
    lr: Tensor | None = None
    paste: Tensor | None = None
    paste_lost: Tensor | None = None
    paste_capacity: int | None = None
    paste_room: int = 1
    polygon_capacity: int | None = None

    def then(self, M: Tensor, projective: bool) -> WarpPlan:
        """This plan followed by matrix ``M`` (canvas pixels of the plan's output -> output pixels)."""
        if self.ud is not None or self.lr is not None:  # the kernel reflects its final output index
            raise ValueError("a matrix after a flip: the warp reflects the output last, so flips are the last "
                             "geometric ops (augment.pipeline.OPS)")
        matrix = M if self.matrix is None else matmul3(M, self.matrix)
        return dataclasses.replace(self, matrix=matrix, step=M, projective=self.projective or projective)


class Op(ABC):
    """One augmentation: ``sample`` its draws, then apply them through the hooks of its kind.

    Attributes:
        name: its field of ``AugmentParams``, named after its Ultralytics key.
        Params: what ``sample`` returns: a dataclass of per-row tensors, or one tensor.
        takes_images: it reads source images besides the row's own (mosaic tiles, mix partners); where no op
            that is on does, ``GpuAugment`` needs no partner pool.
        mixes: it blends one more augmented row into each sample (MixUp, CutMix): where it is on, the warp
            makes B rows more, and its ``Draw.partner`` names them.
    """

    name: str
    Params: type
    takes_images = False
    mixes = False
    # The hooks for the label kinds detection does not carry (kornia's apply_transform_keypoint, _mask): None until
    # a task writes them, op by op; GpuAugment refuses a batch of a kind some op has None for (pipeline.CARRIED).
    # Every op of OPS moves keypoints (apply_keypoints), OBB's corners (apply_corners) and polygons (apply_polygons).
    apply_keypoints = None
    apply_corners = None
    apply_polygons = None

    def on(self, hyp: AugmentHyp) -> bool:
        """Whether its setting lets it change anything; its draws are made either way, so their order is fixed."""
        return True

    @abstractmethod
    def sample(self, draw: Draw, hyp: AugmentHyp, generator: torch.Generator | None) -> Any:
        """Its random draws for ``draw.rows`` rows on ``draw.device``, from ``generator``."""


class GeometricOp(Op):
    """An op that moves pixels: a step of the warp pass, which samples each output pixel once through all of them."""

    @abstractmethod
    def warp_step(self, plan: WarpPlan, p: Any, hyp: AugmentHyp) -> WarpPlan:
        """The plan with this op's step: the mosaic's tiles, a matrix (``plan.then``) or a reflection."""

    @abstractmethod
    def apply_boxes(self, labels: Labels, plan: WarpPlan, p: Any, hyp: AugmentHyp) -> Labels:
        """The labels moved by this op's step (``plan`` as ``warp_step`` returned it)."""

    def paste_step(self, plan: WarpPlan, labels: Labels, hyp: AugmentHyp) -> WarpPlan:
        """The plan once this op's labels are moved (``labels``, every hook's): for a step that depends on them
        (copy-paste's mask). Unchanged by default."""
        return plan

    # apply_keypoints(keypoints, plan, p, hyp) -> Tensor: the keypoints moved by this step, row-aligned with the
    # boxes ``apply_boxes`` returns (they share its ``valid``). Called only where the batch carries keypoints.
    # apply_corners(labels, moved, plan, p, hyp) -> Labels: ``moved`` (what apply_boxes made of ``labels``) with the
    # segments moved by this step, and with the boxes and ``valid`` Ultralytics makes where segments exist (it derives
    # the boxes from them and filters by its OBB rules). Called only where the batch carries oriented boxes.
    # apply_polygons(labels, moved, plan, p, hyp) -> Labels: the same for segmentation: ``moved`` with the polygons
    # (and polygon_points) moved by this step, and the boxes and ``valid`` Ultralytics makes where segments exist.
    # Called only where the batch carries polygons.


class PixelOp(Op):
    """An op that changes pixel values where they are: a term of the compose pass, one elementwise pass for all.

    Attributes:
        term: its argument of ``augment.pipeline.compose``; a new term is new arithmetic in ``kernels/compose.py``
            and ``compose_triton.py``.
    """

    term: str

    @abstractmethod
    def compose_term(self, p: Any, labels: Labels, rows: Labels, hyp: AugmentHyp) -> Any:
        """What compose reads of this op, or None where it is off.

        Args:
            labels: the samples' labels so far (B rows). rows: every augmented row's own labels, partners included.
        """

    def apply_boxes(self, labels: Labels, rows: Labels, term: Any) -> Labels:
        """The samples' labels after this op (``term`` as ``compose_term`` returned it): unchanged by default."""
        return labels

    def apply_keypoints(self, keypoints: Tensor, rows: Labels, term: Any) -> Tensor:
        """The samples' (B, K, P, 3) keypoints after this op, row-aligned with ``apply_boxes``' labels: unchanged by
        default (a mixing op adds its partner's). Called only where the batch carries keypoints."""
        return keypoints

    def apply_corners(self, labels: Labels, moved: Labels, rows: Labels, term: Any) -> Labels:
        """``moved`` (``apply_boxes``' labels) with the samples' (B, K, 100, 2) segments after this op, and the boxes
        and ``valid`` Ultralytics makes where segments exist: the segments unchanged by default (a mixing op adds its
        partner's). Called only where the batch carries oriented boxes.

        Args:
            labels: the samples' labels before this op, segments included.
        """
        return dataclasses.replace(moved, segments=labels.segments)

    def apply_polygons(self, labels: Labels, moved: Labels, rows: Labels, term: Any) -> Labels:
        """``moved`` (``apply_boxes``' labels) with the samples' (B, K, W, 2) polygons after this op: unchanged by
        default (a mixing op adds its partner's). Called only where the batch carries polygons.

        Args:
            labels: the samples' labels before this op, polygons included.
        """
        return dataclasses.replace(moved, polygons=labels.polygons, polygon_points=labels.polygon_points)

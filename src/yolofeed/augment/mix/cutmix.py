"""Ultralytics' ``CutMix``: a rectangle of a partner pasted into each sample where it covers none of its boxes.

As MixUp, the partner is one more augmented row per sample (``Partners.mix_partner``). ``plan_cutmix`` is
``CutMix.get_params`` + ``apply_instances`` for every sample at once: the area and the partner boxes it takes
(their keypoints clipped to the area, invisible outside it: ``cutmix_keypoints``; oriented boxes by Ultralytics' OBB
clip, those left with no area dropped: ``cutmix_segments``; segmentation polygons point by point:
``cutmix_polygons``); the paste is a term of the compose pass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from yolofeed.augment.geometry.obb import box_area, clip_obb
from yolofeed.augment.hyp import AugmentHyp
from yolofeed.augment.mix.mixup import concatenate
from yolofeed.augment.op import Draw, Labels, PixelOp, clip_keypoints, coin

CUTMIX_AREAS = 3  # Ultralytics' num_areas: candidate cut regions per image
CUTMIX_IOA = 0.10  # a partner box is taken if at least 10 % of it lies in the cut region
CUTMIX_IOA_SEGMENTS = 0.01  # ... 1 % where the sample has segments (an OBB sample with at least one box)


@dataclass
class CutMixParams:
    """Shape: apply (B,) bool; lam (B, 3) float64 ~ Beta(1, 1); centre (B, 3, 2) float64 in [0, 1);
    pick (B, 3) float64 scores that choose among usable areas; partner (B,) int64 rows of the augmented images."""

    apply: Tensor
    lam: Tensor
    centre: Tensor
    pick: Tensor
    partner: Tensor


def sample_cutmix(partner: Tensor, hyp: AugmentHyp, generator: torch.Generator | None) -> CutMixParams:
    """Draw CutMix for each sample; ``partner`` (B,) are the augmented rows they paste from."""
    batch_size, device = len(partner), partner.device
    apply = coin(generator, batch_size, hyp.cutmix, device)
    shape = (batch_size, CUTMIX_AREAS)
    lam = torch.rand(shape, generator=generator, device=device, dtype=torch.float64)  # Beta(1, 1) is uniform
    centre = torch.rand((*shape, 2), generator=generator, device=device, dtype=torch.float64)
    pick = torch.rand(shape, generator=generator, device=device, dtype=torch.float64)
    return CutMixParams(apply, lam, centre, pick, partner)


def cutmix_areas(p: CutMixParams, size: int) -> Tensor:
    """Ultralytics' ``_rand_bbox`` for each candidate: (B, 3, 4) float32 x1, y1, x2, y2 (integers)."""
    cut = torch.floor(size * torch.sqrt(1.0 - p.lam)).long()  # int(w * sqrt(1 - lam))
    c = torch.floor(p.centre * size).long()  # np.random.randint(w)
    half = (cut // 2)[..., None]
    lo, hi = (c - half).clamp(0, size), (c + half).clamp(0, size)
    return torch.stack([lo[..., 0], lo[..., 1], hi[..., 0], hi[..., 1]], -1).float()


def ioa(a: Tensor, b: Tensor, eps: float = 1e-7) -> Tensor:
    """Intersection over the area of ``b`` (Ultralytics' ``bbox_ioa``).

    Shape: a (..., A, 4), b (..., K, 4) -> (..., A, K).
    """
    lt = torch.maximum(a[..., :, None, :2], b[..., None, :, :2])
    rb = torch.minimum(a[..., :, None, 2:], b[..., None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    return inter / (area[..., None, :] + eps)


@dataclass
class CutMixPlan:
    """What CutMix does to each sample once the boxes are known.

    Shape: apply (B,) bool (False also where no area was free of boxes or no partner box fits);
    area (B, 4) int64; take (B, K) bool partner boxes to paste; boxes (B, K, 4) partner boxes clipped to the area.
    """

    apply: Tensor
    area: Tensor
    take: Tensor
    boxes: Tensor
    partner: Tensor


def plan_cutmix(p: CutMixParams, boxes: Tensor, valid: Tensor, partner_boxes: Tensor, partner_valid: Tensor,
                size: int, segments: bool = False) -> CutMixPlan:
    """``CutMix.get_params`` + ``apply_instances`` for every sample at once.

    Args:
        boxes, valid: the sample's boxes (after MixUp), (B, K, 4) xyxy pixels and (B, K).
        partner_boxes, partner_valid: every augmented row's own boxes before mixing, (R, K2, 4) and (R, K2).
        segments: the labels carry segments (OBB, segment): a partner box is taken from 1 % of it in the area where
            the sample has any box (``len(labels["instances"].segments)``), from 10 % where it has none.
    """
    areas = cutmix_areas(p, size)  # (B, 3, 4)
    overlap = (ioa(areas, boxes) * valid[:, None, :]).sum(-1)  # (B, 3)
    free = overlap <= 0
    score = torch.where(free, p.pick, torch.full_like(p.pick, -1.0))
    area = torch.gather(areas, 1, score.argmax(1)[:, None, None].expand(-1, 1, 4))[:, 0]  # a uniform free area
    pb, pv = partner_boxes[p.partner], partner_valid[p.partner]
    least = torch.where(valid.any(1), CUTMIX_IOA_SEGMENTS, CUTMIX_IOA)[:, None] if segments else CUTMIX_IOA
    take = pv & (ioa(area[:, None], pb)[:, 0] >= least)
    apply = p.apply & free.any(1) & take.any(1)
    a = area.long()
    x1, y1, x2, y2 = (a[:, j, None].to(pb.dtype) for j in range(4))
    clipped = torch.stack([(pb[..., 0] - x1).clamp(0, None).minimum(x2 - x1) + x1,
                           (pb[..., 1] - y1).clamp(0, None).minimum(y2 - y1) + y1,
                           (pb[..., 2] - x1).clamp(0, None).minimum(x2 - x1) + x1,
                           (pb[..., 3] - y1).clamp(0, None).minimum(y2 - y1) + y1], -1)
    return CutMixPlan(apply, a, take & apply[:, None], clipped, p.partner)


def cutmix_keypoints(plan: CutMixPlan, partner_keypoints: Tensor) -> Tensor:
    """``CutMix.apply_instances`` for keypoints: the partner's, moved to the area's corner, clipped to the area
    (visibility 0 outside it), moved back, as Ultralytics does around ``Instances.clip``.

    Args:
        partner_keypoints: every augmented row's own (R, K2, P, 3) pixel keypoints before mixing.

    Returns:
        (B, K2, P, 3), row-aligned with ``plan.boxes`` (``plan.take`` says which are pasted).
    """
    kp = partner_keypoints[plan.partner]
    x1, y1, x2, y2 = (plan.area[:, j, None, None].to(kp.dtype) for j in range(4))
    local = torch.stack([kp[..., 0] - x1, kp[..., 1] - y1, kp[..., 2]], -1)  # add_padding(-x1, -y1)
    x, y, v = clip_keypoints(local, x2 - x1, y2 - y1).unbind(-1)
    return torch.stack([x + x1, y + y1, v], -1)


def cutmix_segments(plan: CutMixPlan, rows: Labels) -> tuple[Tensor, Tensor, Tensor]:
    """``CutMix.apply_instances`` for oriented boxes (``preserve_obb``): the partner's segments and boxes moved to the
    area's corner, ``Instances.clip`` to the area as the OBB clip does (``clip_obb``: one inside it stays as it is),
    ``remove_zero_area_boxes``, moved back.

    Args:
        rows: every augmented row's own labels before mixing: boxes (R, K2, 4), segments (R, K2, 100, 2) pixels.

    Returns:
        boxes (B, K2, 4), segments (B, K2, 100, 2) and the (B, K2) taken (``plan.take`` less those left no area).
    """
    seg, pb = rows.segments[plan.partner], rows.boxes[plan.partner]
    x1, y1, x2, y2 = (plan.area[:, j, None].to(seg.dtype) for j in range(4))
    xy = torch.stack([x1, y1], -1)[:, :, None]  # (B, 1, 1, 2)
    boxes, local = clip_obb(seg - xy, pb - torch.cat([xy, xy], -1)[:, :, 0], x2 - x1, y2 - y1)  # add_padding(-x1, -y1)
    take = plan.take & (box_area(boxes) > 0)
    return boxes + torch.cat([xy, xy], -1)[:, :, 0], local + xy, take


def cutmix_polygons(plan: CutMixPlan, rows: Labels) -> Tensor:
    """``CutMix.apply_instances`` for segmentation polygons: the partner's, moved to the area's corner, each point
    clipped to the area (``Instances.clip``), moved back.

    Args:
        rows: every augmented row's own labels before mixing, polygons (R, K2, W, 2) pixels.

    Returns:
        (B, K2, W, 2), row-aligned with ``plan.boxes`` (``plan.take`` says which are pasted).
    """
    seg = rows.polygons[plan.partner]
    x1, y1, x2, y2 = (plan.area[:, j, None, None].to(seg.dtype) for j in range(4))
    x = (seg[..., 0] - x1).clamp(min=0).minimum(x2 - x1) + x1  # add_padding(-x1, -y1), clip, add_padding(x1, y1)
    y = (seg[..., 1] - y1).clamp(min=0).minimum(y2 - y1) + y1
    return torch.stack([x, y], -1)


class CutMix(PixelOp):
    """Ultralytics' ``CutMix`` with probability ``cutmix``."""

    name, Params, term, takes_images, mixes = "cutmix", CutMixParams, "cut", True, True

    def on(self, hyp: AugmentHyp) -> bool:
        return hyp.cutmix > 0

    def sample(self, draw: Draw, hyp: AugmentHyp, generator: torch.Generator | None) -> CutMixParams:
        return sample_cutmix(draw.partner, hyp, generator)

    def compose_term(self, p: CutMixParams, labels: Labels, rows: Labels, hyp: AugmentHyp) -> CutMixPlan | None:
        if not self.on(hyp):
            return None
        segments = labels.segments is not None or labels.polygons is not None  # OBB or segment: from 1 %
        return plan_cutmix(p, labels.boxes, labels.valid, rows.boxes, rows.valid, hyp.imgsz, segments=segments)

    def apply_boxes(self, labels: Labels, rows: Labels, term: CutMixPlan | None) -> Labels:
        """The partner's boxes in the pasted area, clipped to it, after the sample's."""
        if term is None:
            return labels
        return dataclasses.replace(labels, cls=torch.cat([labels.cls, rows.cls[term.partner]], 1),
                                   boxes=torch.cat([labels.boxes, term.boxes], 1),
                                   valid=torch.cat([labels.valid, term.take], 1))

    def apply_keypoints(self, keypoints: Tensor, rows: Labels, term: CutMixPlan | None) -> Tensor:
        """The partner's keypoints in the pasted area, after the sample's, in its boxes' slots."""
        return keypoints if term is None else torch.cat([keypoints, cutmix_keypoints(term, rows.keypoints)], 1)

    def apply_corners(self, labels: Labels, moved: Labels, rows: Labels, term: CutMixPlan | None) -> Labels:
        """The partner's oriented boxes in the pasted area, after the sample's: their segments, and the boxes and
        ``valid`` of Ultralytics' OBB clip in place of ``moved``'s clipped boxes."""
        if term is None:
            return dataclasses.replace(moved, segments=labels.segments)
        boxes, seg, take = cutmix_segments(term, rows)
        return dataclasses.replace(moved, boxes=torch.cat([labels.boxes, boxes], 1),
                                   valid=torch.cat([labels.valid, take], 1),
                                   segments=torch.cat([labels.segments, seg], 1))

    def apply_polygons(self, labels: Labels, moved: Labels, rows: Labels, term: CutMixPlan | None) -> Labels:
        """The partner's polygons in the pasted area, clipped to it, after the sample's (``Instances.concatenate``:
        resampled to the more points where the two differ), in its boxes' slots."""
        if term is None:
            return dataclasses.replace(moved, polygons=labels.polygons, polygon_points=labels.polygon_points)
        return dataclasses.replace(moved, **concatenate(labels, rows, term.partner, term.apply,
                                                        cutmix_polygons(term, rows)))

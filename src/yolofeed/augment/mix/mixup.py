"""Ultralytics' ``MixUp``: each sample blended with a partner, ``r * sample + (1 - r) * partner``, r ~ Beta(32, 32).

The partner is a fresh mosaic + perspective of one more image, as in Ultralytics: the pipeline augments one
extra row per sample for it (``Partners.mix_partner``) and ``partner`` names that row. The blend is a term of
the compose pass; the partner's boxes (and keypoints, or oriented boxes' segments) join the sample's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from yolofeed.augment.geometry.polygons import to_longest
from yolofeed.augment.hyp import AugmentHyp
from yolofeed.augment.op import Draw, Labels, PixelOp, coin

MIXUP_BETA = 32.0  # Ultralytics: r ~ Beta(32, 32)


def _beta_symmetric(a: int, shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    """Beta(a, a) for integer a as X / (X + Y), X, Y ~ Gamma(a) = sums of a exponentials: exact, and seedable
    on any device (torch's Beta sampler takes no generator)."""
    u = torch.rand((*shape, 2, a), generator=generator, device=device, dtype=torch.float64)
    g = -torch.log1p(-u).sum(-1)  # log1p(-u): u in [0, 1) never gives log(0)
    return g[..., 0] / (g[..., 0] + g[..., 1])


@dataclass
class MixUpParams:
    """Shape: apply (B,) bool; ratio (B,) float64; partner (B,) int64 rows of the augmented images."""

    apply: Tensor
    ratio: Tensor
    partner: Tensor


def sample_mixup(partner: Tensor, hyp: AugmentHyp, generator: torch.Generator | None) -> MixUpParams:
    """Draw MixUp for each sample; ``partner`` (B,) are the augmented rows they blend with."""
    batch_size, device = len(partner), partner.device
    apply = coin(generator, batch_size, hyp.mixup, device)
    ratio = _beta_symmetric(int(MIXUP_BETA), (batch_size,), generator, device)
    return MixUpParams(apply, ratio, partner)


def concatenate(labels: Labels, rows: Labels, partner: Tensor, mixed: Tensor,
                partner_polygons: Tensor | None = None) -> dict[str, Tensor | None]:
    """``Instances.concatenate([sample, partner])`` of segmentation polygons: the partner row's after the sample's;
    where the two rows differ in points (``polygon_points``; a stored polygon of more than 1,000), both resampled to
    the more, on the rows that mix (``mixed``).

    Args:
        labels: the samples' labels (B rows). rows: every augmented row's. partner: (B,) int64 rows of ``rows``.
        partner_polygons: (B, K2, W, 2) the partner's polygons as taken (CutMix clips them); default its own.

    Returns:
        the fields ``polygons`` (B, K + K2, W, 2) and ``polygon_points`` (B,) or None.
    """
    theirs = rows.polygons[partner] if partner_polygons is None else partner_polygons
    points = labels.polygon_points
    if points is None:  # every row 1,000 points: a concatenation, nothing resampled
        return {"polygons": torch.cat([labels.polygons, theirs], 1), "polygon_points": None}
    other = rows.polygon_points[partner]
    n = torch.where(mixed, torch.maximum(points, other), points)
    ours = to_longest(labels.polygons, points[:, None].expand(labels.polygons.shape[:2]), n)
    theirs = to_longest(theirs, other[:, None].expand(theirs.shape[:2]), n)  # a row that does not mix: unread
    return {"polygons": torch.cat([ours, theirs], 1), "polygon_points": n}


class MixUp(PixelOp):
    """Ultralytics' ``MixUp`` with probability ``mixup``."""

    name, Params, term, takes_images, mixes = "mixup", MixUpParams, "mixup", True, True

    def on(self, hyp: AugmentHyp) -> bool:
        return hyp.mixup > 0

    def sample(self, draw: Draw, hyp: AugmentHyp, generator: torch.Generator | None) -> MixUpParams:
        return sample_mixup(draw.partner, hyp, generator)

    def compose_term(self, p: MixUpParams, labels: Labels, rows: Labels, hyp: AugmentHyp) -> MixUpParams | None:
        return p if self.on(hyp) else None

    def apply_boxes(self, labels: Labels, rows: Labels, term: MixUpParams | None) -> Labels:
        """The partner's boxes after the sample's, kept where the sample mixes."""
        if term is None:
            return labels
        j = term.partner
        return dataclasses.replace(labels, cls=torch.cat([labels.cls, rows.cls[j]], 1),
                                   boxes=torch.cat([labels.boxes, rows.boxes[j]], 1),
                                   valid=torch.cat([labels.valid, rows.valid[j] & term.apply[:, None]], 1))

    def apply_keypoints(self, keypoints: Tensor, rows: Labels, term: MixUpParams | None) -> Tensor:
        """The partner's keypoints after the sample's (``Instances.concatenate``), in its boxes' slots."""
        return keypoints if term is None else torch.cat([keypoints, rows.keypoints[term.partner]], 1)

    def apply_corners(self, labels: Labels, moved: Labels, rows: Labels, term: MixUpParams | None) -> Labels:
        """The partner's segments after the sample's (``Instances.concatenate``), in its boxes' slots."""
        seg = labels.segments if term is None else torch.cat([labels.segments, rows.segments[term.partner]], 1)
        return dataclasses.replace(moved, segments=seg)

    def apply_polygons(self, labels: Labels, moved: Labels, rows: Labels, term: MixUpParams | None) -> Labels:
        """The partner's polygons after the sample's (``Instances.concatenate``: where the two differ in points, each
        resampled to the more), in its boxes' slots."""
        if term is None:
            return dataclasses.replace(moved, polygons=labels.polygons, polygon_points=labels.polygon_points)
        return dataclasses.replace(moved, **concatenate(labels, rows, term.partner, term.apply))

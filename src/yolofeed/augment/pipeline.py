"""The whole training augmentation on a GPU batch, in Ultralytics' order.

    mosaic (4 or 9) -> random perspective -> MixUp -> CutMix -> HSV -> flip up-down -> flip left-right -> Format

Two passes over pixels: ``warp`` (mosaic placement, perspective and flips in one sampling pass),
then ``compose`` (MixUp, CutMix, HSV and the BGR swap, one elementwise pass). Boxes stay in padded
(B, K, 4) tensors with a validity mask until ``AugmentedBatch.to_ultralytics`` packs them into
Ultralytics' collated form.

Partners come from the source images (``Partners``): the batch itself, or a ``PartnerPool`` of the
images loaded lately, as Ultralytics' buffer. MixUp and CutMix each blend in one more augmented row
per sample (a fresh mosaic of one more image, as in Ultralytics), so with both on the warp samples 3B
images. Flips are applied before mixing (each row its own), which changes nothing a detector can see:
in Ultralytics a mixed pair shares one flip draw, here each half has its own; each half's flip is
still a fair Bernoulli(fliplr) draw independent of its content.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from yolofeed.augment.pool import PartnerPool

from yolofeed.augment import color, geometry, mix
from yolofeed.augment.hyp import AugmentHyp
from yolofeed.augment.op import coin
from yolofeed.augment.partners import Partners
from yolofeed.augment.warp import warp
from yolofeed.kernels.compose import compose_reference
from yolofeed.schema import AugmentedBatch, SourceBatch


@dataclass
class AugmentParams:
    """Every random draw of one batch; replayable.

    The geometric draws (mosaic, perspective, flips) have one row per augmented image: the B samples,
    then B MixUp partners (if MixUp is on), then B CutMix partners (if CutMix is on). The rest have B rows.
    """

    mosaic: geometry.MosaicParams
    perspective: geometry.PerspectiveParams
    flips: geometry.FlipParams
    mixup: mix.MixUpParams
    cutmix: mix.CutMixParams
    hsv: color.HSVParams
    bgr: Tensor  # (B,) bool: output BGR instead of RGB (Ultralytics' ``bgr`` probability)

    @property
    def size(self) -> int:
        """B, the samples in the batch."""
        return len(self.bgr)


def compose(warped: Tensor, mixup: mix.MixUpParams | None, cut: mix.CutMixPlan | None, luts: Tensor | None,
            bgr: Tensor | None, rows: int | None = None) -> Tensor:
    """MixUp, CutMix, HSV and the BGR swap per pixel of the first ``rows`` rows (default all), in Ultralytics'
    order; partners are any rows of ``warped``. A Triton kernel on CUDA, ``compose_reference`` elsewhere."""
    rows = len(warped) if rows is None else rows
    if warped.is_cuda:
        try:
            from yolofeed.kernels import compose_triton
        except ImportError:  # no Triton: the torch reference, slower but the same
            pass
        else:
            return compose_triton.compose(warped, mixup, cut, luts, bgr, rows)
    return compose_reference(warped, mixup, cut, luts, bgr, rows)


@dataclass
class Geometry:
    """Every augmented row after mosaic, perspective and flips, before mixing.

    Shape: img (R, 3, S, S) uint8; cls (R, K) float32; boxes (R, K, 4) float32 xyxy pixels; valid (R, K) bool.
    R = B samples, then their MixUp partners, then their CutMix partners (``AugmentParams``).
    """

    img: Tensor
    cls: Tensor
    boxes: Tensor
    valid: Tensor


class GpuAugment:
    """Ultralytics' detection training augmentation (``v8_transforms``), batched on the batch's device.

    Example:
        >>> aug = GpuAugment(AugmentHyp.from_args(trainer.args))
        >>> out = aug(source_batch, generator)  # AugmentedBatch; partners from the batch itself
        >>> out = aug(source_batch, generator, pool=pool)  # partners from the images loaded lately (PartnerPool)
        >>> batch = out.to_ultralytics()  # what DetectionTrainer's loss consumes
    """

    def __init__(self, hyp: AugmentHyp):
        self.hyp = hyp

    @property
    def mixers(self) -> int:
        """Extra augmented rows per sample: one for MixUp, one for CutMix, where they are on."""
        return int(self.hyp.mixup > 0) + int(self.hyp.cutmix > 0)

    @property
    def needs_partners(self) -> bool:
        """Whether any draw takes other images (mosaic, MixUp, CutMix); else a partner pool is not needed."""
        return self.hyp.mosaic > 0 or self.mixers > 0

    def sample(self, batch_size: int, generator: torch.Generator | None = None,
               device: torch.device | str = "cpu", partners: Partners | None = None) -> AugmentParams:
        """Draw every random parameter of a batch (on ``device``, from ``generator``).

        Args:
            partners: where each sample's own image and its partners are among the source images;
                default: the batch itself (``Partners.within_batch``).
        """
        h, dev = self.hyp, torch.device(device)
        if partners is None:
            partners = Partners.within_batch(batch_size, dev)
        rows = [partners] + [partners.mix_partner(generator) for _ in range(self.mixers)]
        every = Partners.cat(rows) if len(rows) > 1 else partners
        n = len(every.own)
        blocks = iter(torch.arange(batch_size, n, device=dev).reshape(-1, batch_size))  # each mixer's partner rows
        off = torch.zeros(batch_size, dtype=torch.long, device=dev)  # an op that is off: never read
        return AugmentParams(
            mosaic=geometry.sample_mosaic(every, h, generator),
            perspective=geometry.sample_perspective(n, h, generator, dev),
            flips=geometry.FlipParams(coin(generator, n, h.flipud, dev), coin(generator, n, h.fliplr, dev)),
            mixup=mix.sample_mixup(next(blocks) if h.mixup > 0 else off, h, generator),
            cutmix=mix.sample_cutmix(next(blocks) if h.cutmix > 0 else off, h, generator),
            hsv=color.sample_hsv(batch_size, h, generator, dev),
            bgr=coin(generator, batch_size, h.bgr, dev))

    def geometry(self, sources: SourceBatch, p: AugmentParams) -> Geometry:
        """Mosaic, perspective and flips of every augmented row: one warp pass, boxes through the same matrices."""
        s = self.hyp.imgsz
        persp = self.hyp.perspective != 0  # Ultralytics switches warpAffine -> warpPerspective on the setting
        layout = geometry.mosaic_layout(p.mosaic, sources.hw, s)
        boxes, valid = geometry.mosaic_boxes(layout, sources.boxes, sources.valid, sources.hw)
        cls = sources.cls[layout.src].reshape(len(layout.src), -1)
        M, scale = geometry.perspective_matrix(p.perspective, layout.canvas_hw, s)
        img = warp(sources.images, layout, M, p.flips, s, persp)
        boxes, valid = geometry.warp_boxes(boxes, valid, M, scale, s, persp)
        return Geometry(img, cls, geometry.flip_boxes(boxes, p.flips, s), valid)

    def apply(self, sources: SourceBatch, p: AugmentParams) -> AugmentedBatch:
        """Apply drawn parameters: pure, so a test can replay them through Ultralytics.

        Args:
            sources: the images ``p`` indexes: the batch, or the pool's ring it was pushed into.
        """
        h, s, b = self.hyp, self.hyp.imgsz, p.size
        g = self.geometry(sources, p)
        boxes, valid, cls = g.boxes[:b], g.valid[:b], g.cls[:b]
        mixup = p.mixup if h.mixup > 0 else None
        if mixup is not None:
            j = mixup.partner
            boxes = torch.cat([boxes, g.boxes[j]], 1)
            valid = torch.cat([valid, g.valid[j] & mixup.apply[:, None]], 1)
            cls = torch.cat([cls, g.cls[j]], 1)
        cut = None
        if h.cutmix > 0:
            cut = mix.plan_cutmix(p.cutmix, boxes, valid, g.boxes, g.valid, s)
            boxes = torch.cat([boxes, cut.boxes], 1)
            valid = torch.cat([valid, cut.take], 1)
            cls = torch.cat([cls, g.cls[cut.partner]], 1)
        luts = color.hsv_luts(p.hsv) if p.hsv.enabled else None
        img = compose(g.img, mixup, cut, luts, p.bgr if h.bgr > 0 else None, b)
        return AugmentedBatch(img, cls, boxes, valid)

    def __call__(self, batch: SourceBatch, generator: torch.Generator | None = None,
                 pool: PartnerPool | None = None) -> AugmentedBatch:
        """Augment a loaded batch; with ``pool``, push it there first and draw partners from the pool."""
        batch.require_detection("GpuAugment")
        n, dev = batch.images.shape[0], batch.images.device
        if pool is None or not self.needs_partners:
            return self.apply(batch, self.sample(n, generator, dev))
        first = pool.push(batch)
        return self.apply(pool.sources, self.sample(n, generator, dev, pool.partners(first, n)))

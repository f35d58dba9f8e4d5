"""The whole training augmentation on a GPU batch: Ultralytics' ops in its order, fused into two passes over pixels.

    mosaic (4 or 9) -> copy-paste (flip mode) -> random perspective -> MixUp -> CutMix -> HSV -> flip up-down
    -> flip left-right -> Format

``OPS`` is that list, one op per file (``geometry/``, ``mix/``, ``color/``; ``op.py`` says what an op is). The fusion
plan maps each op onto one pass: ``warp`` (the geometric ops: mosaic placement, copy-paste's mirrored pixels,
perspective and flips, one sampling pass through the product of their steps), then ``compose`` (the pixel ops: MixUp,
CutMix, HSV and the BGR swap, one elementwise pass). Boxes stay in padded (B, K, 4) tensors with a validity mask until
``AugmentedBatch.to_ultralytics`` packs them into Ultralytics' collated form; the pose task's keypoints ride in (B, K,
P, 3) beside them, each op's ``apply_keypoints`` after its ``apply_boxes``, sharing their ``valid``. OBB's corners
enter as Ultralytics' 100-point segments (``geometry.obb.resample_corners``, once, on the source rows) and ride in (R,
K, 100, 2), each op's ``apply_corners`` after its ``apply_boxes``: where segments exist Ultralytics makes the boxes
from them and filters by its OBB rules (8.4.190's ``preserve_obb`` clip, 1 % area thresholds), so that hook gives the
boxes and ``valid`` too; ``Format``'s oriented boxes are made of them at the end (``AugmentedBatch.rboxes``).
Segmentation's polygons enter as Ultralytics' dataset resamples them (``geometry.polygons.source_polygons``: 1,000
points, more in an image with a longer polygon) and ride in (R, K, W, 2), each op's ``apply_polygons`` after its
``apply_boxes``: where segments exist the perspective makes the boxes from them (``segment2box``, 1 % area threshold)
and CutMix takes partners from 1 % of their box, and the mixing ops resample a row's polygons to the longer where the
two halves differ (``Instances.concatenate``); they leave as ``AugmentedBatch.segments`` in pixels, for ``Format``'s
masks. A detection batch (keypoints, corners and polygons None) runs no keypoint or segment work and draws exactly
what it drew before.

Partners come from the source images (``Partners``): the batch itself, or a ``PartnerPool`` of the
images loaded lately, as Ultralytics' buffer. MixUp and CutMix each blend in one more augmented row
per sample (a fresh mosaic of one more image, as in Ultralytics), so with both on the warp samples 3B
images. Flips are applied before mixing (each row its own), which changes nothing a detector can see:
in Ultralytics a mixed pair shares one flip draw, here each half has its own; each half's flip is
still a fair Bernoulli(fliplr) draw independent of its content. Keypoints likewise: each half is reflected and
reordered by ``flip_idx`` with its own row's flip; segments and polygons too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from yolofeed.augment.pool import PartnerPool

from yolofeed.augment.color.bgr import ToBGR
from yolofeed.augment.color.hsv import RandomHSV
from yolofeed.augment.geometry.copy_paste import CopyPaste
from yolofeed.augment.geometry.flip import FlipParams, RandomFlip
from yolofeed.augment.geometry.mosaic import Mosaic
from yolofeed.augment.geometry.obb import obb_rboxes, resample_corners
from yolofeed.augment.geometry.perspective import RandomPerspective
from yolofeed.augment.geometry.polygons import source_polygons
from yolofeed.augment.hyp import AugmentHyp
from yolofeed.augment.mix.cutmix import CutMix, CutMixPlan
from yolofeed.augment.mix.mixup import MixUp, MixUpParams
from yolofeed.augment.op import Draw, GeometricOp, Labels, Op, PixelOp, WarpPlan
from yolofeed.augment.partners import Partners
from yolofeed.augment.warp import warp
from yolofeed.errors import ConfigError
from yolofeed.kernels.compose import compose_reference
from yolofeed.schema import LABEL_KINDS, AugmentedBatch, SourceBatch

# Ultralytics' v8_transforms, in its order. An augmentation is one op file and one line here, with its import
# above (and its key in hyp.py): CONTRIBUTING.md, "An augmentation".
OPS: tuple[Op, ...] = (
    Mosaic(),
    CopyPaste(),  # flip mode: v8_transforms inserts it between the mosaic and the perspective
    RandomPerspective(),
    MixUp(),
    CutMix(),
    RandomHSV(),
    RandomFlip("flipud"),
    RandomFlip("fliplr"),
    ToBGR(),  # Format's bgr
)


def fusion_plan(ops: tuple[Op, ...]) -> tuple[tuple[GeometricOp, ...], tuple[PixelOp, ...]]:
    """Each op onto its pass, in list order within each: (the warp's geometric ops, compose's pixel ops).

    Every geometric op runs before every pixel op. HSV and the BGR swap change each pixel where it is, so a flip
    commutes with them exactly; with MixUp and CutMix it commutes in distribution (see above). The draws are made
    in the same order, warp first: the generator's sequence is the plan's.
    """
    unplanned = [type(op).__name__ for op in ops if not isinstance(op, (GeometricOp, PixelOp))]
    if unplanned:
        raise TypeError(f"ops {unplanned} join neither pass: an op is a GeometricOp (warp) or a PixelOp (compose)")
    return tuple(op for op in ops if isinstance(op, GeometricOp)), tuple(op for op in ops if isinstance(op, PixelOp))


WARP, COMPOSE = fusion_plan(OPS)
# The label kinds beyond classes and boxes that every op has a hook for: a batch of any other kind is refused.
CARRIED = tuple(k for k in LABEL_KINDS if all(callable(getattr(op, f"apply_{k}", None)) for op in OPS))


class _Draws:
    """Every random draw of one batch, replayable: ``size`` (B), then one field per op, named as the op, in draw order.

    The geometric ops' draws have one row per augmented image: the B samples, then B MixUp partners (if MixUp is
    on), then B CutMix partners (if CutMix is on). The pixel ops' have B rows.
    """

    @property
    def flips(self) -> FlipParams:
        """Both flips, as the warp reads them."""
        return FlipParams(self.flipud, self.fliplr)


# A dataclass of the ops' draws, made from the plan so that a new op needs no field written here.
AugmentParams = dataclasses.make_dataclass(
    "AugmentParams", [("size", int)] + [(op.name, op.Params) for op in WARP + COMPOSE], bases=(_Draws,),
    namespace={"__module__": __name__, "__doc__": _Draws.__doc__})


def compose(warped: Tensor, mixup: MixUpParams | None, cut: CutMixPlan | None, luts: Tensor | None,
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
class Geometry(Labels):
    """Every augmented row after the warp (mosaic, perspective and flips), before mixing.

    Shape: img (R, 3, S, S) uint8; cls (R, K) float32; boxes (R, K, 4) float32 xyxy pixels; valid (R, K) bool;
    keypoints (R, K, P, 3) float32 pixels and visibility, or None; segments (R, K, 100, 2) float32 pixels, or None;
    polygons (R, K, W, 2) float32 pixels and polygon_points (R,), or None (``Labels``).
    R = B samples, then their MixUp partners, then their CutMix partners (``AugmentParams``).
    """

    img: Tensor = dataclasses.field(kw_only=True)  # after Labels' optional keypoints and segments
    paste_lost: Tensor | None = dataclasses.field(default=None, kw_only=True)  # copy-paste's (WarpPlan)


class GpuAugment:
    """Ultralytics' training augmentation (``v8_transforms``) for detection, pose, OBB and segment batches, batched
    on the batch's device (a segment batch leaves with its polygons, ``AugmentedBatch.segments``, its masks not made).

    Example:
        >>> aug = GpuAugment(AugmentHyp.from_args(trainer.args))
        >>> out = aug(source_batch, generator)  # AugmentedBatch; partners from the batch itself
        >>> out = aug(source_batch, generator, pool=pool)  # partners from the images loaded lately (PartnerPool)
        >>> batch = out.to_ultralytics()  # what DetectionTrainer's loss consumes
    """

    def __init__(self, hyp: AugmentHyp, paste_capacity: int | None = None, paste_room: int = 1,
                 polygon_capacity: int | None = None):
        """``paste_capacity``, ``paste_room``: copy-paste's bound on the copies a batch pastes (None: every copy slot,
        exact but costly for a training batch) and its fill's event slots, in multiples of its default; the copies
        and events left out are counted in ``AugmentedBatch.paste_lost``. ``polygon_capacity``: the perspective's
        bound on the polygons it moves, over every augmented row (None: every slot, exact but costly: a mosaic row
        has 4 x the most labels an image of slots); valid slots past it are dropped and counted in
        ``AugmentedBatch.polygons_past``."""
        self.hyp = hyp
        self.paste_capacity, self.paste_room = paste_capacity, int(paste_room)
        self.polygon_capacity = polygon_capacity

    def check(self, batch: SourceBatch, who: str = "GpuAugment") -> None:
        """Refuse a batch whose labels the ops would drop or misread (host-side shapes only: no sync).

        Keypoints need the data's ``kpt_shape`` in the settings (``AugmentHyp.kpt_shape``, with its ``flip_idx``):
        without it a flip would reflect them without reordering left and right.
        """
        batch.require_only(who, CARRIED)
        corners = batch.corners
        if corners is not None and (corners.dim() != 4 or corners.shape[2:] != (4, 2)
                                    or corners.shape[:2] != batch.valid.shape):
            raise ConfigError(f"{who}: corners of shape {tuple(corners.shape)}, expected (images, label slots, 4, 2) "
                              f"= {(*batch.valid.shape, 4, 2)}: each oriented box's 4 corners, x and y")
        poly, lengths = batch.polygons, batch.polygon_lengths
        if poly is not None and (poly.dim() != 4 or poly.shape[3] != 2 or poly.shape[:2] != batch.valid.shape
                                 or lengths is None or lengths.shape != batch.valid.shape):
            got = "no polygon_lengths" if lengths is None else f"polygon_lengths of shape {tuple(lengths.shape)}"
            raise ConfigError(f"{who}: polygons of shape {tuple(poly.shape)} and {got}, expected (images, label "
                              f"slots, points, 2) and (images, label slots) = {tuple(batch.valid.shape)}: each slot's "
                              "polygon, x and y, padded to the longest, and how many points are its own")
        kp = batch.keypoints
        if kp is None:
            return
        shape = self.hyp.kpt_shape
        if shape is None:
            raise ConfigError(f"{who}: this batch carries keypoints ({kp.shape[2]} per instance) and the augmentation "
                              "was given no kpt_shape: pass the data yaml's kpt_shape and flip_idx "
                              "(AugmentHyp.from_args(args, data=...), or AugmentHyp(kpt_shape=..., flip_idx=...))")
        if kp.dim() != 4 or kp.shape[2] != shape[0] or kp.shape[3] != 3 or kp.shape[:2] != batch.valid.shape:
            raise ConfigError(f"{who}: keypoints of shape {tuple(kp.shape)}, expected (images, label slots, "
                              f"{shape[0]}, 3) = {(*batch.valid.shape, shape[0], 3)} for kpt_shape={list(shape)} "
                              "(x, y and visibility, visibility derived where the data has 2 values)")

    @property
    def mixers(self) -> int:
        """Extra augmented rows per sample: one for each mixing op that is on (MixUp, CutMix)."""
        return sum(op.mixes and op.on(self.hyp) for op in COMPOSE)

    @property
    def needs_partners(self) -> bool:
        """Whether any op that is on takes other images (mosaic, MixUp, CutMix); else a partner pool is not needed."""
        return any(op.takes_images and op.on(self.hyp) for op in OPS)

    def sample(self, batch_size: int, generator: torch.Generator | None = None,
               device: torch.device | str = "cpu", partners: Partners | None = None) -> AugmentParams:
        """Draw every random parameter of a batch (on ``device``, from ``generator``): the mixing partners, then
        each op's draws in the plan's order.

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
        off = torch.zeros(batch_size, dtype=torch.long, device=dev)  # a mixing op that is off: never read
        draws = {op.name: op.sample(Draw(n, dev, every), h, generator) for op in WARP}
        for op in COMPOSE:
            partner = (next(blocks) if op.on(h) else off) if op.mixes else None
            draws[op.name] = op.sample(Draw(batch_size, dev, partners, partner), h, generator)
        return AugmentParams(size=batch_size, **draws)

    def geometry(self, sources: SourceBatch, p: AugmentParams) -> Geometry:
        """The geometric ops on every augmented row: one warp pass, boxes (keypoints, segments) through the same
        steps."""
        self.check(sources)
        plan = WarpPlan(self.hyp.imgsz, sources.hw, paste_capacity=self.paste_capacity, paste_room=self.paste_room,
                        polygon_capacity=self.polygon_capacity)
        # the corners as Ultralytics' dataset gives them, 100 points each: every source row once (a pool's whole
        # ring, a few float64 kernels), before the mosaic gathers them 4 or 9 times
        segments = None if sources.corners is None else resample_corners(sources.corners)
        # the polygons likewise, 1,000 points each (more in an image with a longer one): every source row once, or
        # as a partner pool's ring keeps them, resampled as each row entered it
        polygons, points = sources.resampled_polygons, sources.resampled_points
        if sources.polygons is not None and polygons is None:
            polygons, points = source_polygons(sources.polygons, sources.polygon_lengths, sources.valid)
        labels = Labels(sources.cls, sources.boxes, sources.valid, sources.keypoints, segments, polygons, points)
        for op in WARP:
            draws = getattr(p, op.name)
            plan = op.warp_step(plan, draws, self.hyp)
            kp = None if labels.keypoints is None else op.apply_keypoints(labels.keypoints, plan, draws, self.hyp)
            moved = dataclasses.replace(op.apply_boxes(labels, plan, draws, self.hyp), keypoints=kp, segments=None,
                                        polygons=None, polygon_points=None)
            if segments is not None:
                moved = op.apply_corners(labels, moved, plan, draws, self.hyp)
            if polygons is not None:
                moved = op.apply_polygons(labels, moved, plan, draws, self.hyp)
            labels = moved
            plan = op.paste_step(plan, labels, self.hyp)
        img = warp(sources.images, plan.tiles, plan.matrix, FlipParams(plan.ud, plan.lr), plan.size, plan.projective,
                   paste=plan.paste)
        return Geometry(cls=labels.cls, boxes=labels.boxes, valid=labels.valid, keypoints=labels.keypoints,
                        segments=labels.segments, polygons=labels.polygons, polygon_points=labels.polygon_points,
                        polygons_past=labels.polygons_past, img=img, paste_lost=plan.paste_lost)

    def apply(self, sources: SourceBatch, p: AugmentParams) -> AugmentedBatch:
        """Apply drawn parameters: pure, so a test can replay them through Ultralytics.

        Args:
            sources: the images ``p`` indexes: the batch, or the pool's ring it was pushed into.
        """
        b = p.size
        rows = self.geometry(sources, p)
        kp, seg, poly, points = rows.keypoints, rows.segments, rows.polygons, rows.polygon_points
        labels = Labels(rows.cls[:b], rows.boxes[:b], rows.valid[:b], *(None if t is None else t[:b] for t in
                                                                        (kp, seg, poly, points)))
        terms = {}
        for op in COMPOSE:
            draws = getattr(p, op.name)
            terms[op.term] = term = op.compose_term(draws, labels, rows, self.hyp)
            kp = None if labels.keypoints is None else op.apply_keypoints(labels.keypoints, rows, term)
            moved = dataclasses.replace(op.apply_boxes(labels, rows, term), keypoints=kp, segments=None,
                                        polygons=None, polygon_points=None)
            if seg is not None:
                moved = op.apply_corners(labels, moved, rows, term)
            if poly is not None:
                moved = op.apply_polygons(labels, moved, rows, term)
            labels = moved
        rboxes = None if seg is None else obb_rboxes(labels.segments)  # Format(return_obb=True): from 4 corners
        return AugmentedBatch(compose(rows.img, rows=b, **terms), labels.cls, labels.boxes, labels.valid,
                              keypoints=labels.keypoints, rboxes=rboxes, segments=labels.polygons,
                              paste_lost=rows.paste_lost, polygons_past=rows.polygons_past)

    def __call__(self, batch: SourceBatch, generator: torch.Generator | None = None,
                 pool: PartnerPool | None = None) -> AugmentedBatch:
        """Augment a loaded batch; with ``pool``, push it there first and draw partners from the pool."""
        self.check(batch)
        n, dev = batch.images.shape[0], batch.images.device
        if pool is None or not self.needs_partners:
            return self.apply(batch, self.sample(n, generator, dev))
        first = pool.push(batch)
        return self.apply(pool.sources, self.sample(n, generator, dev, pool.partners(first, n)))

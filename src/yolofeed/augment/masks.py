"""Format's masks for the segment task, batched on the device: Ultralytics' ``polygons2masks`` and
``polygons2masks_overlap`` (``ultralytics/data/utils.py``) of every image at once, and their collated form.

Each instance's mask is ``polygon2mask``: ``cv2.fillPoly`` at full image size on the int32-truncated points, then
``cv2.resize`` to (h // mask_ratio, w // mask_ratio); ``kernels.polyfill`` reproduces both, pixel for pixel. With
``overlap_mask`` (the default) an image has one index mask: its instances sorted by area (the mask's pixel count)
descending, each painted with its rank + 1 over the larger ones (a running max), uint8, int32 past 255 instances;
``Format`` then reorders the image's labels by that sort. Two details of 8.4.190 are reproduced:

* the areas are NumPy uint64, so ``np.argsort(-areas)`` sorts an instance of no pixel first (-0 is the smallest
  unsigned value), before the largest;
* among equal areas NumPy's ``argsort`` (introsort, or the SIMD sort where the CPU has AVX2 / AVX-512) leaves an
  order that depends on the machine; here ties keep their slot order (a stable sort). Where tied instances overlap,
  the one sorted later owns the shared pixels, so those pixels may name the other of the tied instances than
  Ultralytics' on that machine does; every other pixel and rank is the same.

``Format`` also makes ``sem_masks``, each pixel's class: with overlap the class of the instance its index names
(index 0, the background, wraps to the last instance: ``cls[masks - 1]``), without it the class of the smallest
instance covering it (0 where none does). The loss reads them only where a covering instance exists.

Memory: the instance masks at mask resolution (B, K, h, w) uint8 stay whole until the sort (164 MB for B = 128,
K = 50 at 640 px and ratio 4); the rest is ``polyfill``'s working set for one chunk of polygons (about 2 MB a
polygon at those sizes: 128 polygons, ~250 MB, by default) and reductions over 8 slots at a time. For B = 128,
K = 50, n = 1000 points, 640 x 640, ratio 4 the peak is 418 MiB over the inputs, overlap or not (measured on the
CPU, every large block its own mapping). Time on the CPU is 27 s on one core for that batch (4 ms a slot, empty
slots included): the fill costs per slot the sampled grid (320 x 321 at 640 / 4), whatever the polygon's size;
cv2 on the CPU does the same batch in ~0.4 s. On a GPU that grid is a few memory-bound passes (~16 GB of traffic
for the batch); each chunk is ~100 kernels, so a graph or a larger ``chunk`` keeps launches from dominating.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from yolofeed.augment.hyp import AugmentHyp
from yolofeed.augment.pipeline import AugmentParams, GpuAugment
from yolofeed.errors import ConfigError
from yolofeed.kernels.polyfill import default_events, fill_polygons
from yolofeed.schema import AugmentedBatch, SourceBatch

# polygons rasterised at once on a GPU: ~1 GB of working set at 640 / 4; the fill of 1,931 polygons took 15.1 ms
# in chunks of 128 and 7.9 ms in chunks of 512 on an H200 (fewer, larger kernels)
CUDA_CHUNK = 512
SLOTS_AT_ONCE = 8  # slots per step of the reductions over slots: (B, 8, h, w) int32 (105 MB at B = 128, 640 / 4)
# source images a batch draws (batch x tiles) below which every slot is rasterised: with few draws one crowded image
# drawn again and again (partners come from the batch or the last batches) is beyond any bound from the label counts,
# and the padded slots cost little
FEW_DRAWS = 128


@dataclass
class SegmentMasks:
    """Format's masks of a padded batch.

    Shape:
        masks: with overlap (B, h, w) index masks, uint8 (int32 where K > 255: Ultralytics switches per image past
            255 instances, here by the slots, statically); without (B, K, h, w) uint8 0/1, slot by slot.
        order: (B, K) int64, the slot at each position of Ultralytics' label order: with overlap its area sort,
            valid slots first; without it, the slots as they are. ``reorder`` applies it.
        valid: (B, K) bool, in that order.
        areas: (B, K) int64 pixels of each slot's mask, in that order (0 for an invalid slot).
        overflow: () int64, rasterisation events dropped for want of slots (``polyfill``); 0 means every mask is
            exact. A device tensor: check it where the host reads it anyway.
        past: () int64, valid slots past ``polygons_to_masks``' capacity, their masks empty (0 without one).
    """

    masks: Tensor
    order: Tensor
    valid: Tensor
    areas: Tensor
    overflow: Tensor
    overlap: bool
    past: Tensor | None = None

    def reorder(self, t: Tensor) -> Tensor:
        """A per-slot tensor (B, K, ...) of the batch (classes, boxes, ...) in Ultralytics' label order."""
        index = self.order.reshape(*self.order.shape, *([1] * (t.dim() - 2))).expand(*self.order.shape, *t.shape[2:])
        return t.gather(1, index)

    def collated(self, cls: Tensor, total: int | None = None) -> dict[str, Tensor]:
        """``masks`` and ``sem_masks`` in ``collate_fn``'s layout (``ultralytics_masks``), for
        ``AugmentedBatch.to_ultralytics``; ``cls`` (B, K) already in this order. The index masks are copied: under
        ``GraphedAugment`` they are the graph's memory, which the next batch's replay overwrites (B x S/r x S/r
        bytes, 3.3 MB at batch 128, 640 / 4)."""
        out = ultralytics_masks(self, cls, total)
        if self.overlap:
            out["masks"] = out["masks"].clone()
        return out


def polygons_to_masks(segments: Tensor, valid: Tensor, height: int, width: int, mask_ratio: int = 4,
                      overlap: bool = True, chunk: int = 128, events: int | None = None,
                      capacity: int | None = None) -> SegmentMasks:
    """Ultralytics' ``Format`` masks (segment task) for a padded batch of polygons, on their device.

    No host sync and no loop over polygons (a fixed loop over chunks of them): it can be captured in a CUDA graph.

    Args:
        segments: (B, K, n, 2) float32 pixel x, y of each slot's polygon (Ultralytics' resampled segments).
        valid: (B, K) bool, the slots holding an instance.
        height, width: the image's size in pixels, multiples of ``mask_ratio``.
        mask_ratio: Ultralytics' ``mask_ratio`` (default 4).
        overlap: Ultralytics' ``overlap_mask`` (default True): one index mask per image.
        chunk, events: ``kernels.polyfill.fill_polygons``' working-set size and event slots per polygon.
        capacity: polygons rasterised: the valid slots first (row-major), this many of them; the rest of the
            ``B x K`` slots get empty masks, and valid slots past ``capacity`` are counted in ``past``. None:
            every slot. The fill costs per polygon rasterised, valid or not, and most slots of a padded batch are
            padding (a mosaic of 4 images has 4 x the pack's largest label count of slots).

    Returns:
        ``SegmentMasks``.
    """
    if mask_ratio < 1 or height % mask_ratio or width % mask_ratio:
        raise ConfigError(f"mask_ratio={mask_ratio} for {height}x{width} images: expected a positive ratio that "
                          "divides both sides (imgsz is a multiple of 32: use mask_ratio 1, 2, 4, 8, 16 or 32)")
    b, k, n, _ = segments.shape
    h, w = height // mask_ratio, width // mask_ratio
    polys, live = segments.reshape(b * k, n, 2), valid.reshape(-1)
    if capacity is None or capacity >= b * k:
        flat, overflow = fill_polygons(polys, live, height, width, mask_ratio, chunk=chunk, events=events)
        past = torch.zeros((), dtype=torch.long, device=polys.device)
    else:
        first = (~live).to(torch.uint8).argsort(stable=True)[:capacity]  # the valid slots first, in row order
        some, overflow = fill_polygons(polys.index_select(0, first), live.index_select(0, first), height, width,
                                       mask_ratio, chunk=chunk, events=events)
        flat = torch.zeros((b * k, h, w), dtype=torch.uint8, device=polys.device).index_copy_(0, first, some)
        past = (live.sum() - capacity).clamp(min=0)
    inst = flat.view(b, k, h, w)
    # a reduction of uint8 to int64 casts its whole input first (on the CPU): a chunk of slots at a time
    areas = torch.cat([part.sum((-2, -1)) for part in flat.split(chunk)]).view(b, k)
    if not overlap:
        order = torch.arange(k, device=valid.device).expand(b, k)
        return SegmentMasks(inst, order, valid, areas, overflow, False, past)
    # np.argsort(-areas) of uint64 areas: no pixel first, then the largest; invalid slots after every instance
    key = torch.where(areas == 0, h * w + 1, areas).masked_fill(~valid, -1)
    order = key.argsort(dim=1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(k, device=order.device).expand(b, k))
    dtype = torch.int32 if k > 255 else torch.uint8
    paint = ((rank + 1) * valid).to(dtype)[..., None, None]  # each slot's index value, 0 for an invalid slot
    index = torch.zeros((b, h, w), dtype=dtype, device=inst.device)
    for s in range(0, k, SLOTS_AT_ONCE):  # the running max (later, smaller ones on top), a few slots at a time
        part = slice(s, s + SLOTS_AT_ONCE)
        index = torch.maximum(index, (inst[:, part].to(dtype) * paint[:, part]).amax(1))
    return SegmentMasks(index, order, valid.gather(1, order), areas.gather(1, order), overflow, True, past)


def sem_masks(m: SegmentMasks, cls: Tensor) -> Tensor:
    """``Format``'s ``sem_masks``: each mask pixel's class, (B, h, w) float32.

    Args:
        cls: (B, K) float classes in ``m``'s order (``m.reorder(cls)``).
    """
    if m.overlap:
        count = m.valid.sum(1)
        last = cls.gather(1, (count - 1).clamp(min=0)[:, None])  # where index 0 wraps to
        idx = (m.masks.long() - 1).clamp(min=0).flatten(1)
        sem = torch.where(m.masks.flatten(1) > 0, cls.gather(1, idx), last)
        return (sem * (count > 0)[:, None]).view(m.masks.shape).float()
    b, k, h, w = m.masks.shape
    top = (m.areas.amax(1).view(b, 1, 1) + 1).int()  # Ultralytics' "weights.max() + 1" for uncovered pixels
    best = top.expand(b, h, w).clone()
    best_cls = torch.zeros((b, h, w), dtype=cls.dtype, device=cls.device)
    for s in range(0, k, SLOTS_AT_ONCE):  # min over slots, the first among equal weights, a few slots at a time
        part = m.masks[:, s:s + SLOTS_AT_ONCE].bool()
        weight = torch.where(part, m.areas[:, s:s + SLOTS_AT_ONCE, None, None].int(), top[:, None])
        low, at = weight.min(1)
        better = low < best
        best = torch.where(better, low, best)
        best_cls = torch.where(better, cls[:, s:s + SLOTS_AT_ONCE].gather(1, at.flatten(1)).view(b, h, w), best_cls)
    return (best_cls * m.masks.any(1)).float()


def ultralytics_masks(m: SegmentMasks, cls: Tensor, total: int | None = None) -> dict[str, Tensor]:
    """``masks`` and ``sem_masks`` as ``YOLODataset.collate_fn`` gives them to the segment loss.

    With overlap ``masks`` is (B, h, w), image i's index mask at i (the loss compares it with each of the image's
    rows' rank + 1); without it (N, h, w), one per valid slot in row-major order, the rows of
    ``AugmentedBatch.to_ultralytics``. Values equal Ultralytics'; its dtype is float32 where an image has no
    instance (``torch.zeros``), uint8 or int32 here, which the loss reads alike (``.float()``).

    Args:
        cls: (B, K) classes in ``m``'s order (``m.reorder(cls)``).
        total: without overlap, the number of valid slots if known on the host (no sync; as in ``to_ultralytics``).
    """
    sem = sem_masks(m, cls)
    if m.overlap:
        return {"masks": m.masks, "sem_masks": sem}
    if total is None:
        return {"masks": m.masks[m.valid], "sem_masks": sem}
    flat = m.valid.flatten()
    src = torch.searchsorted(flat.cumsum(0), torch.arange(1, total + 1, device=flat.device))
    return {"masks": m.masks.flatten(0, 1).index_select(0, src), "sem_masks": sem}


def mask_capacity(batch: int, tiles: int, mean: float, std: float, top: float = 0.0, chunk: int = 128) -> int:
    """Polygons to rasterise per batch (``polygons_to_masks``' ``capacity``) from the training set's labels an image:
    a bound on the instances a batch can hold, ``tiles`` source images an augmented image (4 for a mosaic, twice that
    with MixUp), each instance of each kept (the crop drops many: a third of them are left on average), the mean plus
    6 standard deviations of the sum over the batch's ``batch x tiles`` draws, plus the largest image's labels in
    every tile of one image (a heavy tail: partners come from the batch or the last batches loaded, so one crowded
    image can fill a small batch's row several times, beyond the normal bound); a multiple of ``chunk``.

    Args:
        mean, std, top: labels an image over the training set: mean, standard deviation, most.
    """
    draws = batch * tiles
    bound = draws * mean + 6.0 * (draws ** 0.5) * std + tiles * top
    return max(chunk, -(-int(bound + 1) // chunk) * chunk)


def learnt_capacity(most: int, extra: float = 0.0, margin: float = 1.5, chunk: int = 128) -> int:
    """A bound on the polygons a batch holds from the most one batch held so far: ``margin`` times it, plus ``extra``
    (``MaskedAugment.learnt``: the largest image's labels in every tile of a row), in whole chunks. The mosaic's crop
    leaves about a third of its tiles' instances, so this is far below ``mask_capacity``'s bound (which keeps them
    all). Valid slots beyond it are counted in the masks' ``past``."""
    return max(chunk, -(-int(margin * most + extra + 1) // chunk) * chunk)


def with_masks(out: AugmentedBatch, mask_ratio: int = 4, overlap: bool = True, room: int = 1,
               capacity: int | None = None) -> AugmentedBatch:
    """``Format``'s last step for a segment batch: masks of the augmented polygons (``polygons_to_masks``), and every
    per-slot label in their order (with overlap Ultralytics sorts an image's labels by mask area), the polygons
    dropped. A batch without polygons is returned as it is. No host sync: a CUDA graph can hold it.

    Args:
        out: the augmentation's batch, ``segments`` (B, K, W, 2) pixels.
        mask_ratio, overlap: Ultralytics' ``mask_ratio`` and ``overlap_mask``.
        room: ``polyfill``'s event slots per polygon, in multiples of its default (``default_events``), and of
            ``capacity``; too few events are counted in the masks' ``overflow``, too small a capacity in ``past``.
        capacity: the polygons rasterised per batch before ``room`` (``polygons_to_masks``); None: every slot.
    """
    if out.segments is None:
        return out
    side = out.img.shape[-1]
    events = None if room == 1 else room * default_events(out.segments.shape[2], side, mask_ratio)
    m = polygons_to_masks(out.segments, out.valid, side, side, mask_ratio, overlap, events=events,
                          capacity=None if capacity is None else capacity * room,
                          chunk=CUDA_CHUNK if out.img.is_cuda else 128)
    if out.paste_lost is not None:  # copy-paste's copies and events left out count with the masks' (``room``)
        m.overflow = m.overflow + out.paste_lost
    return AugmentedBatch(out.img, m.reorder(out.cls), m.reorder(out.boxes), m.valid,
                          keypoints=None if out.keypoints is None else m.reorder(out.keypoints),
                          rboxes=None if out.rboxes is None else m.reorder(out.rboxes), masks=m,
                          polygons_past=out.polygons_past)


class MaskedAugment(GpuAugment):
    """``GpuAugment`` then ``Format``'s masks (``with_masks``) for the segment task, in one call: under
    ``GraphedAugment`` the rasterisation (about 100 small kernels per chunk of 128 polygons) is replayed inside the
    augmentation's graph instead of launched one by one.

    Args:
        hyp: the augmentation's settings.
        mask_ratio, overlap, room: see ``with_masks``.
        labels: the training set's labels an image, mean, standard deviation and most: the polygons rasterised per
            batch are then ``mask_capacity``'s bound (times ``room``) rather than every padded slot, for batches of
            ``FEW_DRAWS`` source images or more. None: every slot.
        capacity: a bound learnt from the batches augmented so far (polygons a batch, ``learnt``), used where it
            is below the labels' bound. None: the labels' bound alone.
        polygon_capacity: the perspective's bound on the polygons it moves (``GpuAugment``).
    """

    def __init__(self, hyp: AugmentHyp, mask_ratio: int = 4, overlap: bool = True, room: int = 1,
                 labels: tuple[float, float, float] | None = None, capacity: int | None = None,
                 polygon_capacity: int | None = None):
        super().__init__(hyp, paste_room=room, polygon_capacity=polygon_capacity)
        self.mask_ratio, self.overlap, self.room = int(mask_ratio), bool(overlap), int(room)
        self.labels, self.capacity = labels, capacity

    @property
    def tiles(self) -> int:
        """Source images' worth of instances an augmented image holds: the mosaic's grid (1 without), for the image
        and each mix, twice with copy-paste (its copies)."""
        return self.sources * (2 if self.hyp.copy_paste > 0 else 1)

    @property
    def sources(self) -> int:
        """Source images an augmented image is made of: the mosaic's grid (1 without), for the image and each mix."""
        return (self.hyp.mosaic_grid if self.hyp.mosaic > 0 else 1) * (1 + self.mixers)

    def bound(self, batch: int, tiles: int | None = None) -> int | None:
        """The labels' bound on a batch's instances (``mask_capacity``), None (every slot) without labels or for
        fewer than ``FEW_DRAWS`` source images a batch."""
        tiles = self.tiles if tiles is None else tiles
        if self.labels is None or batch * tiles < FEW_DRAWS:
            return None
        return mask_capacity(batch, tiles, *self.labels)

    def learnt(self, most: int) -> int:
        """``learnt_capacity`` of the most instances a batch held, the largest image in every tile of a row added."""
        return learnt_capacity(most, self.tiles * (self.labels[2] if self.labels is not None else 0.0))

    def apply(self, sources: SourceBatch, p: AugmentParams) -> AugmentedBatch:
        # copy-paste's copies are at most the instances on every augmented row's canvas: the labels' bound on the
        # batch's source images (all its rows'), times the room
        bound = self.bound(p.size, self.sources)
        self.paste_capacity = None if bound is None or self.hyp.copy_paste <= 0 else bound * self.room
        out = super().apply(sources, p)
        # from the settings and shapes alone (static under a graph): at most the row's slots / the source width
        capacity = self.bound(out.valid.shape[0], min(self.tiles, out.valid.shape[1] // max(sources.valid.shape[1], 1)))
        if capacity is not None and self.capacity is not None:
            capacity = min(capacity, self.capacity)
        return with_masks(out, self.mask_ratio, self.overlap, self.room, capacity)


__all__ = ["MaskedAugment", "SegmentMasks", "learnt_capacity", "mask_capacity", "polygons_to_masks", "sem_masks",
           "ultralytics_masks",
           "with_masks"]

"""Where mosaic, MixUp and CutMix partners come from: Ultralytics' buffer of recently loaded images, on the device.

Ultralytics' ``BaseDataset.load_image`` appends every image it loads for training to ``dataset.buffer``
and, once the buffer holds ``max_buffer_length = min(n, 8 * batch, 1000)`` images, drops the oldest;
``Mosaic.get_indexes`` then draws its partners from that buffer with ``random.choices``, the image
itself included. So sample k of a batch mosaics with images loaded up to and including itself: mostly
images of earlier batches, and a batch of B mosaics holds up to 4B distinct images.

``PartnerPool`` keeps the same window in device memory. Every batch the loader delivers is copied into
a ring of rows as it arrives (the copy the CUDA graph's input needed anyway, so no extra traffic), and
``partners`` says, for each sample, which rows it may draw from: the newest is its own, and the window
reaches back as far as Ultralytics' buffer would. The ring has ``max_batch`` rows more than the window,
so a batch never overwrites an image one of its own samples may still draw.

Segmentation's polygons (and detection's, where every label row is one) are resampled as Ultralytics' dataset
resamples them (``geometry.polygons.source_polygons``, 1,000 points each) once, as their batch enters the ring, and
kept there resampled, not as stored (the ops read nothing else): the ops gather a batch's partners from every row of
the ring, and resampling the whole ring each batch (about 9 x the batch's polygons, a float64 sort of 2,000
positions each) cost more than the step.

Memory: ``rows * imgsz**2 * 3`` bytes of images, 1.39 GB at 640 px for Ultralytics' cap (999 + 129 rows); the
labels, keypoints and OBB corners included, are small beside them. Resampled polygons are not: ``rows * slots *
8,000`` bytes (the slots a multiple of 16 at or above the most labels an image has), 0.29 GB at 32 slots
(``nbytes``).
``partner_pool=0`` (``within_batch``) takes partners from the batch itself and needs none.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from yolofeed.augment.geometry.polygons import POINTS, source_polygons
from yolofeed.augment.partners import Partners
from yolofeed.errors import ConfigError
from yolofeed.schema import SourceBatch

LABEL_BUCKET = 16  # label slots per image are padded up to a multiple of this (few CUDA graphs, one ring width)
MAX_BUFFER = 1000  # Ultralytics' cap on max_buffer_length
BATCHES_BUFFERED = 8  # ... and its batch multiple


def ultralytics_capacity(n_images: int, batch: int) -> int:
    """Ultralytics' ``max_buffer_length`` for a training set of ``n_images`` and a per-rank ``batch``."""
    return min(n_images, BATCHES_BUFFERED * batch, MAX_BUFFER)


# the optional fields of a fixed shape per label slot: a segment pack's polygons are padded to its longest, so they
# have one too; the ring keeps the polygons resampled instead (STORED_ONLY: not in the ring)
SLOT_KINDS = ("keypoints", "corners", "polygons", "polygon_lengths")
STORED_ONLY = ("polygons", "polygon_lengths")


def slot_shapes(batch: SourceBatch) -> dict[str, tuple[int, ...]]:
    """What a batch carries per label slot beyond classes and boxes: {field: its shape per slot}, e.g.
    {"keypoints": (P, 3)}, {"corners": (4, 2)} or {"polygons": (P, 2), "polygon_lengths": ()}; {} for detection."""
    return {k: tuple(getattr(batch, k).shape[2:]) for k in SLOT_KINDS if getattr(batch, k) is not None}


def slot_dtype(kind: str) -> torch.dtype:
    """The dtype of a per-slot field: point counts are int64, coordinates float32."""
    return torch.int64 if kind == "polygon_lengths" else torch.float32


def resampled_width(polygon_points: int) -> int:
    """The points a resampled polygon row holds (``source_polygons``): 1,000, or one more than the stored polygons'
    most where that is more."""
    return POINTS if polygon_points <= POINTS else polygon_points + 1


class PartnerPool:
    """The most recently loaded training images and their labels, on the device (Ultralytics' ``dataset.buffer``).

    Example:
        >>> pool = PartnerPool(ultralytics_capacity(len(dataset), batch), max_batch=batch + 1)
        >>> out = GpuAugment(hyp)(source_batch, generator, pool=pool)  # partners from the last ~8 batches

    Args:
        capacity: Ultralytics' ``max_buffer_length``. A draw sees ``capacity - 1`` images once the pool is
            full: Ultralytics drops the oldest as soon as the buffer reaches ``capacity`` (``load_image``).
        max_batch: the largest batch that will be pushed.
    """

    def __init__(self, capacity: int, max_batch: int):
        if capacity < 1 or max_batch < 1:
            raise ConfigError(f"partner pool of {capacity} images for batches of {max_batch}: expected at least 1 "
                              "of each (partner_pool=0 takes partners from the batch instead)")
        self.capacity, self.max_batch = capacity, max_batch
        self.keep = max(1, capacity - 1)
        self.rows = self.keep + max_batch
        self.loaded = 0  # images pushed so far, on the host: the ring position is never read back from the device
        self.sources: SourceBatch | None = None  # the ring, allocated on the first push
        self.slots: dict[str, tuple[int, ...]] = {}  # what the batches carry per label slot (slot_shapes)
        self.ids = np.full(self.rows, -1, np.int64)  # the dataset index in each row, where push was told it

    def nbytes(self, imgsz: int, labels: int = 0, polygon_points: int = 0) -> int:
        """Device memory the ring takes at ``imgsz``: its images, and with ``polygon_points`` (the most points a
        stored polygon has; 0 without polygons) its resampled polygons, ``labels`` (the most an image has) a row."""
        if not polygon_points:
            return self.rows * imgsz * imgsz * 3
        slots = -(-max(labels, 1) // LABEL_BUCKET) * LABEL_BUCKET
        return self.rows * (imgsz * imgsz * 3 + slots * 8 * resampled_width(polygon_points))

    def _allocate(self, batch: SourceBatch) -> SourceBatch:
        _, hm, wm, c = batch.images.shape
        width = -(-max(batch.valid.shape[1], 1) // LABEL_BUCKET) * LABEL_BUCKET
        dev, r = batch.images.device, self.rows
        resampled = {}
        if batch.polygons is not None:
            p = batch.polygons.shape[2]
            resampled["resampled_polygons"] = torch.zeros((r, width, resampled_width(p), 2), device=dev)
            if p > POINTS:
                resampled["resampled_points"] = torch.full((r,), POINTS, dtype=torch.int64, device=dev)
        return SourceBatch(torch.zeros((r, hm, wm, c), dtype=torch.uint8, device=dev),
                           torch.ones((r, 2), dtype=torch.int64, device=dev) * min(hm, wm),
                           torch.zeros((r, width), device=dev), torch.zeros((r, width, 4), device=dev),
                           torch.zeros((r, width), dtype=torch.bool, device=dev),
                           **{k: torch.zeros((r, width, *size), dtype=slot_dtype(k), device=dev)
                              for k, size in slot_shapes(batch).items() if k not in STORED_ONLY}, **resampled)

    def push(self, batch: SourceBatch, ids: np.ndarray | None = None) -> int:
        """Copy a loaded batch into the ring (asynchronously, on the current stream).

        Args:
            ids: the batch's dataset indices, kept on the host for ``ids`` (tests and diagnostics).

        Returns:
            How many images were pushed before this batch: ``partners``' ``first`` for it.
        """
        n, width = batch.valid.shape
        if n > self.max_batch:
            raise ValueError(f"a batch of {n} images does not fit a partner pool made for batches of {self.max_batch}")
        if self.sources is None:
            self.sources, self.slots = self._allocate(batch), slot_shapes(batch)
        ring = self.sources
        if batch.images.shape[1:] != ring.images.shape[1:] or width > ring.valid.shape[1]:
            raise ValueError(f"batch images {tuple(batch.images.shape[1:])} with {width} label slots do not fit the "
                             f"partner pool's {tuple(ring.images.shape[1:])} and {ring.valid.shape[1]}")
        if slot_shapes(batch) != self.slots:
            raise ValueError(f"batch labels {slot_shapes(batch)} per slot (beyond classes and boxes) do not fit the "
                             f"partner pool's {self.slots}: one pool serves one dataset")
        resampled = points = None
        if batch.polygons is not None:  # this batch's rows once, here, not the ring's every batch
            resampled, points = source_polygons(batch.polygons, batch.polygon_lengths, batch.valid)
        first, start = self.loaded, self.loaded % self.rows
        head = min(n, self.rows - start)
        for lo, count, at in ((start, head, 0), (0, n - head, head)):  # at most two runs: the ring wraps once
            if count == 0:
                continue
            rows, src = slice(lo, lo + count), slice(at, at + count)
            ring.images[rows].copy_(batch.images[src], non_blocking=True)
            ring.hw[rows].copy_(batch.hw[src], non_blocking=True)
            ring.valid[rows].zero_()
            ring.cls[rows, :width].copy_(batch.cls[src], non_blocking=True)
            ring.boxes[rows, :width].copy_(batch.boxes[src], non_blocking=True)
            ring.valid[rows, :width].copy_(batch.valid[src], non_blocking=True)
            for k in slot_shapes(ring):  # keypoints, corners
                getattr(ring, k)[rows, :width].copy_(getattr(batch, k)[src], non_blocking=True)
            if resampled is not None:
                ring.resampled_polygons[rows].zero_()  # the slots past this batch's: zeros, as source_polygons'
                ring.resampled_polygons[rows, :width].copy_(resampled[src])
                if points is not None:
                    ring.resampled_points[rows].copy_(points[src])
            if ids is not None:
                self.ids[rows] = np.asarray(ids)[src]
        self.loaded += n
        return first

    def partners(self, first: Tensor | int, batch_size: int) -> Partners:
        """The rows each sample of a batch pushed after ``first`` earlier images may draw from.

        Args:
            first: ``push``'s return value; a 0-d device tensor inside a CUDA graph (one graph serves every batch).
        """
        dev = self.sources.images.device if self.sources is not None else "cpu"
        pos = torch.arange(batch_size, device=dev) + first  # each sample's load position
        own = pos % self.rows
        return Partners(own, own, (pos + 1).clamp(max=self.keep), self.rows)


__all__ = ["PartnerPool", "ultralytics_capacity"]

"""A pack batch in host memory: images (written by the pack's codec) and padded labels, in one call."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from yolofeed.loader.labels import LabelView
from yolofeed.pack import Pack


@dataclass
class HostBuffers:
    """Reusable (pinned, on CUDA machines) buffers for one batch.

    Shape: images (B, S, S, 3) uint8, or (B, 0, 0, 3) when images are decoded on the device; hw (B, 2) int64;
    labels (B, L, 5) float32 [class, x, y, w, h]; counts (B,) int64; keypoints (B, L, K, 3) float32 [x, y,
    visibility] and corners (B, L, 4, 2) float32 [x, y], zero past each image's count, or None (detection);
    polygons (B, L, P, 2) float32 [x, y] and polygon_lengths (B, L) int64, zero past each polygon's length and each
    image's count, or None. B is the largest batch the sampler makes (batch + 1), L the pack's most labels per image,
    P its most points per polygon.
    """

    images: Tensor
    hw: Tensor
    labels: Tensor
    counts: Tensor
    keypoints: Tensor | None = None
    corners: Tensor | None = None
    polygons: Tensor | None = None
    polygon_lengths: Tensor | None = None

    @classmethod
    def allocate(cls, batch: int, imgsz: int, width: int, pin: bool, images: bool = True,
                 keypoints: int = 0, corners: bool = False, polygons: int = 0) -> HostBuffers:
        """Empty buffers; ``images=False`` leaves out the image buffer (B x S x S x 3 bytes: 157 MB at 128 x 640);
        ``keypoints`` K > 0 adds the keypoint buffer (B x L x K x 12 bytes), ``corners`` the corners' (B x L x 32),
        ``polygons`` P > 0 the polygons' (B x L x (P x 8 + 8))."""
        def empty(shape, dtype):
            return torch.empty(shape, dtype=dtype, pin_memory=pin)

        side, width = (imgsz if images else 0), max(1, width)
        return cls(empty((batch, side, side, 3), torch.uint8), empty((batch, 2), torch.int64),
                   empty((batch, width, 5), torch.float32), empty((batch,), torch.int64),
                   empty((batch, width, keypoints, 3), torch.float32) if keypoints else None,
                   empty((batch, width, 4, 2), torch.float32) if corners else None,
                   empty((batch, width, polygons, 2), torch.float32) if polygons else None,
                   empty((batch, width), torch.int64) if polygons else None)

    def tensors(self) -> tuple[Tensor, ...]:
        """The buffers in field order, the per-row ones (keypoints, corners, polygons) only where the batch has
        them."""
        return (self.images, self.hw, self.labels, self.counts,
                *(t for t in (self.keypoints, self.corners, self.polygons, self.polygon_lengths) if t is not None))

    def like(self, images: Tensor, device: torch.device) -> HostBuffers:
        """Buffers of the same shapes on ``device``, the images given (the device side of a prefetch slot)."""
        def on(t: Tensor | None) -> Tensor | None:
            return None if t is None else torch.empty_like(t, device=device)
        return HostBuffers(images, on(self.hw), on(self.labels), on(self.counts), on(self.keypoints),
                           on(self.corners), on(self.polygons), on(self.polygon_lengths))


def label_width(pack: Pack, labels: LabelView | None = None) -> int:
    """Most labels any image has (the padded label width), in ``labels`` or else in the pack."""
    return (LabelView.of(pack) if labels is None else labels).width


def gather(pack: Pack, indices: np.ndarray, buf: HostBuffers, images: bool = True,
           labels: LabelView | None = None) -> int:
    """Fill ``buf`` with samples ``indices``: the pack's codec writes the pixels, labels are vectorised.

    Args:
        images: False gathers only hw, labels and counts (the codec decodes the images on the device later).
        labels: the labels to deliver (``classes``/``single_cls`` applied); None: the pack's own.

    Returns:
        n, the number of samples written (rows ``:n`` are valid).
    """
    n = len(indices)
    pack.will_need(indices)  # the batch's bytes read from storage once, queued together, if not cached
    if images:  # raw: one memcpy per image from the page cache; jpeg: decoded on two host threads
        hw = pack.codec.gather(pack, np.asarray(indices, dtype=np.int64), buf.images[:n])
    else:
        hw = pack.shapes[np.asarray(indices, dtype=np.int64)]
    buf.hw[:n] = torch.from_numpy(hw)
    labels = LabelView.of(pack) if labels is None else labels
    idx = np.asarray(indices, dtype=np.int64)
    counts, starts, table = labels.count[idx], labels.start[idx], labels.table
    width = buf.labels.shape[1]
    j = np.arange(width)
    rows = np.minimum(starts[:, None] + j, max(len(table) - 1, 0))  # (n, L) table rows, padding clamped in range
    have = j < counts[:, None]
    lab = np.where(have[..., None], table[rows] if len(table) else 0.0, 0.0)
    buf.labels[:n] = torch.from_numpy(lab.astype(np.float32))
    buf.counts[:n] = torch.from_numpy(counts)
    for out, per_row in ((buf.keypoints, labels.keypoints), (buf.corners, labels.corners)):
        if out is not None:  # the same rows of a per-row table: one gather, no loop per image
            out[:n] = torch.from_numpy(np.where(have[..., None, None], per_row[rows] if len(per_row) else 0.0, 0.0)
                                       .astype(np.float32))
    if buf.polygons is not None:
        buf.polygon_lengths[:n] = torch.from_numpy(_gather_polygons(labels.polygons, rows, have, buf.polygons[:n]))
    return n


def _gather_polygons(polygons: tuple[np.ndarray, np.ndarray, np.ndarray], rows: np.ndarray, have: np.ndarray,
                     out: Tensor) -> np.ndarray:
    """Each slot's polygon into ``out``, zeros past its points: one gather of the real points only.

    The slots are padded to the longest polygon of the set (P), often 10-20 x a mean polygon, so a gather of every
    (slot, point) pair cost the loader's thread more than the batch's pixels; this touches each real point once,
    beside one memset of ``out``.

    Shape: rows, have (n, L) the slots' table rows and which hold a label; out (n, L, P, 2) float32. Returns the
    slots' lengths (n, L) int64, 0 without a label.
    """
    points, starts, lengths = polygons
    out.zero_()
    lengths = np.where(have, lengths[rows] if len(lengths) else 0, 0).astype(np.int64)
    length = lengths.reshape(-1)
    total = int(length.sum())
    if total == 0:
        return lengths
    k = np.arange(total) - np.repeat(np.cumsum(length) - length, length)  # each point's place in its polygon
    slot = np.repeat(np.arange(len(length)) * out.shape[2], length)  # each point's slot, in points
    first = np.repeat(starts[rows].reshape(-1), length)
    out.view(-1, 2).numpy()[slot + k] = points[first + k]
    return lengths

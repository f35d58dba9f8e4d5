"""Bounds from the training set's labels on the slots a batch's augmentation works on, and what each left out, read
once an epoch.

A padded batch holds 4 x the most labels an image of slots a mosaic row, most of them padding. The ops that cost per
slot take the valid slots first, at most the labels' bound on a batch's instances (``augment.masks.mask_capacity``):
the perspective's polygons (``GpuAugment(polygon_capacity=)``) and copy-paste's copies (``paste_capacity``). What a
bound left out is counted on the device, without a host sync, and read at the epoch's end (one sync, where
Ultralytics' own epoch end syncs anyway); the trainer then says so and turns the bound off for the rest of the run
(a resumed run tries it again: one more such epoch at most).
"""

from __future__ import annotations

import torch

from yolofeed.augment import AugmentHyp, GpuAugment
from yolofeed.augment.masks import FEW_DRAWS, mask_capacity


def label_stats(counts) -> tuple[float, float, float] | None:
    """Labels an image of a training split, (mean, standard deviation, most); None for no images."""
    return (float(counts.mean()), float(counts.std()), float(counts.max())) if len(counts) else None


def sources(hyp: AugmentHyp, copies: bool = False) -> int:
    """Source images an augmented row's instances come from: the mosaic's grid (1 without) for the row and each mix;
    with ``copies``, copy-paste's copies count as many again."""
    return (hyp.mosaic_grid if hyp.mosaic > 0 else 1) * (1 + GpuAugment(hyp).mixers) * (2 if copies else 1)


class LabelBound:
    """One bound in use: whether it is on, and what it left out this epoch (on the device)."""

    def __init__(self) -> None:
        self.on = True  # off for good once one fell short
        self.past: torch.Tensor | None = None

    def capacity(self, batch: int, tiles: int, labels: tuple[float, float, float] | None) -> int | None:
        """``mask_capacity`` of ``batch`` rows of ``tiles`` source images each, of ``labels`` (``label_stats``); None
        (every slot) without labels, once off, or for fewer than ``FEW_DRAWS`` source images a batch."""
        if labels is None or not self.on or batch * tiles < FEW_DRAWS:
            return None
        return mask_capacity(batch, tiles, *labels)

    def count(self, past: torch.Tensor | None) -> None:
        """Add a batch's count: a device op, no sync (under GraphedAugment ``past`` is the graph's memory: read here,
        before the next replay)."""
        if past is not None:
            self.past = past.clone() if self.past is None else self.past + past

    def epoch_past(self, device: torch.device, ranks: int) -> int:
        """This epoch's count, summed over the DDP ranks (every rank calls it at every epoch end), and a new epoch.
        Nothing counted on one process: 0 without a sync."""
        if self.past is None and ranks <= 1:
            return 0
        past = torch.zeros((), dtype=torch.long, device=device) if self.past is None else self.past.to(device).long()
        self.past = None
        if ranks > 1:
            import torch.distributed as dist

            dist.all_reduce(past)
        return int(past)

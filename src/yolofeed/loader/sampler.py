"""Which samples go in which batch, on which rank, in which epoch.

A seeded shuffle per epoch (the same permutation on every rank), cut into one contiguous shard per
rank, then into batches. Every sample is seen exactly once per epoch across ranks, and every rank
gets the same number of batches (DDP needs it: a rank with one batch fewer would leave the others
waiting in all-reduce). When shards differ by one sample and that sample would start a batch of
its own, it joins the rank's last batch instead (a batch of B + 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from yolofeed.errors import ConfigError


def fraction_subset(n_tried: int, kept_positions: np.ndarray, fraction: float | int) -> np.ndarray:
    """Pack indices Ultralytics would train on for ``fraction``: the first ``round(n * fraction)`` of the
    sorted source files (or the first ``fraction`` files if it is an int), less those the pack skipped.

    Args:
        n_tried: how many source files the pack considered (sorted, as Ultralytics lists them).
        kept_positions: (N,) position of each pack sample in that sorted list.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or fraction <= 0:
        raise ConfigError(f"fraction={fraction}: expected a fraction in (0, 1] or a number of images")
    count = fraction if isinstance(fraction, int) and fraction > 1 else max(1, round(n_tried * float(fraction)))
    return np.nonzero(kept_positions < count)[0]


@dataclass
class EpochSampler:
    """Batches of one rank for one epoch; ``set_epoch`` reshuffles (Ultralytics calls it under DDP).

    Args:
        indices: the sample indices to draw from (all, or a ``fraction`` subset).
        batch_size: per-rank batch size.
        seed: the shuffle seed (Ultralytics' ``args.seed``); epoch e uses seed + e.
    """

    indices: np.ndarray
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    rank: int = 0
    world_size: int = 1
    drop_last: bool = False
    epoch: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.indices = np.asarray(self.indices, dtype=np.int64)
        if self.batch_size < 1:
            raise ConfigError(f"batch={self.batch_size}: expected at least 1 image per batch")
        if len(self.indices) < self.world_size:
            raise ConfigError(f"{len(self.indices)} images cannot be shared by {self.world_size} GPUs; "
                              "use fewer devices or a larger dataset/fraction")

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _shard(self) -> np.ndarray:
        order = self.indices
        if self.shuffle:
            rng = np.random.default_rng([self.seed, self.epoch])
            order = order[rng.permutation(len(order))]
        q, r = divmod(len(order), self.world_size)
        start = self.rank * q + min(self.rank, r)
        return order[start:start + q + (self.rank < r)]

    def batches(self) -> list[np.ndarray]:
        """This rank's batches for the current epoch."""
        shard, b = self._shard(), self.batch_size
        q = len(self.indices) // self.world_size  # the smallest shard: every rank gets its batch count
        if self.drop_last:
            nb = q // b
            return [shard[k * b:(k + 1) * b] for k in range(nb)]
        nb = max(1, math.ceil(q / b))
        out = [shard[k * b:(k + 1) * b] for k in range(nb)]
        if len(shard) > nb * b:  # the one extra sample of a larger shard joins the last batch
            out[-1] = shard[(nb - 1) * b:]
        return out

    def __len__(self) -> int:
        """Samples this rank sees per epoch (as a DataLoader sampler's length)."""
        return int(sum(len(x) for x in self.batches()))

    def num_batches(self) -> int:
        q = len(self.indices) // self.world_size
        return q // self.batch_size if self.drop_last else max(1, math.ceil(q / self.batch_size))

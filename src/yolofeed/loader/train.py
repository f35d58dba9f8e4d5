"""The training loader Ultralytics' trainer iterates: sampler + prefetcher + the attributes it reads."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from yolofeed.loader.dataset import PackDataset, source_positions
from yolofeed.loader.labels import LabelView
from yolofeed.loader.prefetch import LoadedBatch, Prefetcher
from yolofeed.loader.sampler import EpochSampler, fraction_subset
from yolofeed.pack import Pack


class TrainLoader:
    """Batches of raw (un-augmented) pack samples on the training device, one epoch per iteration.

    The trainer reads ``len(loader)``, ``.dataset.labels``, ``.sampler.set_epoch`` (DDP),
    ``.batch_size``, ``.num_workers``, ``.drop_last``, ``.reset()`` and ``.close()``. Each iteration
    without an explicit ``set_epoch`` moves to the next epoch's shuffle, as a shuffling DataLoader does.
    While an epoch ends, the loader thread goes on into the next epoch's first batches (``Prefetcher``);
    ``prime()`` starts the current epoch's before it is iterated.

    Args:
        pack: the training split's pack.
        batch_size: per-rank batch.
        device: where batches are delivered (the trainer's device).
        fraction: Ultralytics' ``fraction`` (share or count of the sorted source files).
        sync: gather in the calling thread (tests, debugging).
        decode: how jpeg packs are decoded: "auto", "torchvision" (on ``device``) or "cv2" (see ``Prefetcher``).
        classes, single_cls: Ultralytics' keys: keep only these class ids; make every class id 0 (``LabelView``).
        across_epochs: load the next epoch's first batches while an epoch ends (False: each epoch starts its
            loading when it is iterated).
    """

    def __init__(self, pack: Pack, batch_size: int, device: torch.device | str, seed: int = 0, rank: int = 0,
                 world_size: int = 1, fraction: float | int = 1.0, drop_last: bool = False, slots: int = 3,
                 sync: bool = False, decode: str = "auto", classes: int | list[int] | None = None,
                 single_cls: bool = False, across_epochs: bool = True):
        indices = subset(pack, fraction)
        labels = LabelView.of(pack, classes, single_cls)
        self.dataset = PackDataset(pack, indices, labels)
        self.sampler = EpochSampler(indices, batch_size, seed=seed, rank=rank, world_size=world_size,
                                    drop_last=drop_last)
        self.batch_size, self.drop_last, self.across_epochs = batch_size, drop_last, across_epochs
        self.num_workers = 0  # no worker processes (Ultralytics prints this): one gather thread, the GPU does the rest
        self.prefetcher = Prefetcher(pack, device, batch_size + 1, slots=slots, sync=sync, decode=decode, labels=labels)

    def __len__(self) -> int:
        return self.sampler.num_batches()

    def __iter__(self) -> Iterator[dict]:
        batches = self.sampler.batches()
        self.sampler.epoch += 1  # the next epoch reshuffles unless set_epoch says otherwise
        then = self.sampler.batches() if self.across_epochs else None  # a permutation: ~2 ms at 118k images
        for b in self.prefetcher.iterate(batches, then):
            yield _as_dict(b)

    def prime(self) -> None:
        """Start loading the current epoch's first batches now (the trainer does before its warm-up)."""
        self.prefetcher.start(self.sampler.batches())

    def reset(self) -> None:
        """Ultralytics calls this after close_mosaic to restart its workers with the dataset's new mosaic setting.

        Nothing to do: these batches are raw samples, which close_mosaic does not change (the augmenter is
        switched), so those already loaded for the epoch stay.
        """

    def stop_soon(self) -> None:
        self.prefetcher.stop_soon()

    def close(self) -> None:
        self.prefetcher.close()

    def release(self) -> None:
        """``close``, and let go of the pack and the buffers for good (``Prefetcher.release``)."""
        self.prefetcher.release()
        self.dataset.release()


def subset(pack: Pack, fraction: float | int) -> np.ndarray:
    """The pack samples Ultralytics uses for a split's ``fraction`` (a share or a count of its sorted files)."""
    if fraction == 1.0:
        return np.arange(len(pack))
    return fraction_subset(pack.header["counts"].get("tried", len(pack)), source_positions(pack), fraction)


def _as_dict(b: LoadedBatch) -> dict:
    """The trainer treats a batch as a dict; ``preprocess_batch`` turns ``source`` into Ultralytics' batch."""
    return {"source": b.source, "im_file": b.im_file, "indices": b.indices}

"""The ceiling: Ultralytics' own trainer fed batches that already sit on the GPU.

``CeilingTrainer`` takes a few real augmented batches from the stock loader once, moves them to
the device and replays them for the whole epoch. No data pipeline can beat it under the same
trainer, so it is the denominator of every ratio ``yolofeed bench`` reports.
"""

from __future__ import annotations

from collections.abc import Iterator

from yolofeed.train.loss import CANDIDATES
from yolofeed.train.step import SyncFreeStep, counts_for_ultralytics_batch
from yolofeed.ultralytics_seam import DetectionTrainer, OBBTrainer, PoseTrainer, SegmentationTrainer

REPLAYED = 4  # augmented batches held on the GPU and replayed in turn


class _EpochlessSampler:
    def __init__(self, n: int):
        self.n = n

    def set_epoch(self, epoch: int) -> None:
        pass

    def __len__(self) -> int:
        return self.n


class ReplayLoader:
    """Yields ``length`` batches cycling through ``batches`` (dicts of device tensors), like a DataLoader."""

    def __init__(self, batches: list[dict], length: int, dataset, batch_size: int):
        self.batches, self.length, self.dataset, self.batch_size = batches, length, dataset, batch_size
        self.sampler = _EpochlessSampler(length * batch_size)
        self.num_workers, self.drop_last = 0, False

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[dict]:
        for k in range(self.length):
            yield dict(self.batches[k % len(self.batches)])  # a copy: preprocess_batch replaces img in place

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


class Ceiling(SyncFreeStep):
    """Before an Ultralytics trainer in the bases: its training loader replays ``REPLAYED`` augmented batches from
    device memory (``CeilingTrainer``: detection's; ``CeilingPoseTrainer``: pose's).

    Its step is yolofeed's (``SyncFreeStep``), so that the ceiling differs from yolofeed in the data alone:
    the loss's counts (train/loss/) are read once per replayed batch, as soon as the loss can say.
    """

    def preprocess_batch(self, batch: dict) -> dict:
        if self.sync_free_loss:
            known, key = self.__dict__.setdefault("_counts", {}), id(batch["batch_idx"])  # the replayed tensors
            counts = known.get(key) or counts_for_ultralytics_batch(self, batch) or {}
            if CANDIDATES in counts:
                known[key] = counts  # complete: read (with syncs) once per replayed batch
            batch = {**batch, **counts}
        return super().preprocess_batch(batch)

    def get_dataloader(self, dataset_path, batch_size: int = 16, rank: int = 0, mode: str = "train"):
        loader = super().get_dataloader(dataset_path, batch_size, rank, mode)
        if mode != "train":
            return loader
        batches = []
        for batch in loader:
            batches.append({k: v.to(self.device, non_blocking=True) if hasattr(v, "to") else v
                            for k, v in batch.items()})
            if len(batches) == REPLAYED:
                break
        replay = ReplayLoader(batches, len(loader), loader.dataset, loader.batch_size)
        if hasattr(loader, "close"):
            loader.close()  # its workers are not needed any more
        return replay


class CeilingTrainer(Ceiling, DetectionTrainer):
    """``DetectionTrainer`` whose training loader replays ``REPLAYED`` augmented batches from device memory."""


class CeilingPoseTrainer(Ceiling, PoseTrainer):
    """``PoseTrainer`` whose training loader replays ``REPLAYED`` augmented batches, keypoints too, from the device."""


class CeilingOBBTrainer(Ceiling, OBBTrainer):
    """``OBBTrainer`` whose training loader replays ``REPLAYED`` augmented batches, oriented boxes too, from the
    device."""


class CeilingSegmentationTrainer(Ceiling, SegmentationTrainer):
    """``SegmentationTrainer`` whose training loader replays ``REPLAYED`` augmented batches, masks too, from the
    device."""


CEILINGS = {"detect": CeilingTrainer, "pose": CeilingPoseTrainer, "obb": CeilingOBBTrainer,
            "segment": CeilingSegmentationTrainer}

"""The trainers of the other tasks, each ``FastTrainer`` before Ultralytics' own: pose (keypoints), oriented boxes
(corners, with the copy-paste bound) and segmentation (masks made on the device, their rasteriser's room learnt and
checked once an epoch); and ``TRAINERS``, the trainer of each task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from yolofeed.augment import GpuAugment
from yolofeed.augment.masks import MaskedAugment
from yolofeed.train import options
from yolofeed.train.bounds import LabelBound, sources
from yolofeed.train.trainer import FastDetectionTrainer, FastTrainer
from yolofeed.ultralytics_seam import LOGGER, RANK, OBBTrainer, PoseTrainer, SegmentationTrainer, world_size


class FastPoseTrainer(FastTrainer, PoseTrainer):
    """``PoseTrainer`` with a GPU-resident data pipeline: keypoints in the pack (a pose pack, ``task=pose``), through
    every augmentation op (``flip_idx`` from the data yaml), to Ultralytics' pose loss and validator.

    Use it as ``YOLO("yolo11n-pose.yaml").train(trainer=FastPoseTrainer, data=...)``; ``yolofeed train`` picks it for
    a pose model.
    """

    carried_task = "pose"


class FastOBBTrainer(FastTrainer, OBBTrainer):
    """``OBBTrainer`` with a GPU-resident data pipeline: each oriented box's corners in the pack (an OBB pack,
    ``task=obb``), through every augmentation op as Ultralytics moves them (100 points on the box's edges), to the
    minimum-area rectangle Ultralytics' OBB loss and validator take.

    Use it as ``YOLO("yolo11n-obb.yaml").train(trainer=FastOBBTrainer, data=...)``; ``yolofeed train`` picks it for
    an OBB model.

    With ``copy_paste`` the copies a batch fills are bounded by the training set's labels (``_paste_capacity``), not
    every padded copy slot: the fill's cost follows the slots it is given, and one crowded image (a DOTA tile of
    hundreds of boxes) widens every row's. Copies past the bound are counted; an epoch that lost some says so, and
    from the next one every slot is filled (a resumed run tries the bound again: one more such epoch at most).
    """

    carried_task = "obb"

    def __init__(self, cfg=None, overrides: dict[str, Any] | None = None, _callbacks: dict | None = None):
        super().__init__(cfg, overrides, _callbacks)
        self._paste_bound = LabelBound()  # copy-paste's copies a batch
        self.add_callback("on_train_epoch_end", type(self)._check_pastes)

    def _new_augment(self) -> GpuAugment:
        return GpuAugment(self.hyp, paste_capacity=self._paste_capacity())

    def _paste_capacity(self) -> int | None:
        """The most copies a batch pastes: the labels' bound on the instances of its source images (``LabelBound``:
        the mean plus 6 standard deviations of their sum, plus the most in one image in every tile of a row); None
        (every copy slot) without copy-paste, before the loader, for a batch of few source images, or once a bound
        fell short."""
        if self.hyp.copy_paste <= 0 or self._warm is None:
            return None
        return self._paste_bound.capacity(self._warm[0].batch_size, sources(self.hyp), self._label_stats)

    def _augment_source(self, source):
        out = super()._augment_source(source)
        self._paste_bound.count(out.paste_lost)  # read once an epoch (_check_pastes)
        return out

    def _check_pastes(self) -> None:
        """At each epoch's end: whether copy-paste left copies out this epoch. If so, one warning, and from the next
        epoch every copy slot is filled (the augmentation's graphs made again). Under DDP every rank takes the same
        decision."""
        lost = self._paste_bound.epoch_past(self.device, world_size(self))
        if not lost:
            return
        if not self._paste_bound.on:  # every slot filled, each given any quadrilateral's most events: not expected
            LOGGER.warning(f"yolofeed: epoch {self.epoch + 1}: copy_paste left {lost} copies or fill events out with "
                           "every copy slot filled; those copies were not pasted, labels and pixels alike")
            return
        self._paste_bound.on, self._augment = False, None
        last = self.epoch + 1 >= self.epochs
        LOGGER.warning(f"yolofeed: epoch {self.epoch + 1}: copy_paste left {lost} copies out, beyond the copies a "
                       "batch was bounded to from the training set's labels"
                       + ("" if last else "; from the next epoch every copy slot is filled (exact, and slower)"))


class FastSegmentationTrainer(FastTrainer, SegmentationTrainer):
    """``SegmentationTrainer`` with a GPU-resident data pipeline: each instance's polygon in the pack (a segment pack,
    ``task=segment``), through every augmentation op as Ultralytics moves it, then made into ``Format``'s masks on the
    device (``augment.masks.MaskedAugment``: ``cv2.fillPoly`` and ``cv2.resize`` pixel for pixel, ``mask_ratio`` and
    ``overlap_mask`` honoured, the labels in Ultralytics' area order), for Ultralytics' ``v8SegmentationLoss`` as it is
    and its validator (validation masks made the same way after the letterbox, ``ValLoader``).

    Use it as ``YOLO("yolo11n-seg.yaml").train(trainer=FastSegmentationTrainer, data=...)``; ``yolofeed train`` picks it
    for a segmentation model. With ``sync_free_loss`` the segment loss is ``train.loss.SyncFreeSegmentLoss`` (a few
    host syncs a step where Ultralytics' makes about 5 an image; the mask loss batched over the images, the same to
    float32's rounding).
    """

    carried_task = "segment"

    def __init__(self, cfg=None, overrides: dict[str, Any] | None = None, _callbacks: dict | None = None):
        super().__init__(cfg, overrides, _callbacks)
        self._dropped: torch.Tensor | None = None  # rasterisation events dropped this epoch, on the device
        self._past: torch.Tensor | None = None  # instances past the rasteriser's capacity this epoch, on the device
        self._most: torch.Tensor | None = None  # the most instances one batch held this epoch, on the device
        self._capacity: int | None = None  # polygons a batch rasterises, learnt from the first epoch's batches
        self._learnt = False  # learnt once: not again after a capacity that fell short
        self._masked: MaskedAugment | None = None  # the current augmenter's masks step (its capacity in use)
        self.add_callback("on_train_epoch_end", type(self)._check_masks)

    def _new_augment(self) -> MaskedAugment:
        self._masked = MaskedAugment(self.hyp, int(self.args.mask_ratio), bool(self.args.overlap_mask),
                                     self.mask_room, self._label_stats, self._capacity, self._polygon_capacity())
        return self._masked

    def _augment_source(self, source):
        out = super()._augment_source(source)
        if out.masks is not None:  # device ops per batch, read once an epoch (_check_masks): no sync here
            # under GraphedAugment the graph's memory: read before the next replay
            overflow, past, held = out.masks.overflow, out.masks.past, out.valid.sum()
            first = self._dropped is None
            self._dropped = overflow.clone() if first else self._dropped + overflow
            self._past = past.clone() if first else self._past + past
            self._most = held if first else torch.maximum(self._most, held)
        return out

    def _check_masks(self) -> None:
        """At each epoch's end (one host sync, where Ultralytics' own epoch end syncs anyway): whether the rasteriser
        ran out of event slots for some polygon, or of capacity for some batch's instances, this epoch, and the most
        instances a batch held. Under DDP every rank takes the same decision (``ranks_agree``).

        An overflow is warned, not raised (a long run keeps going): those masks lacked some rows or were empty.
        Capacity learnt from the first epoch that fell short goes back to the training set's bound, for good. Any
        other overflow doubles the room (event slots and capacity; the augmentation's graphs are made again), which
        yolofeed.yaml records (``mask_room``) for a resume. After a first epoch without one, the capacity is learnt
        (``MaskedAugment.learnt``: 1.5 times the most a batch held, the largest image in every tile of a row added),
        used where it is below the label bound: the fill's cost follows its capacity."""
        zero = torch.zeros((), dtype=torch.long, device=self.device)
        if self._dropped is None and world_size(self) <= 1:
            return
        counts = torch.stack([zero if t is None else t.to(zero.device) for t in (self._dropped, self._past)]
                             + [zero - 1 if self._most is None else self._most.to(zero.device)]).long()  # -1: none seen
        if world_size(self) > 1:  # every rank calls the collective at every epoch end, batches or not
            counts = ranks_agree(counts)
        (dropped, past, most), self._dropped, self._past, self._most = counts.tolist(), None, None, None
        if not dropped and not past:
            self._learn(most)
            return
        if past and not dropped and self._capacity is not None:
            self._capacity, self._augment = None, None
            LOGGER.warning(f"yolofeed: epoch {self.epoch + 1}: {past} instances beyond the mask capacity learnt from "
                           "the first epoch, so their training masks were empty; from the next epoch the capacity "
                           "is the training set's bound again")
            return
        self._capacity = None
        lost = (f"yolofeed: epoch {self.epoch + 1}: {dropped + past} polygons or polygon edge events did not fit the "
                "mask rasteriser's slots, so some training masks were empty or missed rows"
                + (", or some copies were not pasted (copy_paste)" if self.hyp.copy_paste > 0 else ""))
        if self.mask_room >= options.MASK_ROOM_MOST:
            LOGGER.warning(f"{lost}; the room is already at its most (mask_room={self.mask_room}): some polygon needs "
                           "more edge events than that; simplify the longest outlines (e.g. cv2.approxPolyDP)")
            return
        self.mask_room *= 2
        self._augment = None
        last = self.epoch + 1 >= self.epochs
        LOGGER.warning(f"{lost}; " + (f"a run with mask_room={self.mask_room} avoids it" if last else
                                      f"from the next epoch it has {self.mask_room}x its default slots (more memory "
                                      "and time a batch)"))
        if RANK in (-1, 0):
            try:
                options.record(self.save_dir, self.run_options())
            except OSError as e:  # the run goes on with the room; only a resume would start without it
                LOGGER.warning(f"yolofeed: could not record mask_room={self.mask_room} in "
                               f"{Path(self.save_dir) / options.FILE} ({e.strerror or e}); a resume of this run "
                               f"needs mask_room={self.mask_room} given again")

    def _learn(self, most: int) -> None:
        """Once, after an epoch without an overflow that is not the last: the capacity learnt from its batches (the
        same on every DDP rank: from the agreed most). The augmenter is made again where it is below the full
        batch's label bound (else the capacity in use stays, and the graphs with it)."""
        if self._learnt or most < 0 or self.epoch + 1 >= self.epochs or self._masked is None:
            return
        self._learnt = True
        self._capacity = self._masked.learnt(most)
        bound = self._masked.bound(self.batch_size)
        if bound is not None and self._capacity < bound:
            self._augment = None  # graphs for the new capacity (a capture, once)


def ranks_agree(counts: torch.Tensor) -> torch.Tensor:
    """The masks' epoch counts of every DDP rank, (events dropped, instances past the capacity, the most instances a
    batch held): the first two summed, the last the most of any rank. Every rank calls it at every epoch end
    (torch.distributed collectives)."""
    import torch.distributed as dist

    summed, most = counts[:2].clone(), counts[2:].clone()
    dist.all_reduce(summed)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return torch.cat([summed, most])


TRAINERS = {"detect": FastDetectionTrainer, "pose": FastPoseTrainer, "obb": FastOBBTrainer,  # keys.TRAINED names them
            "segment": FastSegmentationTrainer}

"""The GPU augmentation of the batches a run trains on: the partner pool (Ultralytics' buffer), the augmenter (one CUDA
graph replay a batch on CUDA) and its draws, the bound on the polygons the perspective moves, Ultralytics'
``preprocess_batch`` and close_mosaic.

``Augmenting`` stands before Ultralytics' trainer in ``FastTrainer``'s bases. The augmenter is made again after
close_mosaic, a new loader or more mask room (its graphs captured again: seconds, once each); its draws continue one
generator's sequence.
"""

from __future__ import annotations

import dataclasses

import torch

from yolofeed.augment import GpuAugment
from yolofeed.augment.pool import PartnerPool, ultralytics_capacity
from yolofeed.pack.space import gb
from yolofeed.train import options
from yolofeed.train.bounds import sources
from yolofeed.ultralytics_seam import LOGGER, RANK, start_epoch, world_size


class Augmenting:
    """The augmentation of a ``FastTrainer``: a mixin before Ultralytics' trainer."""

    def _partner_pool(self, n_images: int, batch_size: int, imgsz: int, labels: int = 0,
                      polygon_points: int = 0) -> PartnerPool | None:
        """The pool of recent images partners are drawn from, sized by ``partner_pool``; None: the batch itself.
        ``labels`` and ``polygon_points``: the most labels an image has and points a polygon has, for the memory
        line (``PartnerPool.nbytes``)."""
        size = options.partner_pool_size(self.partner_pool)
        given = size != "auto"
        if not given:
            size = ultralytics_capacity(n_images, batch_size)
        if size == 0:
            LOGGER.info("yolofeed: partner_pool=0, mosaic/MixUp/CutMix partners come from the batch itself")
            return None
        pool = PartnerPool(size, batch_size + 1)  # the sampler's last batch may hold one image more
        if RANK in (-1, 0):
            held = gb(pool.nbytes(imgsz, labels, polygon_points))
            how = f"partner_pool={size}" if given else "as Ultralytics' buffer"
            LOGGER.info(f"yolofeed: mosaic/MixUp/CutMix partners from the last {pool.keep} images loaded, {how} "
                        f"({held} of {'GPU ' if self.device.type == 'cuda' else ''}memory; partner_pool=N for fewer)")
        return pool

    def _new_augment(self) -> GpuAugment:
        """The augmentation of this task's batches (``FastSegmentationTrainer``: with Format's masks)."""
        return GpuAugment(self.hyp, polygon_capacity=self._polygon_capacity())

    def _polygon_capacity(self) -> int | None:
        """The most polygons the perspective moves a batch: the labels' bound on the instances of its source images
        (``LabelBound``; copy-paste's copies count as many again). None (every slot) without polygons, before the
        loader, for a batch of few source images, or once a bound fell short."""
        if not self._polygons_kept or self._warm is None:
            return None
        return self._polygon_bound.capacity(self._warm[0].batch_size, sources(self.hyp, self.hyp.copy_paste > 0),
                                            self._label_stats)

    def _check_polygons(self) -> None:
        """At each epoch's end, while the polygons are bounded: whether the bound left instances unmoved this epoch.
        If so, one warning, and from the next epoch every slot is moved (the augmentation's graphs made again; a
        resumed run tries the bound again). Under DDP every rank takes the same decision."""
        bound = self._polygon_bound
        if not self._polygons_kept or not bound.on:  # the same on every rank
            return
        n = bound.epoch_past(self.device, world_size(self))
        if not n:
            return
        bound.on, self._augment = False, None
        last = self.epoch + 1 >= self.epochs
        LOGGER.warning(f"yolofeed: epoch {self.epoch + 1}: {n} instances were not moved by the perspective, beyond "
                       "the polygons a batch was bounded to from the training set's labels; those of them its crop "
                       "would have kept were left out of their batches"
                       + ("" if last else "; from the next epoch every polygon slot is moved (exact, and slower)"))

    def _augmenter(self):
        """The augmentation, made again after close_mosaic, a new loader or more mask room; its draws continue one
        generator's sequence (a new augmenter seeded again would repeat the first epoch's draws)."""
        if self._augment is None:
            aug = self._new_augment()
            if self._generator is None:
                cuda = self.device.type == "cuda"
                self._generator = torch.Generator(device=self.device if cuda else "cpu")
                # ranks draw differently; a resumed run from where it starts, not epoch 1's draws again (the state is
                # not in the checkpoint)
                self._generator.manual_seed(self.args.seed + 1000 * max(RANK, 0) + 1_000_003 * start_epoch(self))
            if self.device.type == "cuda":
                from yolofeed.augment.graphs import GraphedAugment

                self._augment = GraphedAugment(aug, generator=self._generator, device=self.device, pool=self._pool,
                                               before_capture=self._settle_overlapped)
            else:
                gen, pool = self._generator, self._pool
                self._augment = lambda b: aug(b, gen, pool)
        return self._augment

    def _augment_source(self, source):
        """The current augmenter (looked up per batch: close_mosaic replaces it) applied to a loader batch."""
        # the trainer may call this under autocast: the augmentation's arithmetic must stay float32/64
        with torch.autocast(self.device.type, enabled=False):
            out = self._augmenter()(source)
        self._polygon_bound.count(out.polygons_past)  # read once an epoch (_check_polygons)
        if out.segments is not None and out.masks is None and self.carried_task == "detect":
            out = dataclasses.replace(out, segments=None)  # the polygons made its boxes; a detection batch has none
        return out

    def preprocess_batch(self, batch: dict) -> dict:
        """Ultralytics' preprocessing; a raw loader batch (``augment_ahead=False``) is augmented first.

        ``AugmentAhead`` batches and the validator's are already Ultralytics' batches: stock path.
        """
        if "source" not in batch:
            self.batch_images = len(batch["img"])
            return super().preprocess_batch(batch)
        # boolean indexing learns N: a host sync, which AugmentAhead avoids
        out = self._augment_source(batch["source"]).to_ultralytics()
        out["im_file"] = batch["im_file"]
        self.batch_images = len(out["img"])
        return super().preprocess_batch(out)  # img.float() / 255 and multi_scale, as Ultralytics does

    def _close_dataloader_mosaic(self):
        """Ultralytics' close_mosaic: mosaic, mixup, cutmix and copy_paste off for the last epochs."""
        LOGGER.info(f"yolofeed: closing mosaic (yolofeed's augmentation on {self.device.type})")
        self.hyp = self.hyp.closed()
        self._augment = None

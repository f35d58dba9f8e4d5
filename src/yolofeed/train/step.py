"""Ultralytics' training step without its host sync between the backward pass and the next forward.

A sync drains the GPU's queue: the host waits for the last kernel, then the GPU idles while the host
launches the next work one kernel at a time. After the backward pass Ultralytics' step has one (its
AdamW is fused, so ``GradScaler.step`` keeps ``found_inf`` on the GPU): the progress bar formats the
running loss means, ``%11.4g`` of GPU tensors. The criterion's loss items are returned one step late
instead, already copied to the host (``HostLossItems``), so the bar reads them without waiting. The
epoch's mean loss, which goes to results.csv and the loggers, is still exact: it is accumulated on the
GPU and put back before ``on_train_epoch_end``.

Without it the host launches the optimiser, the EMA, the next batch (the loader's copy, the augmentation)
and its forward pass while the GPU still runs the backward pass, and the GPU does not wait for them. The
next sync is in Ultralytics' loss, which reads the forward's results (16 a step in yolo11n's loss).
"""

from __future__ import annotations

from typing import Any

import torch

from yolofeed import ultralytics_seam as seam
from yolofeed.train import graphed
from yolofeed.train import loss as train_loss
from yolofeed.train.musgd import FastMuSGD


class HostLossItems:
    """Proxy of a criterion that returns the previous step's loss items, already copied to the host.

    The loss for the backward pass is returned as is. The items (a dict of 0-d tensors: box, cls, dfl)
    are copied to pinned host memory without blocking; the next call returns them once that copy's event
    has completed (long before: a whole step later), so reading them never waits for the GPU. The first
    call of a run has no previous step and waits for its own copy. ``epoch_mean`` is the exact mean of
    the items since ``reset``, on the device. Attributes the trainer looks up (``update`` for YOLO26's
    end-to-end loss, ``hyp``...) are the criterion's.
    """

    def __init__(self, criterion: Any):
        self.criterion = criterion
        self._pending: tuple[list[str], torch.Tensor, torch.cuda.Event | None] | None = None
        self._sum: torch.Tensor | None = None
        self._n = 0

    def __deepcopy__(self, memo: dict) -> HostLossItems:
        """A copy of the criterion with nothing in flight: Ultralytics deep-copies the model (its EMA, the NaN
        recovery's reload), and a CUDA event cannot be copied."""
        import copy

        return HostLossItems(copy.deepcopy(self.criterion, memo))

    def __getstate__(self) -> dict:
        """Pickled (a checkpoint, a DDP launch) without the step in flight."""
        return {"criterion": self.criterion, "_pending": None, "_sum": None, "_n": 0}

    def __getattr__(self, name: str) -> Any:  # only for names not found on the proxy itself
        if "criterion" not in self.__dict__:  # half-built (copy, pickle): no criterion to ask yet
            raise AttributeError(name)
        return getattr(self.__dict__["criterion"], name)

    def __call__(self, preds: Any, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, items = self.criterion(preds, batch)
        names = list(items)
        values = torch.stack([items[k].detach().float().reshape(()) for k in names])
        self._sum = values if self._sum is None else self._sum + values
        self._n += 1
        previous = self._pending
        if values.device.type == "cuda":
            host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            host.copy_(values, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            host, event = values.clone(), None
        self._pending = (names, host, event)
        if previous is None:
            previous = self._pending  # the run's first step: its own items (one sync)
        names, host, event = previous
        if event is not None:
            event.synchronize()  # completed a step ago: returns at once
        return loss, {k: host[i] for i, k in enumerate(names)}

    def reset(self) -> None:
        """Start the next epoch's mean."""
        self._sum, self._n = None, 0

    def epoch_mean(self) -> dict[str, torch.Tensor] | None:
        """The mean of this epoch's loss items (device tensors), or None before the first step."""
        if self._sum is None or self._pending is None:
            return None
        mean = self._sum / self._n
        return {k: mean[i] for i, k in enumerate(self._pending[0])}


class SyncFreeStep:
    """Trainer mixin (before ``DetectionTrainer`` in the bases): the loss items reach the host a step late.

    ``sync_free_step = False`` leaves Ultralytics' step as it is (for side-by-side measurement).
    ``sync_free_loss`` makes the detection loss read its counts from the batch (train/loss/) instead of
    syncing for them; ``False`` keeps Ultralytics' loss as it is. ``fast_musgd`` steps the MuSGD Ultralytics builds
    (``optimizer=MuSGD``, or ``auto`` past 10,000 iterations) as one CUDA graph (train/musgd.py); ``False`` keeps
    Ultralytics' own. ``graphed_step`` replays the model's forward and backward as CUDA graphs with batch norm and
    SiLU fused (train/graphed.py); ``False`` keeps them eager, as Ultralytics'. ``half_input`` makes the step's input
    image in the autocast's dtype from the batch's uint8 in one kernel (``step_input_dtype``); ``False`` keeps
    Ultralytics' float32 image, which the first convolution casts.
    """

    sync_free_step: bool = True
    sync_free_loss: bool = True
    fast_musgd: bool = True
    graphed_step: bool = True
    half_input: bool = True

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.sync_free_step:
            self.add_callback("on_train_start", _install_host_items)
            self.add_callback("on_train_epoch_start", _reset_items)
            # first: Ultralytics' loggers (TensorBoard, ...) read trainer.tloss in the same event
            seam.run_first(self, "on_train_epoch_end", _exact_epoch_loss)
        if self.sync_free_loss:
            self.add_callback("on_train_start", lambda t: train_loss.install(t.model))
            self.add_callback("on_train_epoch_end", lambda t: train_loss.check_counts(t.model))
        if self.graphed_step:
            self.add_callback("on_train_start", lambda t: graphed.install(t))

    def step_input_dtype(self) -> torch.dtype | None:
        """The dtype ``half_input`` makes the step's input image in: the step's autocast dtype (float16, or bfloat16
        under ``amp=bf16``) on CUDA, where the model's first layer is a convolution that takes the image alone (its
        autocast cast is then the first thing done to the image: the same values, one kernel instead of three) and
        one image size serves every batch (``multi_scale`` resizes the float32 image); else None: Ultralytics'
        float32 image. None until Ultralytics' set-up has decided ``amp``."""
        if not self.half_input or self.device.type != "cuda" or (getattr(self.args, "multi_scale", 0) or 0) > 0:
            return None
        if getattr(self, "amp", None) is None or getattr(self, "model", None) is None:
            return None
        amp = seam.step_autocast(self)
        if not amp or not seam.image_feeds_a_convolution(self.model):
            return None
        return amp if isinstance(amp, torch.dtype) else torch.float16

    def step_image(self, img: torch.Tensor) -> torch.Tensor:
        """The step's input from a batch's image (uint8, or float in [0, 255]): scaled in ``step_input_dtype``, or
        Ultralytics' float32 copy still to be divided by its ``preprocess_batch``."""
        dtype = self.step_input_dtype()
        return img.float() if dtype is None else seam.scaled_input(img, dtype)

    def preprocess_batch(self, batch: dict) -> dict:
        """Ultralytics' ``preprocess_batch``; with ``half_input`` the image is scaled here, in the autocast's dtype
        (already, where it comes so), and Ultralytics' own ``img.float() / 255`` runs on an empty slice of it."""
        dtype = self.step_input_dtype()
        if dtype is None:
            return super().preprocess_batch(batch)
        img = batch["img"]
        if img.dtype != dtype:  # uint8 from a loader: not yet scaled
            img = seam.scaled_input(img.to(self.device, non_blocking=True), dtype)
        out = super().preprocess_batch({**batch, "img": img[:0]})  # the other tensors moved as Ultralytics moves them
        out["img"] = img
        return out

    def plot_training_samples(self, batch: dict, ni: int) -> None:
        """Ultralytics' train_batch grid, drawn from the images it shows: the first ``seam.train_grid_shown()`` (16)
        of the batch. ``plot_images`` copies the whole batch it gets to the host as float32 and multiplies it by 255
        before drawing its first 16: for a batch of 128 at 640, 630 MB copied from the GPU and 1.26 GB written on the
        host, three times in the first epoch, beside its training. The same grid (tests/test_plots.py): its boxes,
        masks (per image with ``overlap_mask``) and keypoints are picked by image index, its file names by position.

        A ``half_input`` image is handed over as stock's float32 ``img / 255``. ``plot_images`` truncates
        ``img * 255`` to uint8, and float16's ``k / 255`` times 255 falls below k for 131 of the 256 levels: the plot
        would come out a level darker there. Rounding recovers k exactly (float16's and bfloat16's error times 255 is
        below 0.5), then Ultralytics' division."""
        img = batch["img"]
        shown = seam.train_grid_shown()
        if shown is not None:
            img = img[:shown]
        if img.dtype in (torch.float16, torch.bfloat16):
            img = seam.scaled_input((img.float() * 255).round(), torch.float32)
        super().plot_training_samples({**batch, "img": img}, ni)

    def build_optimizer(self, *args: Any, **kwargs: Any):
        """Ultralytics' optimiser; a MuSGD it builds steps as ``FastMuSGD`` (the same groups and state)."""
        optimizer = super().build_optimizer(*args, **kwargs)
        if not self.fast_musgd:
            return optimizer
        if not seam.copy_serves("ultralytics.optim.muon.muon_update"):  # 8.4.138: its update is another arithmetic
            if type(optimizer) is seam.MuSGD:
                seam.LOGGER.info(f"yolofeed: Ultralytics {seam.VERSION}'s MuSGD steps as it is (fast_musgd copies the "
                                 "update of 8.4.139 on, which this release computes otherwise)")
            return optimizer
        optimizer = FastMuSGD.adopt(optimizer)
        if isinstance(optimizer, FastMuSGD):  # its graph, captured again after a re-plan, waits for a validation beside
            optimizer.before_capture = getattr(self, "_settle_overlapped", None)
        return optimizer


def _items(trainer: Any) -> HostLossItems | None:
    criterion = seam.criterion(trainer.model)
    return criterion if isinstance(criterion, HostLossItems) else None


def _install_host_items(trainer: Any) -> None:
    """After the EMA copied the model (the validator's loss, on the EMA, stays Ultralytics' own)."""
    criterion = seam.criterion(trainer.model)
    if not isinstance(criterion, HostLossItems):
        seam.set_criterion(trainer.model, HostLossItems(seam.make_criterion(trainer.model) if criterion is None
                                                        else criterion))


def _sync_free_loss(trainer: Any) -> train_loss.SyncFreeLoss | None:
    """The first sync-free loss (detection, pose or OBB) of the trainer's model, if counts for it make sense now:
    YOLO26's two losses gather the same candidates (the same boxes, anchors and stride_val)."""
    if not getattr(trainer, "sync_free_loss", False) or getattr(trainer.args, "multi_scale", 0) > 0:
        return None  # multi_scale: the next step's image size, and so its anchors, are not known ahead
    losses = [x for x in train_loss.detection_losses(trainer.model) if isinstance(x, train_loss.SyncFreeLoss)]
    return losses[0] if losses else None


def early_candidates_augmented(trainer: Any, out: Any):
    """The loss's candidate count for an ``AugmentedBatch``, on the device, or None (see train/loss/)."""
    loss = _sync_free_loss(trainer)
    return None if loss is None else train_loss.early_candidates_for(loss, out)


def counts_for_ultralytics_batch(trainer: Any, batch: dict) -> dict[str, int] | None:
    """The loss's counts for an Ultralytics batch, read on the host (syncs: for batches used many times).

    Before the loss has made its anchors only ``max_boxes``: a loss call given it makes them (the candidates'
    count needs them), so the next call for the batch can say both. For OBB ``max_boxes`` counts the boxes before
    the loss's tiny-box filter (the padding's bound), and the candidates those it keeps.
    """
    loss = _sync_free_loss(trainer)
    if loss is None or batch["batch_idx"].numel() == 0:
        return None
    n = int(torch.bincount(batch["batch_idx"].long().flatten(), minlength=len(batch["img"])).max())
    gt = train_loss.padded_gt_from_ultralytics(batch, n, loss)
    if gt is None:
        return {train_loss.MAX_BOXES: n}
    return {train_loss.MAX_BOXES: n, train_loss.CANDIDATES: int(loss.early_candidates(gt))}


def _reset_items(trainer: Any) -> None:
    if (items := _items(trainer)) is not None:
        items.reset()


def _exact_epoch_loss(trainer: Any) -> None:
    """The epoch's exact mean loss in place of the bar's running mean of one-step-late items; and as the last
    items, on the device: the validator makes its loss sums ``zeros_like`` them, then adds the EMA's device
    items (host ones fail with a device mismatch on CUDA)."""
    items = _items(trainer)
    mean = items.epoch_mean() if items is not None else None
    if mean is not None:
        seam.set_epoch_loss(trainer, mean)

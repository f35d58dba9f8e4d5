"""Ultralytics' detection loss, minus the two host syncs its target padding costs.

``v8DetectionLoss.preprocess`` pads the batch's boxes into a (B, n, 5) tensor, n being the largest
box count of one image. It learns n on the GPU (``batch_idx.unique(return_counts=True)`` and
``counts.max()``, then n as a shape): two host syncs right after the forward pass. The host then
waits for the whole forward pass and the GPU idles while the host launches the loss's
few hundred small kernels (target assignment) — on the H200 machine the loss took ~8 ms of host
time per yolo11n step, when the GPU was busy 85 % of the time even with data free (the ceiling).

yolofeed knows n before the step: ``AugmentAhead`` copies it to pinned memory one step ahead, and
the ceiling counts its replayed batches once. The batch carries it as ``max_boxes`` (a Python
int), and ``KnownCountLoss.preprocess`` pads with it: the same tensor, built without a sync. A
batch without ``max_boxes`` takes Ultralytics' own path. The remaining sync in the loss is the
foreground ``nonzero`` in ``BboxLoss`` (its gathers need the count), left as Ultralytics has it.
"""

from __future__ import annotations

from typing import Any

import torch
from ultralytics.utils.loss import v8DetectionLoss
from ultralytics.utils.ops import xywh2xyxy
from ultralytics.utils.torch_utils import unwrap_model

KEY = "max_boxes"


class KnownCountLoss(v8DetectionLoss):
    """``v8DetectionLoss`` that pads targets to the batch's ``max_boxes`` when the batch carries it.

    Installed by swapping the class of the model's own criterion (``install``), so its state (the
    assigner, hyperparameters, the E2E schedule around it) stays Ultralytics'.
    """

    _known: int | None = None

    def get_assigned_targets_and_loss(self, preds: dict[str, torch.Tensor], batch: dict[str, Any], **kwargs):
        self._known = batch.get(KEY)
        try:
            return super().get_assigned_targets_and_loss(preds, batch, **kwargs)
        finally:
            self._known = None

    def preprocess(self, targets: torch.Tensor, batch_size: int, scale_tensor: torch.Tensor) -> torch.Tensor:
        """Ultralytics' padding (rows grouped by image, in order), with n given instead of measured."""
        n, (nl, ne) = self._known, targets.shape
        if n is None or nl == 0 or self.device.type == "mps":
            return super().preprocess(targets, batch_size, scale_tensor)
        batch_idx = targets[:, 0].long()
        out = torch.zeros(batch_size, n, ne - 1, device=self.device)
        offsets = torch.zeros(batch_size + 1, dtype=torch.long, device=self.device)
        offsets.scatter_add_(0, batch_idx + 1, torch.ones_like(batch_idx))
        offsets = offsets.cumsum(0)
        within_idx = torch.arange(nl, device=self.device) - offsets[batch_idx]
        out[batch_idx, within_idx] = targets[:, 1:]  # a wrong n: an index error here, never a silent drop
        out[..., 1:5] = xywh2xyxy(out[..., 1:5].mul_(scale_tensor))
        return out


def install(model: torch.nn.Module) -> None:
    """Make the model's detection criterion a ``KnownCountLoss`` (creating it as Ultralytics would).

    Only plain detection losses are swapped (``v8DetectionLoss`` itself, alone or inside YOLO26's
    ``E2ELoss``); segmentation, pose and OBB losses are left alone. Idempotent and cheap: call it
    per step.
    """
    m = unwrap_model(model)
    if getattr(m, "criterion", None) is None:
        if not hasattr(m, "init_criterion"):
            return
        m.criterion = m.init_criterion()
    crit = m.criterion
    for loss in (crit, getattr(crit, "one2many", None), getattr(crit, "one2one", None)):
        if type(loss) is v8DetectionLoss:
            loss.__class__ = KnownCountLoss


def prepare(model: torch.nn.Module, batch: dict, on: bool) -> None:
    """Per training step, before the forward pass: the criterion reads ``max_boxes`` if ``on`` (and the
    batch has it), else the key is dropped and the loss measures the count itself, as Ultralytics does."""
    if on and KEY in batch:
        install(model)
    else:
        batch.pop(KEY, None)


def max_per_image(batch_idx: torch.Tensor, batch_size: int) -> int:
    """The largest box count of one image, from a batch's ``batch_idx`` (syncs if it is on the GPU)."""
    if batch_idx.numel() == 0:
        return 0
    return int(torch.bincount(batch_idx.long().flatten(), minlength=batch_size).max())


__all__ = ["KEY", "KnownCountLoss", "install", "max_per_image", "prepare"]

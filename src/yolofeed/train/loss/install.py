"""Which losses a model's criterion holds, swapping them to the sync-free classes, and the counts they take."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from yolofeed import ultralytics_seam as seam
from yolofeed.train.loss.detect import (
    SyncFreeAssigner,
    SyncFreeBboxLoss,
    SyncFreeDetectionLoss,
    SyncFreeLoss,
    padded_gt_from_augmented,
)
from yolofeed.train.loss.obb import (
    SyncFreeOBBLoss,
    SyncFreeRotatedAssigner,
    SyncFreeRotatedBboxLoss,
    early_rbox_candidates_for,
)
from yolofeed.train.loss.pose import SyncFreePoseLoss
from yolofeed.train.loss.segment import SyncFreeSegmentLoss
from yolofeed.ultralytics_seam import (
    BboxLoss,
    RotatedBboxLoss,
    RotatedTaskAlignedAssigner,
    TaskAlignedAssigner,
    unwrap_model,
    v8DetectionLoss,
    v8OBBLoss,
)


def check_counts(model: torch.nn.Module) -> bool:
    """Whether every candidate count since the last check was right (one host sync). A wrong one (a bug:
    nonzero_static then drops or pads candidates) is logged and switches the counts off for the rest of the run."""
    ok = True
    for loss in detection_losses(model):
        a = loss.assigner
        if isinstance(a, SyncFreeAssigner) and a.mismatch is not None:
            ok = ok and not bool(a.mismatch)
            a.mismatch = None
    if not ok:
        seam.LOGGER.warning("yolofeed: the loss's candidate count read ahead was wrong for some steps of this epoch; "
                       "the loss counts them itself from now on (a host sync per step). Please report it.")
        for loss in detection_losses(model):
            loss.__dict__["_yf_off"] = True
    return ok


def detection_losses(model: torch.nn.Module) -> list[v8DetectionLoss]:
    """The plain detection, pose and OBB losses in the model's criterion: itself, or YOLO26's two (E2E)."""
    crit = seam.criterion(model)
    crit = getattr(crit, "criterion", crit)  # inside train/step.py's HostLossItems
    return [x for x in seam.detection_losses_in(crit)
            if type(x) in (v8DetectionLoss, SyncFreeDetectionLoss, seam.v8PoseLoss, SyncFreePoseLoss, v8OBBLoss,
                           SyncFreeOBBLoss, seam.v8SegmentationLoss, SyncFreeSegmentLoss)]


def install(model: torch.nn.Module) -> list[SyncFreeLoss]:
    """Swap the model's plain detection losses (and their assigner and box loss) to the sync-free classes.

    Creates the criterion as Ultralytics would if the model has none yet. A pose loss (``v8PoseLoss``, from the
    release pose is served by) becomes ``SyncFreePoseLoss``, an OBB loss (``v8OBBLoss``, with its rotated assigner
    and box loss) ``SyncFreeOBBLoss``, a segment loss (``v8SegmentationLoss``, from ``SEGMENT_LOSS_SINCE``)
    ``SyncFreeSegmentLoss``. Idempotent. Returns the swapped losses.
    """
    m = unwrap_model(model)
    if next(m.parameters()).is_cuda and torch.__version__ < "2.6":
        return []  # nonzero_static has no CUDA kernel before torch 2.6: Ultralytics' loss as it is
    if seam.criterion(m) is None and hasattr(m, "init_criterion"):
        seam.set_criterion(m, seam.make_criterion(m))
    out = []
    for loss in detection_losses(model):
        if type(loss.assigner) is TaskAlignedAssigner and type(loss.bbox_loss) is BboxLoss:  # all three, or none
            if not seam.swap_class(loss, v8DetectionLoss, SyncFreeDetectionLoss) and seam.since(seam.POSE_SINCE):
                seam.swap_class(loss, seam.v8PoseLoss, SyncFreePoseLoss)
            if seam.since(seam.SEGMENT_LOSS_SINCE):
                seam.swap_class(loss, seam.v8SegmentationLoss, SyncFreeSegmentLoss)
            seam.swap_class(loss.assigner, TaskAlignedAssigner, SyncFreeAssigner)
            seam.swap_class(loss.bbox_loss, BboxLoss, SyncFreeBboxLoss)
        elif (type(loss) is v8OBBLoss and type(loss.assigner) is RotatedTaskAlignedAssigner
              and type(loss.bbox_loss) is RotatedBboxLoss):
            seam.swap_class(loss, v8OBBLoss, SyncFreeOBBLoss)
            seam.swap_class(loss.assigner, RotatedTaskAlignedAssigner, SyncFreeRotatedAssigner)
            seam.swap_class(loss.bbox_loss, RotatedBboxLoss, SyncFreeRotatedBboxLoss)
        if isinstance(loss, SyncFreeLoss):
            out.append(loss)
    return out


def early_candidates_for(loss: SyncFreeLoss, out: Any) -> Tensor | None:
    """``early_candidates`` for an ``AugmentedBatch``, or None before the loss has cached its anchors (or for an OBB
    loss, a batch without oriented boxes)."""
    if isinstance(loss, SyncFreeOBBLoss):
        if out.rboxes is None:
            return None
        size = out.img.shape[-1]  # to_ultralytics' normalisation, elementwise: the same bits the loss will read
        return early_rbox_candidates_for(loss, torch.cat([out.rboxes[..., :4] / size, out.rboxes[..., 4:]], -1),
                                         out.valid)
    gt = padded_gt_from_augmented(out.boxes, out.valid, out.img.shape[-1], loss)
    return None if gt is None else loss.early_candidates(gt)

"""The sync-free pose loss: ``SyncFreeDetectionLoss`` with Ultralytics' keypoint terms."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from yolofeed import ultralytics_seam as seam
from yolofeed.train.loss.detect import MAX_BOXES, SyncFreeDetectionLoss
from yolofeed.ultralytics_seam import (
    xyxy2xywh,
)


class SyncFreePoseLoss(SyncFreeDetectionLoss, seam.v8PoseLoss):
    """``v8PoseLoss`` without its syncs, given the batch's counts: the box part is ``SyncFreeDetectionLoss``'s, and the
    keypoint part is computed over every anchor, the foreground's terms kept by a mask, where Ultralytics gathers the
    foreground anchors (``fg_mask.sum()``, ``masks.any()``, ``nonzero`` and boolean indexing: a sync each) and pads
    the keypoints to a count it learns on the host (``int(counts.max())``). The same sums and means, over more terms
    that are zero (the last bit may differ); the same gradients (zero off the foreground)."""

    def loss(self, preds: dict[str, Tensor], batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        """Ultralytics 8.4.190's ``v8PoseLoss.loss`` with the keypoint part as ``_keypoints_loss``."""
        n = batch.get(MAX_BOXES)
        if not n or self.device.type == "mps" or self.__dict__.get("_yf_off"):
            return super().loss(preds, batch)  # v8PoseLoss.loss, whose assignment is still ours where it can be
        pred_kpts = preds["kpts"].permute(0, 2, 1).contiguous()
        loss = torch.zeros(5, device=self.device)  # box, kpt_location, kpt_visibility, cls, dfl
        (fg_mask, target_gt_idx, target_bboxes, anchor_points, stride_tensor), det_loss, _ = (
            self.get_assigned_targets_and_loss(preds, batch))
        loss[0], loss[3], loss[4] = det_loss[0], det_loss[1], det_loss[2]
        batch_size = pred_kpts.shape[0]
        imgsz = self._constants(preds["feats"], pred_kpts.dtype).imgsz
        pred_kpts = self.kpts_decode(anchor_points, pred_kpts.view(batch_size, -1, *self.kpt_shape))
        loss[1], loss[2] = self._keypoints_loss(fg_mask, target_gt_idx, self._padded_keypoints(batch, batch_size, n,
                                                                                                 imgsz),
                                                stride_tensor, target_bboxes, pred_kpts)
        loss[1] *= self.hyp.pose
        loss[2] *= self.hyp.kobj
        return loss * batch_size, dict(zip(self.loss_names, loss.detach()))

    @staticmethod
    def kpts_decode(anchor_points: Tensor, pred_kpts: Tensor) -> Tensor:
        """``v8PoseLoss.kpts_decode``, the anchors' columns sliced (Ultralytics indexes them with a list, which copies
        the index to the GPU from pageable memory: a sync on every call)."""
        y = pred_kpts.clone()
        y[..., :2] *= 2.0
        y[..., 0] += anchor_points[:, 0:1] - 0.5
        y[..., 1] += anchor_points[:, 1:2] - 0.5
        return y

    def _padded_keypoints(self, batch: dict[str, Any], batch_size: int, n: int, imgsz: Tensor) -> Tensor:
        """``_batch_keypoints`` with the most boxes in one image given: (B, n, K, 3) pixels, no sync."""
        keypoints = batch["keypoints"].to(self.device).float()
        if keypoints.shape[-1] == 2:  # no visibility flag: every keypoint counts
            keypoints = torch.cat((keypoints, torch.ones_like(keypoints[..., :1])), -1)
        batch_idx = batch["batch_idx"].flatten().long().to(keypoints.device)
        counts = torch.zeros(batch_size, dtype=torch.long, device=keypoints.device)
        counts.scatter_add_(0, batch_idx, torch.ones_like(batch_idx))  # bincount on CUDA syncs for its size
        batched = keypoints.new_zeros((batch_size, n, *keypoints.shape[1:]))
        within_idx = torch.arange(len(batch_idx), device=keypoints.device) - (counts.cumsum(0) - counts)[batch_idx]
        batched[batch_idx, within_idx] = keypoints
        batched[..., :2] *= imgsz.flip(0)  # (w, h): a list index would copy itself to the GPU and sync
        return batched

    def _keypoints_loss(self, fg: Tensor, target_gt_idx: Tensor, keypoints: Tensor, stride_tensor: Tensor,
                        target_bboxes: Tensor, pred_kpts: Tensor) -> tuple[Tensor, Tensor]:
        """``calculate_keypoints_loss`` and ``KeypointLoss`` over every anchor (B, A), the foreground's terms kept:
        the means divide by the foreground's size on the device (0 without a foreground, as Ultralytics' guard)."""
        b = torch.arange(fg.shape[0], device=fg.device)[:, None]
        gt = keypoints[b, target_gt_idx]  # (B, A, K, 3): each anchor's box's keypoints
        stride = stride_tensor.view(1, -1, 1)
        gt = torch.cat((gt[..., :2] / stride[..., None], gt[..., 2:]), -1)
        area = xyxy2xywh(target_bboxes / stride)[..., 2:].prod(-1)  # (B, A)
        pred = pred_kpts.float()
        kpt_mask = gt[..., 2] != 0
        k = kpt_mask.shape[-1]
        d = (pred[..., 0] - gt[..., 0]).pow(2) + (pred[..., 1] - gt[..., 1]).pow(2)
        factor = k / (kpt_mask.sum(-1) + 1e-9)
        sigmas = self.keypoint_loss.sigmas
        e = d / ((2 * sigmas).pow(2) * (area[..., None] + 1e-9) * 2)
        keep = fg[..., None].float()
        rows = (fg.sum() * k).clamp(min=1)  # the mean's denominator: foreground anchors x keypoints
        kpts_loss = (factor[..., None] * ((1 - torch.exp(-e)) * kpt_mask) * keep).sum() / rows
        if pred.shape[-1] != 3:
            return kpts_loss, torch.zeros((), device=fg.device)
        bce = torch.nn.functional.binary_cross_entropy_with_logits(pred[..., 2], kpt_mask.float(), reduction="none")
        return kpts_loss, (bce * keep).sum() / rows

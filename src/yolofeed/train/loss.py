"""Ultralytics' detection loss without host syncs, given two counts the loader learned a step early.

In Ultralytics 8.4.190 one yolo11n loss makes 16 synchronising CUDA calls (``torch.cuda.set_sync_debug_mode``
counts them; YOLO26's end-to-end loss runs it twice). The first drains the forward pass; after it the GPU idles while
the host launches the target assignment's small kernels between syncs: 15 ms of a 78 ms yolo11n step at
batch 128 on the H200, with no data work at all. Without syncs the host launches the loss while the GPU
still runs the forward pass. Where they come from, and what replaces them (same values, same order):

* ``make_anchors`` (9: CPU ``arange`` and a 0-d stride copied per level), ``torch.tensor(imgsz)`` and its
  index (2): constants per feature-map shape, cached on the device.
* The target padding learns the most boxes in one image (``unique``, ``zeros(n)``: 2): ``max_boxes``.
* ``select_candidates_in_gts`` builds a 0-d tensor from ``stride_val`` (1): a Python scalar.
* ``get_box_metrics`` gathers the candidate (image, box, anchor) pairs with ``nonzero`` (1):
  ``nonzero_static`` with their count, ``tal_candidates``, which depends on the boxes and anchors alone.
* ``BboxLoss`` gathers the foreground anchors with ``nonzero`` (1): ``nonzero_static`` padded to a
  bound known on the host (at most ``topk`` anchors per box, at most the candidates); padded rows read
  distinct anchors (``foreground_rows``) and get weight 0. The gradients are the same; the loss's sum may
  differ in the last bit (more terms, in a different reduction tree).

``AugmentAhead`` computes both counts with the augmentation, one step ahead, and reads them from pinned
memory (``early_candidates``: on the anchor grid, (B, K, levels) work; a (B, K, anchors) mask would cost
more GPU time than the syncs it saves); the ceiling counts its replayed batches once. A
batch without them takes Ultralytics' own path. The first steps do too: the anchors come from the first
loss call. A wrong count (a bug) is caught on the device and read once an epoch (``check_counts``).
On by default in both trainers (``sync_free_loss=False`` turns it off). The pose and OBB losses are built the same
way (``SyncFreePoseLoss``, ``SyncFreeOBBLoss``: their docstrings say which syncs they remove and how).

The copied methods (and the Ultralytics methods they assume unchanged) are registered in
``yolofeed.ultralytics_seam.COPIED`` and ``RELIED_ON`` with the hash of their 8.4.190 source and of each older source
reviewed; ``tests/test_seam.py`` fails with a diff when the installed Ultralytics moves away from them. Before 8.4.180
``get_box_metrics`` computes its overlaps inline: ``seam.pair_overlaps`` does as the installed release does.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from yolofeed import ultralytics_seam as seam
from yolofeed.schema import normalised_xywh  # to_ultralytics' own formula: the same box values
from yolofeed.ultralytics_seam import (
    BboxLoss,
    RotatedBboxLoss,
    RotatedTaskAlignedAssigner,
    TaskAlignedAssigner,
    bbox2dist,
    bbox_iou,
    crop_mask,
    make_anchors,
    probiou,
    rbox2dist,
    unwrap_model,
    v8DetectionLoss,
    v8OBBLoss,
    xywh2xyxy,
    xywhr2xyxyxyxy,
    xyxy2xywh,
)


@dataclass
class _Constants:
    """What the loss recomputes (with syncs) every call in Ultralytics, for one set of feature-map shapes."""

    anchor_points: Tensor  # (A, 2) grid units, the feature maps' dtype
    stride_tensor: Tensor  # (A, 1)
    imgsz: Tensor  # (2,) h, w in pixels, the predictions' dtype
    scale: Tensor  # (4,) w, h, w, h: the padding's scale
    centers: list[tuple[Tensor, Tensor]]  # per level: (w,) x and (h,) y anchor centres in pixels, float32, sorted
    hw: tuple[float, float]  # imgsz on the host, float(imgsz[0]), float(imgsz[1]): the OBB loss's tiny-box filter


MAX_BOXES = "max_boxes"  # batch keys: Python ints, known on the host before the step
# the segment loss's padded mask elements a group of images: 256 MB of float16 masks under autocast (512 MB of
# float32 without), and as much again, briefly, for the backward pass of gathering the real rows out of them
MASK_CHUNK = 1 << 27
CANDIDATES = "tal_candidates"


class SyncFreeAssigner(TaskAlignedAssigner):
    """``TaskAlignedAssigner`` whose candidate gather takes its size from ``candidates`` (set per call).

    ``candidates`` is (count, batch size): the OOM fallback, which assigns one image at a time, takes
    Ultralytics' path.
    """

    candidates: tuple[int, int] | None = None
    mismatch: Tensor | None = None  # on the device: a count that was not the real one (read at epoch ends)

    def select_candidates_in_gts(self, xy_centers, gt_bboxes, mask_gt, eps=1e-9):
        """Ultralytics' code, with ``stride_val`` as a Python scalar (a 0-d tensor built per call syncs)."""
        gt_bboxes_xywh = xyxy2xywh(gt_bboxes)
        wh_mask = gt_bboxes_xywh[..., 2:] < self.stride_val
        gt_bboxes_xywh[..., 2:] = torch.where((wh_mask * mask_gt).bool(), float(self.stride_val),
                                              gt_bboxes_xywh[..., 2:])
        gt_bboxes = xywh2xyxy(gt_bboxes_xywh)
        lt, rb = gt_bboxes.unsqueeze(2).chunk(2, 3)
        mask = xy_centers[:, 0] - lt[..., 0] > eps
        mask &= xy_centers[:, 1] - lt[..., 1] > eps
        mask &= rb[..., 0] - xy_centers[:, 0] > eps
        mask &= rb[..., 1] - xy_centers[:, 1] > eps
        return mask

    def get_box_metrics(self, pd_scores, pd_bboxes, gt_labels, gt_bboxes, mask_gt, **extra):
        """Ultralytics' code; ``nonzero_static`` with the known count gives ``nonzero``'s indices, in order."""
        if self.candidates is None or extra or self.candidates[1] != self.bs:
            return super().get_box_metrics(pd_scores, pd_bboxes, gt_labels, gt_bboxes, mask_gt, **extra)
        na = pd_bboxes.shape[-2]
        mask_gt = mask_gt.bool()
        shape = self.bs, self.n_max_boxes, na
        indices = tuple(torch.nonzero_static(mask_gt, size=self.candidates[0]).unbind(1))
        wrong = mask_gt.sum() != self.candidates[0]  # checked on the device; read once an epoch (check_counts)
        self.mismatch = wrong if self.mismatch is None else self.mismatch | wrong
        bbox_scores = pd_scores[indices[0], indices[2], gt_labels[indices[0], indices[1], 0].long()]
        overlap_values = seam.pair_overlaps(self, indices, gt_bboxes, pd_bboxes)  # inline before 8.4.180
        align_values = bbox_scores.pow(self.alpha) * overlap_values.pow(self.beta)
        overlaps = torch.zeros(shape, dtype=pd_bboxes.dtype, device=pd_bboxes.device)
        align_metric = torch.zeros(shape, dtype=align_values.dtype, device=pd_scores.device)
        overlaps[indices] = overlap_values
        align_metric[indices] = align_values
        return align_metric, overlaps


def foreground_rows(fg_mask: Tensor, bound: int) -> tuple[tuple[Tensor, Tensor], Tensor]:
    """``fg_mask.nonzero()``'s (image, anchor) indices padded to ``bound`` rows without a sync, and which are real.

    Padded row j reads flat anchor j (``bound`` is at most B x anchors): finite values, given weight 0 by the
    caller. Distinct on purpose: the backward of the gathers accumulates repeated indices one after another
    (``indexing_backward_kernel``), and ~40k padded rows all on anchor (0, 0) cost 41 ms of GPU time a yolo11n
    step at batch 128 on the H200 (the profiler's kernel table). Here no anchor is read by
    more than two rows.

    Returns:
        ((bound,) image indices, (bound,) anchor indices), (bound, 1) bool: the row is a foreground anchor.
    """
    flat = torch.nonzero_static(fg_mask.flatten(), size=bound, fill_value=-1).squeeze(1)  # the foreground first
    real = flat >= 0
    flat = torch.where(real, flat, torch.arange(bound, device=flat.device))
    anchors = fg_mask.shape[1]
    return (flat.div(anchors, rounding_mode="floor"), flat.remainder(anchors)), real.unsqueeze(1)


def _unit_box(like: Tensor) -> Tensor:
    """(4,) xyxy box (0, 0, 1, 1) in ``like``'s dtype and device, built on the device (no host copy)."""
    return (torch.arange(4, device=like.device) >= 2).to(like.dtype)


class SyncFreeBboxLoss(BboxLoss):
    """``BboxLoss`` gathering the foreground through ``nonzero_static``, ``bound`` rows (set per call)."""

    bound: int | None = None

    def forward(self, pred_dist, pred_bboxes, anchor_points, target_bboxes, target_scores, target_scores_sum,
                fg_mask, imgsz, stride):
        if self.bound is None:
            return super().forward(pred_dist, pred_bboxes, anchor_points, target_bboxes, target_scores,
                                   target_scores_sum, fg_mask, imgsz, stride)
        fg, real = foreground_rows(fg_mask, self.bound)
        weight = target_scores[fg].sum(-1, keepdim=True) * real
        # Padded rows compute on a fixed unit box, not on what their anchor predicts: weight 0 does not stop a
        # non-finite gradient (0 x inf = NaN), and a background anchor's box can be degenerate where Ultralytics
        # never looks (in float16 a box thinner than width / 65504 overflows CIoU's aspect term: AMP's scale then
        # collapses and YOLO26 never learns). torch.where passes no gradient to the rows it does not take.
        unit = _unit_box(pred_bboxes)
        iou = bbox_iou(torch.where(real, pred_bboxes[fg], unit), torch.where(real, target_bboxes[fg], unit.to(
            target_bboxes.dtype)), xywh=False, CIoU=True)
        loss_iou = ((1.0 - iou) * weight).sum() / target_scores_sum
        if self.dfl_loss:
            target_ltrb = bbox2dist(anchor_points, target_bboxes, self.dfl_loss.reg_max - 1)
            dist = torch.where(real, pred_dist[fg], torch.zeros((), dtype=pred_dist.dtype, device=pred_dist.device))
            ltrb = torch.where(real, target_ltrb[fg], torch.zeros((), dtype=target_ltrb.dtype, device=real.device))
            loss_dfl = self.dfl_loss(dist.view(-1, self.dfl_loss.reg_max), ltrb) * weight
            loss_dfl = loss_dfl.sum() / target_scores_sum
        else:
            target_ltrb = bbox2dist(anchor_points, target_bboxes)
            target_ltrb = target_ltrb * stride
            target_ltrb[..., 0::2] /= imgsz[1]
            target_ltrb[..., 1::2] /= imgsz[0]
            pred_dist = pred_dist * stride
            pred_dist[..., 0::2] /= imgsz[1]
            pred_dist[..., 1::2] /= imgsz[0]
            zero = torch.zeros((), dtype=pred_dist.dtype, device=pred_dist.device)
            loss_dfl = torch.nn.functional.l1_loss(torch.where(real, pred_dist[fg], zero),
                                                   torch.where(real, target_ltrb[fg], zero.to(target_ltrb.dtype)),
                                                   reduction="none").mean(-1, keepdim=True) * weight
            loss_dfl = loss_dfl.sum() / target_scores_sum
        return loss_iou, loss_dfl


class SyncFreeLoss:
    """What the sync-free losses share (a base before Ultralytics' loss class): the constants Ultralytics recomputes
    with syncs every call, cached per feature-map shape, and those of the last call (the next batch's counts use them).
    """

    def _constants(self, feats: list[Tensor], dtype: torch.dtype) -> _Constants:
        """Anchors, stride per anchor, imgsz and its (w, h, w, h) scale for these feature maps: made once (with
        syncs: make_anchors', and imgsz read to the host)."""
        cache = self.__dict__.setdefault("_yf_constants", {})
        shapes = tuple(tuple(f.shape[2:]) for f in feats)
        key = (shapes, feats[0].dtype, dtype, feats[0].device)
        if key not in cache:
            anchor_points, stride_tensor = make_anchors(feats, self.stride, 0.5)
            imgsz = torch.tensor(feats[0].shape[2:], device=self.device, dtype=dtype) * self.stride[0]
            centers, off = [], 0  # per level, the anchors' x and y centres in pixels, as the assigner compares them
            xy = anchor_points * stride_tensor
            for h, w in shapes:
                level = xy[off:off + h * w].float()
                centers.append((level[:w, 0].contiguous(), level[::w, 1].contiguous()))
                off += h * w
            cache[key] = _Constants(anchor_points, stride_tensor, imgsz, imgsz[[1, 0, 1, 0]], centers,
                                    tuple(imgsz.tolist()))
            self.__dict__["_yf_last"] = key
        return cache[key]

    def last_constants(self) -> _Constants | None:
        """The constants of the last loss call (None before the first): the next batch's, unless its size changes."""
        key = self.__dict__.get("_yf_last")
        return None if key is None else self.__dict__["_yf_constants"][key]


class SyncFreeDetectionLoss(SyncFreeLoss, v8DetectionLoss):
    """``v8DetectionLoss`` that reads ``max_boxes`` and ``tal_candidates`` from the batch when it has them.

    Installed by swapping classes in place (``install``): the criterion's state (hyperparameters, the
    E2E schedule around it) stays Ultralytics'.
    """

    def _pad(self, targets: Tensor, batch_size: int, n: int, scale_tensor: Tensor) -> Tensor:
        """Ultralytics' ``preprocess`` with the most boxes in one image given: the same tensor, no sync."""
        nl, ne = targets.shape
        if nl == 0:
            return torch.zeros(batch_size, 0, ne - 1, device=self.device)
        batch_idx = targets[:, 0].long()
        out = torch.zeros(batch_size, n, ne - 1, device=self.device)
        offsets = torch.zeros(batch_size + 1, dtype=torch.long, device=self.device)
        offsets.scatter_add_(0, batch_idx + 1, torch.ones_like(batch_idx))
        offsets = offsets.cumsum(0)
        within_idx = torch.arange(nl, device=self.device) - offsets[batch_idx]
        out[batch_idx, within_idx] = targets[:, 1:]  # a count too small: an index error, never a silent drop
        out[..., 1:5] = xywh2xyxy(out[..., 1:5].mul_(scale_tensor))
        return out

    def padded_gt(self, batch: dict[str, Tensor], n: int) -> Tensor | None:
        """This loss's padded pixel boxes for an Ultralytics batch, (B, n, 4) xyxy (None before the first call)."""
        c = self.last_constants()
        if c is None:
            return None
        targets = torch.cat((batch["batch_idx"].view(-1, 1), batch["cls"].view(-1, 1), batch["bboxes"]), 1)
        return self._pad(targets.to(self.device), len(batch["img"]), n, c.scale)[..., 1:5]

    def get_assigned_targets_and_loss(self, preds: dict[str, Tensor], batch: dict[str, Any], **assign_kwargs):
        """Ultralytics 8.4.190's code with the counts from the batch (see the module docstring); older releases of
        the range compute the same values (``COPIED`` says how each differs)."""
        n = batch.get(MAX_BOXES)
        # n == 0, a batch without boxes: no sync to save (the assigner returns at once), and before 8.4.144 its
        # foreground mask is float there, which only Ultralytics' own guard (8.4.138-153) keeps from the box loss
        if not n or assign_kwargs or self.device.type == "mps" or self.__dict__.get("_yf_off"):
            return super().get_assigned_targets_and_loss(preds, batch, **assign_kwargs)
        loss = torch.zeros(3, device=self.device)  # box, cls, dfl
        pred_distri, pred_scores = (preds["boxes"].permute(0, 2, 1).contiguous(),
                                    preds["scores"].permute(0, 2, 1).contiguous())
        dtype = pred_scores.dtype
        batch_size = pred_scores.shape[0]
        c = self._constants(preds["feats"], dtype)
        anchor_points, stride_tensor, imgsz = c.anchor_points, c.stride_tensor, c.imgsz

        targets = torch.cat((batch["batch_idx"].view(-1, 1), batch["cls"].view(-1, 1), batch["bboxes"]), 1)
        targets = self._pad(targets.to(self.device), batch_size, n, c.scale)
        gt_labels, gt_bboxes = targets.split((1, 4), 2)
        mask_gt = gt_bboxes.sum(2, keepdim=True).gt_(0.0)
        pred_bboxes = self.bbox_decode(anchor_points, pred_distri)

        candidates = batch.get(CANDIDATES)
        self.assigner.candidates = None if candidates is None else (candidates, batch_size)
        try:
            _, target_bboxes, target_scores, fg_mask, target_gt_idx = self.assigner(
                pred_scores.detach().sigmoid(), (pred_bboxes.detach() * stride_tensor).type(gt_bboxes.dtype),
                anchor_points * stride_tensor, gt_labels, gt_bboxes, mask_gt)
        finally:
            self.assigner.candidates = None
        target_scores_sum = target_scores.sum().clamp_(min=1)

        bce_loss = self.bce(pred_scores, target_scores.to(dtype))
        if self.class_weights is not None:
            bce_loss *= self.class_weights
        loss[1] = bce_loss.sum() / target_scores_sum

        if candidates is not None:  # the foreground: at most topk anchors per box, at most the candidates
            self.bbox_loss.bound = max(1, min(batch_size * pred_scores.shape[1], batch_size * n * self.assigner.topk,
                                              candidates))
        try:
            loss[0], loss[2] = self.bbox_loss(pred_distri, pred_bboxes, anchor_points, target_bboxes / stride_tensor,
                                              target_scores, target_scores_sum, fg_mask, imgsz, stride_tensor)
        finally:
            self.bbox_loss.bound = None
        loss[0] *= self.hyp.box
        loss[1] *= self.hyp.cls
        loss[2] *= self.hyp.dfl
        return ((fg_mask, target_gt_idx, target_bboxes, anchor_points, stride_tensor), loss,
                dict(zip(self.loss_names, loss.detach())))

    def early_candidates(self, gt_xyxy: Tensor) -> Tensor | None:
        """The count ``get_box_metrics`` will gather for these boxes, on the device (no sync); None before the
        first loss call has made the anchors.

        The assigner tests every (box, anchor) pair: anchor centre strictly inside the box, the box's sides
        first raised to ``stride_val`` (``select_candidates_in_gts``). The anchors of a level form a grid, so a
        box holds (centres x inside) x (centres y inside) of them: two ``searchsorted`` per level and box,
        against the same float32 centres and box edges, instead of a (B, K, anchors) mask. Its ``> eps``
        tests are strict comparisons here (centres are at least 2 px apart from 0; float32 differences of
        distinct values are far above 1e-9).

        Args:
            gt_xyxy: (B, K, 4) boxes in pixels as the loss's padding makes them; rows of zeros are padding.
        """
        c = self.last_constants()
        if c is None:
            return None
        mask_gt = gt_xyxy.sum(2, keepdim=True).gt_(0.0)
        stride_val = self.assigner.stride_val
        xywh = xyxy2xywh(gt_xyxy)  # the assigner's own steps, elementwise: the same edges to the last bit
        wh_mask = xywh[..., 2:] < stride_val
        xywh[..., 2:] = torch.where((wh_mask * mask_gt).bool(), float(stride_val), xywh[..., 2:])
        box = xywh2xyxy(xywh).float()
        total = torch.zeros(gt_xyxy.shape[:2], dtype=torch.int64, device=gt_xyxy.device)
        for cx, cy in c.centers:
            nx = torch.searchsorted(cx, box[..., 2].contiguous()) - torch.searchsorted(cx, box[..., 0].contiguous(),
                                                                                       right=True)
            ny = torch.searchsorted(cy, box[..., 3].contiguous()) - torch.searchsorted(cy, box[..., 1].contiguous(),
                                                                                       right=True)
            total += nx.clamp_(min=0) * ny.clamp_(min=0)
        return (total * mask_gt[..., 0].long()).sum()



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



class SyncFreeSegmentLoss(SyncFreeDetectionLoss, seam.v8SegmentationLoss):
    """``v8SegmentationLoss`` with a few host syncs a step instead of several per image.

    Ultralytics' mask loss loops over the images, and each image's foreground is gathered by boolean indexing
    (``fg_mask_i.any()``, ``target_gt_idx_i[fg_mask_i]`` and three more, then ``masks[batch_idx == i]`` without
    overlap): about five syncs an image, 640 at batch 128, each one leaving the GPU idle while the host launches the
    next image's small kernels (139 ms of stock's phases at batch 128 on an H200, BENCHMARKS.md "Segmentation"). Here
    the foreground's (image, anchor) pairs come from one ``nonzero`` and each image's share from one read of their
    counts, so the loss indexes with tensors and host integers and never waits: a few syncs a step (the foreground's
    guard, ``nonzero``, the counts' read), where Ultralytics' makes about five an image. The detection part is
    ``SyncFreeDetectionLoss``'s (no sync, given the batch's counts). The mask loss is computed for groups of images at
    once (``_segmentation_loss``): each row's term is Ultralytics' ``single_mask_loss`` term on the rows boolean
    indexing would gather (its masks from a batched product, which may round otherwise than the einsum on a GPU),
    summed in another order: the same loss to float32's rounding.
    """

    def loss(self, preds: dict[str, Tensor], batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        """Ultralytics 8.4.190's ``v8SegmentationLoss.loss``, imgsz from the cached constants and the mask loss as
        ``_segmentation_loss``."""
        n = batch.get(MAX_BOXES)
        if not n or self.device.type == "mps" or self.__dict__.get("_yf_off"):
            return super().loss(preds, batch)  # v8SegmentationLoss.loss, whose assignment is still ours where it can be
        pred_masks, proto = preds["mask_coefficient"].permute(0, 2, 1).contiguous(), preds["proto"]
        loss = torch.zeros(5, device=self.device)  # box, seg, cls, dfl, semantic
        if isinstance(proto, tuple) and len(proto) == 2:
            proto, pred_semantic = proto
        else:
            pred_semantic = None
        (fg_mask, target_gt_idx, target_bboxes, _, _), det_loss, _ = self.get_assigned_targets_and_loss(preds, batch)
        loss[0], loss[2], loss[3] = det_loss[0], det_loss[1], det_loss[2]

        batch_size, _, mask_h, mask_w = proto.shape
        if fg_mask.sum():  # one sync, as Ultralytics'
            masks = batch["masks"].to(self.device).float()
            if tuple(masks.shape[-2:]) != (mask_h, mask_w):
                proto = torch.nn.functional.interpolate(proto, masks.shape[-2:], mode="bilinear", align_corners=False)
            imgsz = self._constants(preds["feats"], pred_masks.dtype).imgsz
            rows = _image_rows(fg_mask, batch["batch_idx"].view(-1), self.overlap)
            loss[1] = self._segmentation_loss(fg_mask, masks, target_gt_idx, target_bboxes, rows, proto, pred_masks,
                                              imgsz)
            if pred_semantic is not None:
                sem_idx = batch["sem_masks"].to(self.device).long().unsqueeze(1)
                if self.overlap:
                    present = masks != 0
                else:
                    present = torch.zeros(batch_size, *masks.shape[-2:], dtype=torch.bool, device=self.device)
                    for i in range(batch_size):
                        instance_mask_i = masks[rows.targets(i)]
                        if len(instance_mask_i):
                            present[i] = instance_mask_i.sum(dim=0) != 0
                sem_masks = torch.zeros(sem_idx.shape[0], self.nc, *sem_idx.shape[2:], device=self.device)
                sem_masks.scatter_(1, sem_idx, present.unsqueeze(1).float())
                loss[4] = self.bcedice_loss(pred_semantic, sem_masks)
                loss[4] *= self.hyp.box
        else:
            loss[1] += (proto * 0).sum() + (pred_masks * 0).sum()
            if pred_semantic is not None:
                loss[4] += (pred_semantic * 0).sum()
        loss[1] *= self.hyp.box
        return loss * batch_size, dict(zip(self.loss_names, loss.detach()))

    def _segmentation_loss(self, fg_mask: Tensor, masks: Tensor, target_gt_idx: Tensor, target_bboxes: Tensor,
                           rows: _ImageRows, proto: Tensor, pred_masks: Tensor, imgsz: Tensor) -> Tensor:
        """``calculate_segmentation_loss`` a group of images at a time, not image by image.

        Ultralytics computes each image's masks and their loss in turn, about 15 small kernels an image and as many
        in the backward pass (about 4,000 launches at batch 128, the GPU waiting on the host between them). Here the
        foreground rows of a group of images are laid out padded, ``(images, most rows, 32)``, for one batched matrix
        product with the group's prototypes (under autocast in float16, as Ultralytics' einsum), and the real rows are
        taken back out of it; the binary cross-entropy, the crop to the box, the mean over the pixels and the division
        by the box area are Ultralytics' ``single_mask_loss`` on those rows. The groups bound the padded product's
        memory (``MASK_CHUNK``). Each row's term is Ultralytics' to rounding (a batched product, on a GPU, may round
        otherwise than the einsum's); their sum runs in another order.
        """
        _, _, mask_h, mask_w = proto.shape
        # imgsz[[1, 0, 1, 0]] and torch.tensor([...], device=...) copy from host memory: the same values made here
        target_bboxes_normalized = target_bboxes / imgsz.flip(0).repeat(2)
        marea = xyxy2xywh(target_bboxes_normalized)[..., 2:].prod(2)
        size = torch.empty(4, device=proto.device)
        size[0::2], size[1::2] = mask_w, mask_h
        mxyxy = target_bboxes_normalized * size
        image, anchor = rows.fg[:, 0], rows.fg[:, 1]  # every foreground row, image by image (row-major)
        mask_idx = target_gt_idx[image, anchor]
        pred, xyxy, area = pred_masks[image, anchor], mxyxy[image, anchor], marea[image, anchor]
        position = torch.arange(len(image), device=image.device) - rows.fg_first[image]  # the row within its image
        target = None if self.overlap else rows.order[rows.t_first[image] + mask_idx]  # each row's mask, no overlap
        terms = []
        for a, z in rows.groups(MASK_CHUNK // (mask_h * mask_w)):
            r = slice(rows.fg_edges[a], rows.fg_edges[z])
            at = (image[r] - a, position[r])
            padded = pred.new_zeros(z - a, rows.most(a, z), pred.shape[-1]).index_put(at, pred[r])
            pred_mask = torch.bmm(padded, proto[a:z].flatten(2)).unflatten(2, (mask_h, mask_w))[at]
            if target is None:
                gt_mask = (masks[image[r]] == (mask_idx[r] + 1).view(-1, 1, 1)).float()
            else:
                gt_mask = masks[target[r]]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(pred_mask, gt_mask, reduction="none")
            terms.append(crop_mask(loss, xyxy[r]).mean(dim=(1, 2)) / area[r])
        loss = torch.cat(terms).sum()
        if rows.empty_images:  # Ultralytics adds these zeros for each image without a foreground (DDP's unused
            loss = loss + (proto * 0).sum() + (pred_masks * 0).sum()  # parameters; nan where an input is inf)
        return loss / fg_mask.sum()


class _ImageRows:
    """Each image's foreground anchors (in ``fg_mask``'s order) and, without overlap, its target rows (in the batch's
    order), from one ``nonzero`` and one read of the per-image counts: slices by host integers after that, and each
    image's first row on the device."""

    def __init__(self, fg: Tensor, counts: Tensor, fg_counts: list[int], order: Tensor | None,
                 target_counts: list[int] | None):
        self.fg, self.order, self.fg_counts = fg, order, fg_counts
        self.fg_edges = [0, *itertools.accumulate(fg_counts)]
        self.t_edges = None if target_counts is None else [0, *itertools.accumulate(target_counts)]
        first = counts.cumsum(1) - counts  # each image's first row: device arithmetic, no copy from host memory
        self.fg_first = first[0]
        self.t_first = first[1] if order is not None else None

    @property
    def empty_images(self) -> int:
        """Images without a foreground anchor."""
        return sum(c == 0 for c in self.fg_counts)

    def targets(self, i: int) -> Tensor:
        """Image ``i``'s target rows (``batch_idx == i``, in order) as indices into the batch's rows."""
        return self.order[self.t_edges[i]:self.t_edges[i + 1]]

    def most(self, a: int, z: int) -> int:
        """The most foreground rows of one image among images ``a`` to ``z - 1``."""
        return max(self.fg_counts[a:z])

    def groups(self, rows: int) -> list[tuple[int, int]]:
        """Runs of consecutive images ``[a, z)`` whose padded layout (images x most rows) holds at most ``rows`` rows
        (an image alone may hold more); images without a foreground at a run's ends are left out."""
        out, a, n = [], 0, len(self.fg_counts)
        while a < n:
            if not self.fg_counts[a]:
                a += 1
                continue
            z, most = a + 1, self.fg_counts[a]
            while z < n and (z + 1 - a) * max(most, self.fg_counts[z]) <= rows:
                most, z = max(most, self.fg_counts[z]), z + 1
            end = z
            while not self.fg_counts[end - 1]:
                end -= 1
            out.append((a, end))
            a = z
        return out


def _per_image(image: Tensor, b: int) -> Tensor:
    """How many rows each of ``b`` images has: ``bincount``, which on CUDA syncs to learn its size."""
    return torch.zeros(b, dtype=torch.long, device=image.device).scatter_add_(0, image, torch.ones_like(image))


def _image_rows(fg_mask: Tensor, batch_idx: Tensor, overlap: bool) -> _ImageRows:
    """``_ImageRows`` of a batch: two syncs (``nonzero``'s size; the per-image counts read)."""
    b = len(fg_mask)
    fg = fg_mask.nonzero()  # (N, 2) image, anchor: row-major, as boolean indexing walks each image's row
    counts = [_per_image(fg[:, 0], b)]
    order = None
    if not overlap:
        image = batch_idx.to(fg.device).long()
        order = torch.argsort(image, stable=True)  # masks[batch_idx == i] keeps the batch's order within an image
        counts.append(_per_image(image, b))
    counts = torch.stack(counts)
    host = counts.tolist()
    return _ImageRows(fg, counts, host[0], order, None if overlap else host[1])


def _rbox_edges(gt_bboxes: Tensor, mask_gt: Tensor, stride_val: float) -> tuple[Tensor, ...]:
    """The box side of ``RotatedTaskAlignedAssigner.select_candidates_in_gts``, by its own steps: each box's sides
    raised to ``stride_val`` (padding rows not), its corner ``a`` and the edges ``ab``, ``ad`` with their squared
    lengths. One function for the assigner and the count ahead, so both test the same values to the last bit.

    Shape:
        gt_bboxes (B, K, 5) xywhr pixels, mask_gt (B, K, 1); returns a, ab, ad (B, K, 1, 2), norm_ab, norm_ad (B, K, 1).
    """
    gt = gt_bboxes.clone()
    wh_mask = gt[..., 2:4] < stride_val
    # a Python scalar, where Ultralytics builds a 0-d tensor per call (a host copy: a sync)
    gt[..., 2:4] = torch.where((wh_mask * mask_gt).bool(), float(stride_val), gt[..., 2:4])
    a, b, _, d = xywhr2xyxyxyxy(gt).split(1, dim=-2)
    ab, ad = b - a, d - a
    return a, ab, ad, (ab * ab).sum(dim=-1), (ad * ad).sum(dim=-1)


class SyncFreeRotatedAssigner(SyncFreeAssigner, RotatedTaskAlignedAssigner):
    """``RotatedTaskAlignedAssigner`` with ``SyncFreeAssigner``'s candidate gather (``candidates`` set per call); its
    overlaps stay the rotated assigner's ProbIoU (``iou_calculation``, through ``pair_overlaps``)."""

    def select_candidates_in_gts(self, xy_centers, gt_bboxes, mask_gt):
        """Ultralytics' code, with ``stride_val`` as a Python scalar (``_rbox_edges``)."""
        a, ab, ad, norm_ab, norm_ad = _rbox_edges(gt_bboxes, mask_gt, self.stride_val)
        apx = xy_centers[:, 0] - a[..., 0]
        apy = xy_centers[:, 1] - a[..., 1]
        ap_dot_ab = apx * ab[..., 0] + apy * ab[..., 1]
        ap_dot_ad = apx * ad[..., 0] + apy * ad[..., 1]
        return (ap_dot_ab >= 0) & (ap_dot_ab <= norm_ab) & (ap_dot_ad >= 0) & (ap_dot_ad <= norm_ad)


def _unit_rbox(like: Tensor) -> Tensor:
    """(5,) xywhr box (0, 0, 1, 1, 0) in ``like``'s dtype and device, built on the device (no host copy)."""
    i = torch.arange(5, device=like.device)
    return ((i == 2) | (i == 3)).to(like.dtype)


class SyncFreeRotatedBboxLoss(RotatedBboxLoss):
    """``RotatedBboxLoss`` gathering the foreground through ``nonzero_static``, ``bound`` rows (set per call), as
    ``SyncFreeBboxLoss`` does: Ultralytics indexes five tensors with the boolean foreground mask (a sync each)."""

    bound: int | None = None

    def forward(self, pred_dist, pred_bboxes, anchor_points, target_bboxes, target_scores, target_scores_sum,
                fg_mask, imgsz, stride):
        if self.bound is None:
            return super().forward(pred_dist, pred_bboxes, anchor_points, target_bboxes, target_scores,
                                   target_scores_sum, fg_mask, imgsz, stride)
        fg, real = foreground_rows(fg_mask, self.bound)
        weight = target_scores[fg].sum(-1, keepdim=True) * real
        # padded rows compute on a fixed unit box, not on their anchor's: see SyncFreeBboxLoss
        unit = _unit_rbox(pred_bboxes)
        iou = probiou(torch.where(real, pred_bboxes[fg], unit),
                      torch.where(real, target_bboxes[fg], unit.to(target_bboxes.dtype)), floor=self.floor)
        loss_iou = ((1.0 - iou) * weight).sum() / target_scores_sum
        zero = torch.zeros((), dtype=pred_dist.dtype, device=pred_dist.device)
        if self.dfl_loss:
            target_ltrb = rbox2dist(target_bboxes[..., :4], anchor_points, target_bboxes[..., 4:5],
                                    reg_max=self.dfl_loss.reg_max - 1)
            dist = torch.where(real, pred_dist[fg], zero)
            ltrb = torch.where(real, target_ltrb[fg], zero.to(target_ltrb.dtype))
            loss_dfl = self.dfl_loss(dist.view(-1, self.dfl_loss.reg_max), ltrb) * weight
            loss_dfl = loss_dfl.sum() / target_scores_sum
        else:
            target_ltrb = rbox2dist(target_bboxes[..., :4], anchor_points, target_bboxes[..., 4:5])
            target_ltrb = target_ltrb * stride
            target_ltrb[..., 0::2] /= imgsz[1]
            target_ltrb[..., 1::2] /= imgsz[0]
            pred_dist = pred_dist * stride
            pred_dist[..., 0::2] /= imgsz[1]
            pred_dist[..., 1::2] /= imgsz[0]
            loss_dfl = torch.nn.functional.l1_loss(torch.where(real, pred_dist[fg], zero),
                                                   torch.where(real, target_ltrb[fg], zero.to(target_ltrb.dtype)),
                                                   reduction="none").mean(-1, keepdim=True) * weight
            loss_dfl = loss_dfl.sum() / target_scores_sum
        return loss_iou, loss_dfl


class SyncFreeOBBLoss(SyncFreeLoss, v8OBBLoss):
    """``v8OBBLoss`` without its syncs, given the batch's counts (``max_boxes``, ``tal_candidates``).

    In Ultralytics 8.4.190 one OBB loss call syncs about 28 times (read from the code; YOLO26's end-to-end loss
    runs it twice): the anchors and imgsz (11, cached as the detection loss caches them), ``float(imgsz[i])`` for
    the tiny-box filter (2: host floats cached beside them), the filter itself (boolean indexing: 1), the
    padding (``unique``, ``counts.max()``: 2), the assigner (``torch.tensor(stride_val)`` and ``nonzero``: 2),
    ``max(target_scores.sum(), 1)`` and ``if fg_mask.sum()`` (2), and the foreground's boolean indexing in the
    box and angle losses (8). What replaces them:

    * the filter keeps every row and masks the ones it drops (``_pad_rboxes``: the boxes it keeps first in each
      image, in order, then zeros, as Ultralytics pads), so the assigner sees Ultralytics' boxes;
    * the box loss gathers a bounded foreground (``SyncFreeRotatedBboxLoss``) and the angle loss runs over every
      anchor, the foreground's terms kept by a mask (``_angle_loss``); without a foreground both are 0, as
      Ultralytics' guard makes them;
    * the rotated assigner's candidate gather takes ``tal_candidates`` (``early_candidates`` counts the rotated
      test ahead, exactly).

    The same sums over more terms that are zero (the last bit may differ); the same gradients.
    """

    def loss(self, preds: dict[str, Tensor], batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        """Ultralytics 8.4.190's ``v8OBBLoss.loss`` with the counts from the batch (see the class docstring)."""
        n = batch.get(MAX_BOXES)
        if not n or self.device.type == "mps" or self.__dict__.get("_yf_off"):
            return super().loss(preds, batch)
        try:
            targets = torch.cat((batch["batch_idx"].view(-1, 1), batch["cls"].view(-1, 1),
                                 batch["bboxes"].view(-1, 5)), 1)
        except RuntimeError:  # not an OBB batch (a detection dataset's 4 columns): Ultralytics' own message says so
            return super().loss(preds, batch)
        loss = torch.zeros(4, device=self.device)  # box, cls, dfl, angle
        pred_distri, pred_scores, pred_angle = (preds["boxes"].permute(0, 2, 1).contiguous(),
                                                preds["scores"].permute(0, 2, 1).contiguous(),
                                                preds["angle"].permute(0, 2, 1).contiguous())
        dtype = pred_scores.dtype
        batch_size = pred_angle.shape[0]
        c = self._constants(preds["feats"], dtype)
        anchor_points, stride_tensor, imgsz = c.anchor_points, c.stride_tensor, c.imgsz

        targets = self._pad_rboxes(targets.to(self.device), batch_size, n, c)
        gt_labels, gt_bboxes = targets.split((1, 5), 2)  # cls, xywhr
        mask_gt = gt_bboxes.sum(2, keepdim=True).gt_(0.0)
        pred_bboxes = self.bbox_decode(anchor_points, pred_distri, pred_angle)  # xywhr, (b, h*w, 5)
        bboxes_for_assigner = pred_bboxes.clone().detach()
        bboxes_for_assigner[..., :4] *= stride_tensor

        candidates = batch.get(CANDIDATES)
        self.assigner.candidates = None if candidates is None else (candidates, batch_size)
        try:
            _, target_bboxes, target_scores, fg_mask, _ = self.assigner(
                pred_scores.detach().sigmoid(), bboxes_for_assigner.type(gt_bboxes.dtype),
                anchor_points * stride_tensor, gt_labels, gt_bboxes, mask_gt)
        finally:
            self.assigner.candidates = None
        target_scores_sum = target_scores.sum().clamp_(min=1)  # max(sum, 1) in Ultralytics: the same value

        bce_loss = self.bce(pred_scores, target_scores.to(dtype))
        if self.class_weights is not None:
            bce_loss *= self.class_weights
        loss[1] = bce_loss.sum() / target_scores_sum

        # the foreground: at most topk anchors per box (known on the host), at most the candidates
        bound = min(batch_size * pred_scores.shape[1], batch_size * n * self.assigner.topk)
        self.bbox_loss.bound = max(1, bound if candidates is None else min(bound, candidates))
        target_bboxes[..., :4] /= stride_tensor
        try:
            loss[0], loss[2] = self.bbox_loss(pred_distri, pred_bboxes, anchor_points, target_bboxes, target_scores,
                                              target_scores_sum, fg_mask, imgsz, stride_tensor)
        finally:
            self.bbox_loss.bound = None
        loss[3] = self._angle_loss(pred_bboxes, target_bboxes, fg_mask, target_scores, target_scores_sum)
        loss[0] *= self.hyp.box
        loss[1] *= self.hyp.cls
        loss[2] *= self.hyp.dfl
        loss[3] *= self.hyp.angle
        return loss * batch_size, dict(zip(self.loss_names, loss.detach()))

    def _pad_rboxes(self, targets: Tensor, batch_size: int, n: int, c: _Constants) -> Tensor:
        """Ultralytics' tiny-box filter (``targets[(rw >= 2) & (rh >= 2)]``) then ``preprocess``, with the most boxes
        in one image given: no sync. Each image's rows hold the boxes the filter keeps, in order, then zeros, as
        Ultralytics pads them; a dropped box is a row of zeros (``mask_gt`` 0) after them.

        What the padding costs: ``n`` counts the boxes before the filter, Ultralytics' after it, so the assigner's
        (B, n, anchors) tensors hold up to the fullest image's tiny boxes more rows, all masked. The assignment is
        the same (a row of zeros is never a candidate; the max over boxes keeps the first of equal overlaps).

        Args:
            targets: (N, 7) batch index, class, normalised xywhr: Ultralytics' rows, sorted by image.
        Returns:
            (B, n, 6) class and xywhr in pixels.
        """
        h, w = c.hw
        keep = (targets[:, 4] * w >= 2) & (targets[:, 5] * h >= 2)  # Ultralytics' rw, rh: the same products
        batch_idx = targets[:, 0].long()
        kept = keep.long()
        rows = torch.zeros(batch_size + 1, dtype=torch.long, device=self.device)
        first = rows.scatter_add(0, batch_idx + 1, torch.ones_like(batch_idx)).cumsum(0)[batch_idx]
        kept_images = rows.scatter_add(0, batch_idx + 1, kept).cumsum(0)  # kept rows of the images before each
        kept_before = kept.cumsum(0) - kept - kept_images[batch_idx]  # kept rows before this one, in its image
        kept_in_image = (kept_images[1:] - kept_images[:-1])[batch_idx]
        position = torch.arange(len(targets), device=self.device) - first
        within = torch.where(keep, kept_before, kept_in_image + position - kept_before)  # dropped ones after the kept
        packed = targets[:, 1:].clone()
        packed[:, 1:5].mul_(c.scale)
        out = torch.zeros(batch_size, n, 6, device=self.device)
        out[batch_idx, within] = torch.where(keep[:, None], packed, 0.0)  # a count too small: an index error
        return out

    @staticmethod
    def _angle_loss(pred_bboxes: Tensor, target_bboxes: Tensor, fg_mask: Tensor, target_scores: Tensor,
                    target_scores_sum: Tensor, lambda_val: int = 3) -> Tensor:
        """``calculate_angle_loss`` over every anchor (B, A), the foreground's terms kept by a mask where Ultralytics
        gathers them (boolean indexing, twice); its weight, the foreground's target scores summed, is 0 elsewhere."""
        w_gt = target_bboxes[..., 2]
        h_gt = target_bboxes[..., 3]
        pred_theta = torch.where(fg_mask, pred_bboxes[..., 4], 0.0)  # the background passes no gradient
        target_theta = target_bboxes[..., 4]
        log_ar = torch.log((w_gt + 1e-9) / (h_gt + 1e-9))
        scale_weight = torch.exp(-(log_ar ** 2) / (lambda_val ** 2))
        delta_theta = pred_theta - target_theta
        delta_theta_wrapped = delta_theta - torch.round(delta_theta / math.pi) * math.pi
        ang_loss = scale_weight * torch.sin(2 * delta_theta_wrapped) ** 2 * target_scores.sum(-1)
        return torch.where(fg_mask, ang_loss, 0.0).sum() / target_scores_sum

    def padded_gt(self, batch: dict[str, Tensor], n: int) -> Tensor | None:
        """This loss's padded pixel boxes for an Ultralytics batch, (B, n, 5) xywhr (None before the first call)."""
        c = self.last_constants()
        if c is None:
            return None
        targets = torch.cat((batch["batch_idx"].view(-1, 1), batch["cls"].view(-1, 1), batch["bboxes"].view(-1, 5)), 1)
        return self._pad_rboxes(targets.to(self.device), len(batch["img"]), n, c)[..., 1:6]

    def early_candidates(self, gt_xywhr: Tensor) -> Tensor | None:
        """The count the rotated assigner's ``get_box_metrics`` will gather for these boxes, on the device (no
        sync); None before the first loss call has made the anchors.

        The rotated test keeps an anchor whose centre p has ap.ab in [0, |ab|^2] and ap.ad in [0, |ad|^2]
        (``select_candidates_in_gts``). Along one row of a level's anchor grid, each of those four comparisons
        holds on a prefix or a suffix of the row: ap.ab is rounded(rounded(px - ax) * abx + rounded(py - ay) * aby),
        and each rounding step is monotone, so it moves one way as px grows (the way of abx's sign). So a row's
        candidates are one run of anchors, found by a binary search per comparison on the assigner's own float32
        values (``_rbox_edges``): (B, K, rows, 4) tensors, searched in log2(widest row) steps. It costs about half
        the assigner's own (B, K, anchors) candidate mask (one of the assigner's many passes of that size; measured
        on the CPU at 640 px), and is exact where an analytic edge would not be: boxes whose edges pass through anchor
        centres (axis-aligned boxes on integer pixels) and edges a hair off a row.

        Args:
            gt_xywhr: (B, K, 5) boxes in pixels as the loss's padding makes them; rows of zeros are padding (or
                boxes the tiny-box filter drops), in any order.
        """
        c = self.last_constants()
        if c is None:
            return None
        x, row_start, row_width, y = self._grid_rows(c)
        mask_gt = gt_xywhr.sum(2, keepdim=True).gt_(0.0)
        a, ab, ad, norm_ab, norm_ad = _rbox_edges(gt_xywhr, mask_gt, self.assigner.stride_val)
        ax, ay = a[..., 0:1], a[..., 1]  # (B, K, 1, 1), (B, K, 1)
        edge_x = torch.cat([ab[..., 0], ab[..., 0], ad[..., 0], ad[..., 0]], -1)[:, :, None]  # (B, K, 1, 4)
        edge_y = torch.cat([ab[..., 1], ab[..., 1], ad[..., 1], ad[..., 1]], -1)[:, :, None]
        bound = torch.cat([torch.zeros_like(norm_ab), norm_ab, torch.zeros_like(norm_ad), norm_ad], -1)[:, :, None]
        at_least = torch.arange(4, device=gt_xywhr.device) % 2 == 0  # ap.e >= 0, ap.e <= |e|^2, twice
        prefix = at_least != (edge_x >= 0)  # (B, K, 1, 4): the comparison holds on a prefix of each row
        dy = ((y - ay)[..., None] * edge_y)  # (B, K, rows, 4): rounded(py - ay) * ey, fixed along a row
        lo = torch.zeros(dy.shape, dtype=torch.long, device=dy.device)
        width = row_width[:, None].expand_as(lo)
        hi = width.clone()
        for _ in range(max(cx.numel() for cx, _ in c.centers).bit_length()):  # w + 1 outcomes a row, halved
            mid = (lo + hi) // 2
            px = x[row_start[:, None] + torch.minimum(mid, width - 1)]  # mid == width once a search is done
            dot = (px - ax) * edge_x + dy
            holds = torch.where(at_least, dot >= bound, dot <= bound)
            active = lo < hi
            right = holds == prefix  # mid lies before the flip: in the prefix, or before the suffix
            lo = torch.where(active & right, mid + 1, lo)
            hi = torch.where(active & ~right, mid, hi)
        # lo is each comparison's flip: a prefix [0, lo) or a suffix [lo, width)
        start = torch.where(prefix, 0, lo).amax(-1)
        end = torch.where(prefix, lo, width).amin(-1)
        per_box = (end - start).clamp_(min=0).sum(-1)  # (B, K)
        return (per_box * mask_gt[..., 0].long()).sum()

    def _grid_rows(self, c: _Constants) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The anchor rows of every level, for ``early_candidates``: all x centres (float32, the levels one after
        another), each row's first index into them and its width, and each row's y centre. Made once per constants,
        on the device (no host copy)."""
        cache = self.__dict__.setdefault("_yf_rows", {})
        key = id(c)
        if key not in cache:
            xs = torch.cat([cx for cx, _ in c.centers])
            starts, widths, ys, off = [], [], [], 0
            for cx, cy in c.centers:
                starts.append(torch.full(cy.shape, off, dtype=torch.long, device=cy.device))
                widths.append(torch.full(cy.shape, cx.numel(), dtype=torch.long, device=cy.device))
                ys.append(cy)
                off += cx.numel()
            cache[key] = (c, (xs, torch.cat(starts), torch.cat(widths), torch.cat(ys)))
        return cache[key][1]


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


def padded_gt_from_ultralytics(batch: dict[str, Tensor], n: int, loss: SyncFreeLoss) -> Tensor | None:
    """The loss's padded pixel boxes for an Ultralytics batch (the ceiling's replayed batches), as its
    ``early_candidates`` takes them: (B, n, 4) xyxy, or (B, n, 5) xywhr for OBB; None before the first loss call."""
    return loss.padded_gt(batch, n)


def padded_gt_from_augmented(boxes: Tensor, valid: Tensor, size: int, loss: SyncFreeDetectionLoss) -> Tensor | None:
    """The loss's padded pixel boxes for an ``AugmentedBatch`` (B, K, 4 xyxy pixels; valid (B, K)), computed by
    the same elementwise steps as ``to_ultralytics`` and the loss's padding, so every box has the same value."""
    c = loss.last_constants()
    if c is None:
        return None
    xywh = normalised_xywh(boxes, size)
    xywh = torch.where(valid[..., None], xywh, 0.0).to(torch.float32)
    return xywh2xyxy(xywh.mul_(c.scale))


def padded_rboxes_from_augmented(rboxes: Tensor, valid: Tensor, loss: SyncFreeOBBLoss) -> Tensor | None:
    """The OBB loss's padded pixel boxes for an augmented OBB batch, by the loss's own elementwise steps (its
    tiny-box filter, its scale), in the batch's slots: a box the filter drops, or an empty slot, is a row of zeros.

    Args:
        rboxes: (B, K, 5) normalised xywhr, the tensor whose valid rows the batch's ``bboxes`` are (selected, not
            computed again: the count is exact only for the same values). valid: (B, K).
    """
    c = loss.last_constants()
    if c is None:
        return None
    h, w = c.hw
    keep = valid & (rboxes[..., 2] * w >= 2) & (rboxes[..., 3] * h >= 2)
    pixels = torch.cat([rboxes[..., :4] * c.scale, rboxes[..., 4:]], -1)
    return torch.where(keep[..., None], pixels, 0.0).to(torch.float32)


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


def early_rbox_candidates_for(loss: SyncFreeOBBLoss, rboxes: Tensor, valid: Tensor) -> Tensor | None:
    """``early_candidates`` for an augmented OBB batch's boxes (``padded_rboxes_from_augmented``), or None before the
    loss has cached its anchors."""
    gt = padded_rboxes_from_augmented(rboxes, valid, loss)
    return None if gt is None else loss.early_candidates(gt)

"""The sync-free detection loss: Ultralytics' ``v8DetectionLoss``, its task-aligned assigner and box loss, given
the counts read a step early (the package's docstring says which syncs go and how)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from yolofeed import ultralytics_seam as seam
from yolofeed.kernels import bce_sum as bce_sum_op
from yolofeed.schema import normalised_xywh  # to_ultralytics' own formula: the same box values
from yolofeed.ultralytics_seam import (
    BboxLoss,
    TaskAlignedAssigner,
    bbox2dist,
    bbox_iou,
    make_anchors,
    v8DetectionLoss,
    xywh2xyxy,
    xyxy2xywh,
)


@dataclass
class Constants:
    """What the loss recomputes (with syncs) every call in Ultralytics, for one set of feature-map shapes."""

    anchor_points: Tensor  # (A, 2) grid units, the feature maps' dtype
    stride_tensor: Tensor  # (A, 1)
    imgsz: Tensor  # (2,) h, w in pixels, the predictions' dtype
    scale: Tensor  # (4,) w, h, w, h: the padding's scale
    centers: list[tuple[Tensor, Tensor]]  # per level: (w,) x and (h,) y anchor centres in pixels, float32, sorted
    hw: tuple[float, float]  # imgsz on the host, float(imgsz[0]), float(imgsz[1]): the OBB loss's tiny-box filter
    levels: tuple[tuple[int, int], ...]  # per level: (h, w), the anchors make_anchors lays out row by row


MAX_BOXES = "max_boxes"  # batch keys: Python ints, known on the host before the step
CANDIDATES = "tal_candidates"
GRID_CANDIDATES = True  # False: the assigner's candidate mask as Ultralytics computes it (swap_ab off=grid_candidates)
FOREGROUND_NORM = True  # False: the assigner's normalisation over every (box, anchor) pair (off=foreground_norm)


class SyncFreeAssigner(TaskAlignedAssigner):
    """``TaskAlignedAssigner`` whose candidate gather takes its size from ``candidates`` and whose candidate mask is
    made level by level where ``levels`` says how the anchors lie (both set per call); its metric's normalisation and
    target scores are made on each anchor's own box (``_forward``).

    ``candidates`` is (count, batch size): the OOM fallback, which assigns one image at a time, takes
    Ultralytics' path.
    """

    candidates: tuple[int, int] | None = None
    levels: tuple[tuple[int, int], ...] | None = None  # the anchors' (h, w) per level, as make_anchors lays them out
    mismatch: Tensor | None = None  # on the device: a count that was not the real one (read at epoch ends)

    def select_candidates_in_gts(self, xy_centers, gt_bboxes, mask_gt, eps=1e-9):
        """Ultralytics' code, with ``stride_val`` as a Python scalar (a 0-d tensor built per call syncs); with
        ``levels``, the four comparisons made along each level's x and y (``_grid_inside``)."""
        gt_bboxes_xywh = xyxy2xywh(gt_bboxes)
        wh_mask = gt_bboxes_xywh[..., 2:] < self.stride_val
        gt_bboxes_xywh[..., 2:] = torch.where((wh_mask * mask_gt).bool(), float(self.stride_val),
                                              gt_bboxes_xywh[..., 2:])
        gt_bboxes = xywh2xyxy(gt_bboxes_xywh)
        lt, rb = gt_bboxes.unsqueeze(2).chunk(2, 3)
        levels = self.levels
        if GRID_CANDIDATES and levels is not None and sum(h * w for h, w in levels) == xy_centers.shape[0]:
            return _grid_inside(xy_centers, lt, rb, levels, eps)
        mask = xy_centers[:, 0] - lt[..., 0] > eps
        mask &= xy_centers[:, 1] - lt[..., 1] > eps
        mask &= rb[..., 0] - xy_centers[:, 0] > eps
        mask &= rb[..., 1] - xy_centers[:, 1] > eps
        return mask

    def _forward(self, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, **extra):
        """Ultralytics' code, its normalisation of the alignment metric made on each anchor's own box
        (``_foreground_norm``) where it is made on every (box, anchor) pair, and the target scores made from it at
        once (``_targets``); ``extra`` handed on only where given (before 8.4.180 ``get_pos_mask`` takes none, and
        ``forward`` gives none)."""
        if not FOREGROUND_NORM:
            return super()._forward(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, **extra)
        mask_pos, align_metric, overlaps = self.get_pos_mask(pd_scores, pd_bboxes, gt_labels, gt_bboxes, anc_points,
                                                             mask_gt, **extra)
        target_gt_idx, fg_mask, mask_pos = self.select_highest_overlaps(mask_pos, overlaps, self.n_max_boxes,
                                                                        align_metric)
        norm_align_metric = _foreground_norm(align_metric, overlaps, target_gt_idx, fg_mask.bool(), self.eps)
        target_labels, target_bboxes, target_scores = self._targets(gt_labels, gt_bboxes, target_gt_idx,
                                                                    norm_align_metric)
        return target_labels, target_bboxes, target_scores, fg_mask.bool(), target_gt_idx

    def _targets(self, gt_labels, gt_bboxes, target_gt_idx, norm_align_metric):
        """Ultralytics' ``get_targets``, the scores made at once as ``_forward`` then makes them: each anchor's
        ``norm_align_metric`` (0 off the foreground) at its label, in the metric's dtype. Ultralytics writes an int8
        one-hot (B, anchors, classes), multiplies it by the foreground mask, then by the metric into a new float32
        tensor, three passes of that size where here one writes it: 1 x m and 0 x m are m and 0, the same values."""
        batch_ind = torch.arange(end=self.bs, dtype=torch.int64, device=gt_labels.device)[..., None]
        target_gt_idx = target_gt_idx + batch_ind * self.n_max_boxes
        target_labels = gt_labels.long().flatten()[target_gt_idx]
        target_bboxes = gt_bboxes.view(-1, gt_bboxes.shape[-1])[target_gt_idx]
        target_labels.clamp_(0)
        target_scores = torch.zeros((*target_labels.shape, self.num_classes), dtype=norm_align_metric.dtype,
                                    device=target_labels.device)
        target_scores.scatter_(2, target_labels.unsqueeze(-1), norm_align_metric.unsqueeze(-1))
        return target_labels, target_bboxes, target_scores

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


def _grid_inside(xy_centers: Tensor, lt: Tensor, rb: Tensor, levels: tuple[tuple[int, int], ...],
                 eps: float) -> Tensor:
    """``select_candidates_in_gts``' (B, K, anchors) mask, anchor centre strictly inside the box, for anchors laid out
    as ``make_anchors`` lays them: level by level, each a grid row by row, every row with the same x and every
    column with the same y.

    Ultralytics makes each of its four comparisons over every (box, anchor) pair: a float32 difference written and read
    back, then a mask, then an AND, about 45 bytes of memory traffic a pair (yolo11n at batch 128 and 640 px with 40
    boxes an image: 43 M pairs, 2 GB a call; YOLO26's two losses call it twice). Here the same comparisons of the same
    values run along each level's x, (B, K, w), and y, (B, K, h), and one AND writes the mask, one byte a pair: the
    same mask, bit for bit.

    The AND writes each level's part of the mask through an ``out=`` view: ``torch.compile(fullgraph=True)`` refuses a
    non-contiguous ``out=``, but the loss runs eager (Ultralytics' ``compile=True`` compiles the model's forward only).

    Args:
        xy_centers: (anchors, 2) the anchors' centres in pixels, in their own dtype (float16 under AMP).
        lt, rb: (B, K, 1, 2) the boxes' corners, as ``select_candidates_in_gts`` makes them.
        levels: (h, w) per level, in make_anchors' order; their h x w sum to the anchors (the only check: the loss
            hands over the shapes of the feature maps it made the anchors from).
    """
    starts = [0]
    for h, w in levels:
        starts.append(starts[-1] + h * w)
    x = torch.cat([xy_centers[o:o + w, 0] for o, (h, w) in zip(starts, levels)])  # each level's first row: its x
    y = torch.cat([xy_centers[o:o + h * w:w, 1] for o, (h, w) in zip(starts, levels)])  # its first column: its y
    inside_x = (x - lt[..., 0] > eps) & (rb[..., 0] - x > eps)  # (B, K, all levels' w): five launches for all levels
    inside_y = (y - lt[..., 1] > eps) & (rb[..., 1] - y > eps)
    mask = torch.empty((*lt.shape[:2], xy_centers.shape[0]), dtype=torch.bool, device=lt.device)
    ox = oy = 0
    for o, (h, w) in zip(starts, levels):
        torch.logical_and(inside_y[..., oy:oy + h, None], inside_x[..., None, ox:ox + w],
                          out=mask[..., o:o + h * w].unflatten(-1, (h, w)))  # a view: written in place
        ox, oy = ox + w, oy + h
    return mask


def _foreground_norm(align_metric: Tensor, overlaps: Tensor, target_gt_idx: Tensor, fg: Tensor, eps: float) -> Tensor:
    """The assigner's ``norm_align_metric``, (B, anchors): each foreground anchor's alignment metric with its box,
    times the box's best overlap among its positive anchors, over its best metric among them (+ eps); 0 elsewhere.

    Ultralytics computes it over every (box, anchor) pair: ``align_metric *= mask_pos``, ``overlaps *= mask_pos``,
    an amax of each over the anchors, ``mul_``, ``div_`` and an amax over the boxes, eight passes over two float32
    (B, K, anchors) tensors (yolo26n at batch 128 and 640 px with 50 boxes an image: about 5 GB a step, its two
    assigners together). After ``select_highest_overlaps`` an anchor is positive for one box at most, its
    ``target_gt_idx``, so each of those maxima has one term that is not zero: here the same products and quotients
    of the same values are made once an anchor, on its own box (a gather of (B, anchors) from each tensor), and the
    per-box maxima by a scatter of them (a max does not depend on its order). The same values, bit for bit, where
    the metrics are finite. A metric that is not (a NaN score; YOLO26's inverted boxes can make CIoU 0/0) makes the
    target scores, and so the loss, not a number on both paths; Ultralytics' ``x * 0`` spreads it to every anchor of
    the image, here it reaches its box's anchors (and, on box 0, the background's, which read box 0).
    """
    at = target_gt_idx.unsqueeze(1)
    align = torch.where(fg, align_metric.gather(1, at).squeeze(1), 0.0)  # Ultralytics' align_metric * mask_pos
    overlap = torch.where(fg, overlaps.gather(1, at).squeeze(1), 0.0)
    shape = align_metric.shape[:2]  # (B, K): the amax over the anchors, of zeros and the positive anchors' terms
    pos_align = align.new_zeros(shape).scatter_reduce_(1, target_gt_idx, align, "amax")
    pos_overlap = overlap.new_zeros(shape).scatter_reduce_(1, target_gt_idx, overlap, "amax")
    return align.mul_(pos_overlap.gather(1, target_gt_idx)).div_((pos_align + eps).gather(1, target_gt_idx))


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


def foreground_box_losses(loss, fg_mask: Tensor, pred_dist: Tensor, pred_bboxes: Tensor, target_bboxes: Tensor,
                          target_ltrb: Tensor, target_scores: Tensor, target_scores_sum: Tensor, imgsz: Tensor,
                          stride: Tensor, iou, unit: Tensor) -> tuple[Tensor, Tensor]:
    """The box losses of ``BboxLoss.forward`` and ``RotatedBboxLoss.forward`` on the foreground gathered through
    ``nonzero_static`` (``loss.bound`` rows), where Ultralytics indexes five tensors with the boolean mask (a sync
    each): the IoU term, then the DFL term (or, without DFL, the L1 of the distances scaled to the image).

    Args:
        loss: the ``BboxLoss`` / ``RotatedBboxLoss`` (its ``bound`` and ``dfl_loss``).
        target_ltrb: the target distances of every anchor, as the loss's own ``bbox2dist`` / ``rbox2dist`` makes
            them (with ``reg_max - 1`` where there is DFL).
        iou: (pred, target) -> IoU of the gathered boxes (``bbox_iou`` CIoU, ``probiou``).
        unit: the fixed box padded rows compute on.
    """
    fg, real = foreground_rows(fg_mask, loss.bound)
    weight = target_scores[fg].sum(-1, keepdim=True) * real
    # Padded rows compute on a fixed unit box, not on what their anchor predicts: weight 0 does not stop a
    # non-finite gradient (0 x inf = NaN), and a background anchor's box can be degenerate where Ultralytics
    # never looks (in float16 a box thinner than width / 65504 overflows CIoU's aspect term: AMP's scale then
    # collapses and YOLO26 never learns). torch.where passes no gradient to the rows it does not take.
    overlap = iou(torch.where(real, pred_bboxes[fg], unit), torch.where(real, target_bboxes[fg],
                                                                        unit.to(target_bboxes.dtype)))
    loss_iou = ((1.0 - overlap) * weight).sum() / target_scores_sum
    if loss.dfl_loss:
        zero = torch.zeros((), dtype=pred_dist.dtype, device=pred_dist.device)
        dist = torch.where(real, pred_dist[fg], zero)
        ltrb = torch.where(real, target_ltrb[fg], zero.to(target_ltrb.dtype))
        loss_dfl = loss.dfl_loss(dist.view(-1, loss.dfl_loss.reg_max), ltrb) * weight
        return loss_iou, loss_dfl.sum() / target_scores_sum
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
    return loss_iou, loss_dfl.sum() / target_scores_sum


class SyncFreeBboxLoss(BboxLoss):
    """``BboxLoss`` gathering the foreground through ``nonzero_static``, ``bound`` rows (set per call)."""

    bound: int | None = None

    def forward(self, pred_dist, pred_bboxes, anchor_points, target_bboxes, target_scores, target_scores_sum,
                fg_mask, imgsz, stride):
        if self.bound is None:
            return super().forward(pred_dist, pred_bboxes, anchor_points, target_bboxes, target_scores,
                                   target_scores_sum, fg_mask, imgsz, stride)
        reach = (self.dfl_loss.reg_max - 1,) if self.dfl_loss else ()
        return foreground_box_losses(
            self, fg_mask, pred_dist, pred_bboxes, target_bboxes, bbox2dist(anchor_points, target_bboxes, *reach),
            target_scores, target_scores_sum, imgsz, stride,
            lambda a, b: bbox_iou(a, b, xywh=False, CIoU=True), _unit_box(pred_bboxes))


class SyncFreeLoss:
    """What the sync-free losses share (a base before Ultralytics' loss class): the constants Ultralytics recomputes
    with syncs every call, cached per feature-map shape, and those of the last call (the next batch's counts use them);
    the classification term (``bce_sum``).
    """

    def bce_sum(self, pred_scores: Tensor, target_scores: Tensor, dtype: torch.dtype) -> Tensor:
        """Ultralytics' ``self.bce(pred_scores, target_scores.to(dtype))``, times ``class_weights`` where set, summed;
        on CUDA, where ``kernels.bce_sum.takes`` it, one pass each way: the same gradient element for element, the
        sum in another order."""
        if self.class_weights is None and dtype == pred_scores.dtype and bce_sum_op.takes(self.bce, pred_scores,
                                                                                          target_scores):
            return bce_sum_op.bce_sum(pred_scores, target_scores)
        bce_loss = self.bce(pred_scores, target_scores.to(dtype))
        if self.class_weights is not None:
            bce_loss *= self.class_weights
        return bce_loss.sum()

    def _constants(self, feats: list[Tensor], dtype: torch.dtype) -> Constants:
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
            cache[key] = Constants(anchor_points, stride_tensor, imgsz, imgsz[[1, 0, 1, 0]], centers,
                                    tuple(imgsz.tolist()), shapes)
            self.__dict__["_yf_last"] = key
        return cache[key]

    def last_constants(self) -> Constants | None:
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
        # bool, where Ultralytics' is float: the assigner's (B, K, anchors) candidates, its mask times this one, are
        # then a bool product, not float32 (4 bytes a pair written, then read back for its .bool()); the same values
        mask_gt = gt_bboxes.sum(2, keepdim=True) > 0.0 if GRID_CANDIDATES else gt_bboxes.sum(2, keepdim=True).gt_(0.0)
        pred_bboxes = self.bbox_decode(anchor_points, pred_distri)

        candidates = batch.get(CANDIDATES)
        self.assigner.candidates = None if candidates is None else (candidates, batch_size)
        self.assigner.levels = c.levels
        try:
            _, target_bboxes, target_scores, fg_mask, target_gt_idx = self.assigner(
                pred_scores.detach().sigmoid(), (pred_bboxes.detach() * stride_tensor).type(gt_bboxes.dtype),
                anchor_points * stride_tensor, gt_labels, gt_bboxes, mask_gt)
        finally:
            self.assigner.candidates = self.assigner.levels = None
        target_scores_sum = target_scores.sum().clamp_(min=1)

        loss[1] = self.bce_sum(pred_scores, target_scores, dtype) / target_scores_sum

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

"""The sync-free OBB loss: Ultralytics' ``v8OBBLoss``, its rotated assigner and box loss, without host syncs."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from yolofeed.train.loss import detect
from yolofeed.train.loss.detect import (
    CANDIDATES,
    MAX_BOXES,
    Constants,
    SyncFreeAssigner,
    SyncFreeLoss,
    foreground_box_losses,
)
from yolofeed.ultralytics_seam import (
    RotatedBboxLoss,
    RotatedTaskAlignedAssigner,
    probiou,
    rbox2dist,
    v8OBBLoss,
    xywhr2xyxyxyxy,
)


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
    ``SyncFreeBboxLoss`` does (``foreground_box_losses``)."""

    bound: int | None = None

    def forward(self, pred_dist, pred_bboxes, anchor_points, target_bboxes, target_scores, target_scores_sum,
                fg_mask, imgsz, stride):
        if self.bound is None:
            return super().forward(pred_dist, pred_bboxes, anchor_points, target_bboxes, target_scores,
                                   target_scores_sum, fg_mask, imgsz, stride)
        reach = {"reg_max": self.dfl_loss.reg_max - 1} if self.dfl_loss else {}
        target_ltrb = rbox2dist(target_bboxes[..., :4], anchor_points, target_bboxes[..., 4:5], **reach)
        return foreground_box_losses(
            self, fg_mask, pred_dist, pred_bboxes, target_bboxes, target_ltrb, target_scores, target_scores_sum,
            imgsz, stride, lambda a, b: probiou(a, b, floor=self.floor), _unit_rbox(pred_bboxes))


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
        # bool, as the detection loss's: the assigner's candidates a bool product, not float32; the same values
        mask_gt = (gt_bboxes.sum(2, keepdim=True) > 0.0 if detect.GRID_CANDIDATES
                   else gt_bboxes.sum(2, keepdim=True).gt_(0.0))
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

        loss[1] = self.bce_sum(pred_scores, target_scores, dtype) / target_scores_sum

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

    def _pad_rboxes(self, targets: Tensor, batch_size: int, n: int, c: Constants) -> Tensor:
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

    def _grid_rows(self, c: Constants) -> tuple[Tensor, Tensor, Tensor, Tensor]:
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


def early_rbox_candidates_for(loss: SyncFreeOBBLoss, rboxes: Tensor, valid: Tensor) -> Tensor | None:
    """``early_candidates`` for an augmented OBB batch's boxes (``padded_rboxes_from_augmented``), or None before the
    loss has cached its anchors."""
    gt = padded_rboxes_from_augmented(rboxes, valid, loss)
    return None if gt is None else loss.early_candidates(gt)

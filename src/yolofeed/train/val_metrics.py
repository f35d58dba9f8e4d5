"""Ultralytics' detection ``update_metrics`` for a whole batch at once: the same statistics, a few ops per batch.

``DetectionValidator.update_metrics`` works image by image: the image's targets (a mask over the batch's), their
boxes, one ``box_iou``, a class mask, a copy to the host and ``match_predictions``' greedy loop in numpy (one
iteration per detection that overlaps a target at IoU 0.5), then three more copies to the host. That is about 80
aten ops and four host syncs per image: on a GPU each op is a launch the host pays for whatever its size
(``tools/val_host_cost.py`` counts them), and on the CPU the loop alone is ~1 ms per image with a few hundred
detections.

Here the batch's targets and detections are padded to (B, T) and (B, P), the IoU is one (B, T, P) computation with
``box_iou``'s arithmetic element for element, it reaches the host in one copy, and the greedy matching runs once per
detection rank for all images and thresholds together (an image's detections are independent of the others'). Each
image's statistics are then the arrays Ultralytics would append (same values, same dtypes, the empty ``float64``
arrays of an image without detections included), handed to its own ``metrics.update_stats``: the concatenation,
``ap_per_class`` and the per-image metrics downstream are Ultralytics' on identical input.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from yolofeed.train.val_nms import batched_nms
from yolofeed.ultralytics_seam import (
    DetectionValidator,
    batched_metrics_serve,
    record_image_stats,
    swap_class,
    xywh2xyxy,
)


def padded_iou(targets: torch.Tensor, preds: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """``box_iou`` of each image's targets with its detections, for a padded batch: the same float ops per element.

    Shape:
        targets: (B, T, 4) xyxy; preds: (B, P, 4) xyxy; returns (B, T, P) float32.
    """
    (a1, a2), (b1, b2) = targets.float().unsqueeze(2).chunk(2, 3), preds.float().unsqueeze(1).chunk(2, 3)
    wh, wh1, wh2 = (torch.min(a2, b2) - torch.max(a1, b1)).clamp_(0), a2 - a1, b2 - b1
    inter = wh[..., 0] * wh[..., 1]
    return inter / (wh1[..., 0] * wh1[..., 1] + wh2[..., 0] * wh2[..., 1] - inter + eps)


def match_batch(iou: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """``BaseValidator.match_predictions`` (greedy, not scipy) for every image of a padded batch at once.

    Each image's detections are taken in their order (descending confidence, as NMS leaves them), only those with an
    IoU at the lowest threshold with some target, as Ultralytics' loop takes them; at each threshold a detection
    claims the unclaimed target of highest IoU (the first on a tie), and is correct if that IoU reaches the
    threshold. Padding must be 0 (below every threshold): a padded target is never claimed, a padded detection never
    taken.

    Args:
        iou: class-masked IoU (zero where the classes differ), padding 0.
        thresholds: the IoU thresholds (Ultralytics' ``iouv``).

    Shape:
        iou: (B, T, P) float32; thresholds: (K,); returns (B, P, K) bool.
    """
    b, t, p = iou.shape
    k = len(thresholds)
    correct = np.zeros((b, p, k), bool)
    if not (b and t and p):
        return correct
    taken = (iou >= thresholds.min()).any(1)  # (B, P): the detections Ultralytics' loop visits
    count = taken.sum(1)
    order = np.argsort(~taken, axis=1, kind="stable")  # each image's visited detections first, in their order
    matched = np.zeros((b, t, k), bool)
    images, levels = np.arange(b), np.arange(k)
    # one pass per detection rank for all images and thresholds: the batch's most visited detections in one image,
    # tens, where Ultralytics iterates once per visited detection of every image
    for r in range(int(count.max())):
        live = r < count
        j = order[:, r]
        available = np.where(matched, 0, iou[images, :, j][:, :, None])  # (B, T, K)
        best = available.argmax(1)  # (B, K): first maximum, as np.argmax over one image's targets
        hit = (np.take_along_axis(available, best[:, None, :], 1)[:, 0] >= thresholds) & live[:, None]
        correct[images[live], j[live]] = hit[live]
        matched[images[:, None], best, levels] |= hit
    return correct


def confuse_batch(matrix: np.ndarray, iou: np.ndarray, conf: np.ndarray, target_cls: np.ndarray,
                  pred_cls: np.ndarray, threshold: float) -> None:
    """``ConfusionMatrix.process_batch`` (detection) for every image of a padded batch at once, added to ``matrix``.

    Each image's candidates (kept detections whose class-agnostic IoU with some target exceeds ``threshold``) are
    taken by descending confidence (a stable sort, as Ultralytics'); each claims the target of highest IoU (the first
    on a tie) among those no detection claimed yet, where that IoU exceeds ``threshold``. A claimed target counts at
    [its detection's class, its class], an unclaimed one at [background, its class], an unclaiming kept detection at
    [its class, background]. Padding, and detections below the matrix's confidence, must have IoU 0 and a class of -1.

    Args:
        matrix: the (nc + 1, nc + 1) counts, [predicted, true], background last; added to in place.
        iou: class-agnostic IoU of targets with detections (``box_iou``'s), padding and dropped detections 0.
        conf: the detections' confidences (any value where padded or dropped).
        target_cls: the targets' classes, -1 where padded.
        pred_cls: the kept detections' classes, -1 where padded or dropped.
        threshold: the IoU a claim needs (``process_batch``'s ``iou_thres``).

    Shape:
        iou: (B, T, P) float32; conf: (B, P); target_cls: (B, T) int; pred_cls: (B, P) int.
    """
    b, t, p = iou.shape
    nc = matrix.shape[0] - 1
    claimed = np.full((b, t), -1)  # the detection each target's claimed by
    if t and p:
        candidate = (iou > threshold).any(1)  # (B, P)
        count = candidate.sum(1)
        order = np.argsort(np.where(candidate, -conf, np.inf), axis=1, kind="stable")  # candidates first, by -conf
        images = np.arange(b)
        for r in range(int(count.max())):  # one pass per candidate rank for all images
            live = r < count
            j = order[:, r]
            column = np.where(claimed >= 0, 0, iou[images, :, j])  # (B, T): a claimed target's row is zeroed there
            best = column.argmax(1)
            hit = live & (column[images, best] > threshold)
            claimed[images[hit], best[hit]] = j[hit]
    real = target_cls >= 0
    hit = real & (claimed >= 0)
    missed = real & ~hit
    unclaimed = pred_cls >= 0
    claimer = np.nonzero(hit)[0], claimed[hit]  # (image, detection) of each claimed target
    unclaimed[claimer] = False
    np.add.at(matrix, (pred_cls[claimer], target_cls[hit]), 1)  # TP if the classes agree, else FP and FN
    np.add.at(matrix, (np.full(int(missed.sum()), nc), target_cls[missed]), 1)  # FN
    np.add.at(matrix, (pred_cls[unclaimed], np.full(int(unclaimed.sum()), nc)), 1)  # FP


def update_metrics(validator: Any, preds: list[dict[str, torch.Tensor]], batch: dict[str, Any]) -> bool:
    """``DetectionValidator.update_metrics(preds, batch)`` batched, the confusion matrix under ``plots`` included;
    False (nothing done) where it does more (json, txt, ``visualize``'s matches) or is not a plain detection
    validator: call Ultralytics' then.

    Args:
        validator: Ultralytics' ``DetectionValidator``, its metrics initialised (``init_metrics``).
        preds: ``postprocess``' output, one dict per image (``bboxes`` xyxy, ``conf``, ``cls``), in NMS' order.
        batch: the validator's batch (``cls``, ``bboxes`` normalised xywh, ``batch_idx``, ``img``, ``im_file``).
    """
    serve = batched_metrics_serve(validator)
    if serve is None:
        return False
    thresholds, prepare_pred, confusion, confusion_conf, confusion_iou = serve
    n = len(preds)
    device = batch["img"].device
    h, w = batch["img"].shape[2:]
    preds = [prepare_pred(p) for p in preds]  # single_cls: the classes zeroed in place, as Ultralytics does

    # targets: each image's in the batch's order (batch_idx == si keeps it), scaled as _prepare_batch scales them
    image = batch["batch_idx"].long()
    cls = batch["cls"].squeeze(-1)
    boxes = xywh2xyxy(batch["bboxes"]) * torch.tensor((h, w), device=device)[[1, 0, 1, 0]]
    per_image = torch.bincount(image, minlength=n)
    order = torch.argsort(image, stable=True)
    start = torch.cumsum(per_image, 0) - per_image
    slot = torch.arange(len(image), device=device) - start[image[order]]
    counts = torch.stack([per_image, torch.tensor([len(p["conf"]) for p in preds], device=device)])
    t_max, p_max = (int(x) for x in counts.amax(1).tolist()) if n else (0, 0)  # the batch's one sync before the copy
    targets = boxes.new_zeros(n, t_max, 4)
    targets[image[order], slot] = boxes[order]
    target_cls = cls.new_full((n, t_max), -1)
    target_cls[image[order], slot] = cls[order]
    t_valid = torch.arange(t_max, device=device) < per_image[:, None]

    if p_max:
        pb = torch.nn.utils.rnn.pad_sequence([p["bboxes"] for p in preds], batch_first=True)
        pc = torch.nn.utils.rnn.pad_sequence([p["cls"] for p in preds], batch_first=True, padding_value=-1)
    else:
        pb, pc = boxes.new_zeros(n, 0, 4), cls.new_zeros(n, 0)
    p_valid = torch.arange(p_max, device=device) < counts[1][:, None]
    agnostic = padded_iou(targets, pb)
    iou = agnostic * (target_cls[:, :, None] == pc[:, None, :])  # NaN * 0 stays NaN, as there
    iou = torch.where(t_valid[:, :, None] & p_valid[:, None, :], iou, 0)  # padding 0: never claimed, never taken
    tp = match_batch(iou.cpu().numpy(), thresholds)
    if confusion is not None:  # plots: the confusion matrix, its detections those above its confidence
        if p_max:
            pconf = torch.nn.utils.rnn.pad_sequence([p["conf"] for p in preds], batch_first=True)
            kept = p_valid & (pconf > confusion_conf)
        else:
            pconf, kept = agnostic.new_zeros(n, 0), p_valid
        agnostic = torch.where(t_valid[:, :, None] & kept[:, None, :], agnostic, 0)
        confuse_batch(confusion.matrix, agnostic.cpu().numpy(), pconf.float().cpu().numpy(),
                      target_cls.int().cpu().numpy(), torch.where(kept, pc.int(), -1).cpu().numpy(), confusion_iou)

    # the per-image arrays Ultralytics appends: one copy each for the batch, split on the host
    n_targets, n_preds = counts.cpu().numpy()
    t_cls = np.split(cls[order].cpu().numpy(), np.cumsum(n_targets)[:-1])
    conf = torch.cat([p["conf"] for p in preds]).cpu().numpy() if p_max else None
    p_cls = torch.cat([p["cls"] for p in preds]).cpu().numpy() if p_max else None
    edges = np.cumsum(n_preds)[:-1]
    conf = np.split(conf, edges) if p_max else [None] * n
    p_cls = np.split(p_cls, edges) if p_max else [None] * n
    for si in range(n):
        m = int(n_preds[si])
        record_image_stats(validator, {
            "tp": tp[si, :m], "target_cls": t_cls[si], "target_img": np.unique(t_cls[si]),
            "conf": conf[si] if m else np.zeros(0), "pred_cls": p_cls[si] if m else np.zeros(0),
            "im_file": batch["im_file"][si]})
    return True


class BatchedDetectionValidator(DetectionValidator):
    """Ultralytics' ``DetectionValidator`` whose ``update_metrics`` is ``update_metrics`` above where that serves
    (plain statistics, a reviewed release) and Ultralytics' own elsewhere (the final validation's plots, json, txt),
    and whose NMS finds each image's candidates a group of images at a time (train/val_nms.py).
    Swapped in place (``install``); it adds a method only, and the validator's state is Ultralytics'."""

    _stock = DetectionValidator

    def update_metrics(self, preds: list[dict[str, torch.Tensor]], batch: dict[str, Any]) -> None:
        if not update_metrics(self, preds, batch):
            super().update_metrics(preds, batch)

    def postprocess(self, preds: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Ultralytics' ``postprocess`` (COPIED), its NMS each image's candidates found a group of images at a time
        (``val_nms.batched_nms``: the same detections bit for bit; Ultralytics' own where that does not serve)."""
        outputs = batched_nms(preds, self.args.conf, self.args.iou, nc=0 if self.args.task == "detect" else self.nc,
                              multi_label=True, agnostic=self.args.single_cls or self.args.agnostic_nms,
                              max_det=self.args.max_det, end2end=self.end2end, rotated=self.args.task == "obb")
        return [{"bboxes": x[:, :4], "conf": x[:, 4], "cls": x[:, 5], "extra": x[:, 6:]} for x in outputs]


def install(validator: Any) -> bool:
    """Make a plain ``DetectionValidator`` a ``BatchedDetectionValidator`` in place (pose, OBB and segment validators,
    which match otherwise, are left as they are). Returns whether it was swapped."""
    return swap_class(validator, DetectionValidator, BatchedDetectionValidator)

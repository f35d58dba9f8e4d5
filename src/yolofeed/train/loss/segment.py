"""The sync-free segment loss: ``SyncFreeDetectionLoss`` with Ultralytics' mask terms, the mask loss batched over the
images."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import Tensor

from yolofeed import ultralytics_seam as seam
from yolofeed.train.loss.detect import MAX_BOXES, SyncFreeDetectionLoss
from yolofeed.ultralytics_seam import (
    crop_mask,
    xyxy2xywh,
)

# the segment loss's padded mask elements a group of images: 256 MB of float16 masks under autocast (512 MB of
# float32 without), and as much again, briefly, for the backward pass of gathering the real rows out of them
MASK_CHUNK = 1 << 27


class SyncFreeSegmentLoss(SyncFreeDetectionLoss, seam.v8SegmentationLoss):
    """``v8SegmentationLoss`` with a few host syncs a step instead of several per image.

    Ultralytics' mask loss loops over the images, and each image's foreground is gathered by boolean indexing
    (``fg_mask_i.any()``, ``target_gt_idx_i[fg_mask_i]`` and three more, then ``masks[batch_idx == i]`` without
    overlap): about five syncs an image, 640 at batch 128, each one leaving the GPU idle while the host launches the
    next image's small kernels (139 ms of stock's phases at batch 128 on an H200, BENCHMARKS.md "Segmentation"). Here
    the foreground's (image, anchor) pairs come from one ``nonzero_static`` sized by one read of the per-image counts,
    so the loss indexes with tensors and host integers and never waits: one sync a step (the counts' read, which is
    also the foreground's guard), where Ultralytics' makes about five an image. The detection part is
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
        rows = _image_rows(fg_mask, batch["batch_idx"].view(-1), self.overlap)  # the step's one sync
        if rows.fg_edges[-1]:  # Ultralytics' ``if fg_mask.sum()``, read with the counts
            masks = batch["masks"].to(self.device).float()
            if tuple(masks.shape[-2:]) != (mask_h, mask_w):
                proto = torch.nn.functional.interpolate(proto, masks.shape[-2:], mode="bilinear", align_corners=False)
            imgsz = self._constants(preds["feats"], pred_masks.dtype).imgsz
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
    order), from one read of the per-image counts: slices by host integers after that, and each image's first row on
    the device."""

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
    """``_ImageRows`` of a batch: one sync (the per-image counts read, which sizes the ``nonzero_static``)."""
    b = len(fg_mask)
    counts = [fg_mask.sum(1)]
    order = None
    if not overlap:
        image = batch_idx.to(fg_mask.device).long()
        order = torch.argsort(image, stable=True)  # masks[batch_idx == i] keeps the batch's order within an image
        counts.append(_per_image(image, b))
    counts = torch.stack(counts)
    host = counts.tolist()
    # (N, 2) image, anchor: row-major, as boolean indexing walks each image's row; nonzero's indices, without its sync
    fg = torch.nonzero_static(fg_mask, size=sum(host[0]))
    return _ImageRows(fg, counts, host[0], order, None if overlap else host[1])

"""Validation batches from a pack, exactly as Ultralytics' validator receives them.

Ultralytics validates with ``rect=True``: images sorted by aspect ratio, each batch letterboxed
(centred, 114 fill, no scaling) to a shape rounded up to the stride. Same order, same shapes, same
pixels, same labels here, so the metrics are the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import torch

from yolofeed.augment.geometry.obb import resample_corners
from yolofeed.augment.geometry.polygons import source_polygons
from yolofeed.augment.letterbox import letterbox
from yolofeed.augment.masks import polygons_to_masks
from yolofeed.loader.dataset import PackDataset
from yolofeed.loader.labels import LabelView
from yolofeed.loader.prefetch import Prefetcher
from yolofeed.loader.train import subset
from yolofeed.pack import Pack
from yolofeed.ultralytics_seam import xyxyxyxy2xywhr

RECT_PAD = 0.5  # Ultralytics builds validation datasets with pad=0.5


def rect_batches(ori_shapes: np.ndarray, batch_size: int, imgsz: int,
                 stride: int) -> tuple[np.ndarray, list, np.ndarray]:
    """Ultralytics' ``BaseDataset.set_rectangle``: aspect-ratio order, batches, and each batch's (h, w).

    Returns:
        order (N,) sample indices sorted by h/w; batches (index arrays into ``order``'s result);
        shapes (nb, 2) int letterbox shape per batch.
    """
    n = len(ori_shapes)
    bi = np.floor(np.arange(n) / batch_size).astype(int)
    nb = bi[-1] + 1
    ar = ori_shapes[:, 0] / ori_shapes[:, 1]
    order = ar.argsort()  # the same (default) sort Ultralytics uses: ties fall the same way
    ar = ar[order]
    shapes = [[1, 1]] * nb
    for i in range(nb):  # per batch, not per sample
        ari = ar[bi == i]
        mini, maxi = ari.min(), ari.max()
        if maxi < 1:
            shapes[i] = [maxi, 1]
        elif mini > 1:
            shapes[i] = [1, 1 / mini]
    batch_shapes = np.ceil(np.array(shapes) * imgsz / stride + RECT_PAD).astype(int) * stride
    batches = [order[bi == i] for i in range(nb)]
    return order, batches, batch_shapes


class ValLoader:
    """Validation loader: rect batches, letterboxed on the device, in Ultralytics' batch format.

    Args:
        pack: the validation split's pack (stored at the training imgsz).
        batch_size: Ultralytics validates at twice the training batch.
        stride: the model's largest stride (at least 32), for the rect shapes.
        decode: how jpeg packs are decoded: "auto", "torchvision" (on ``device``) or "cv2" (see ``Prefetcher``).
        fraction: the split's share or count of its sorted files (Ultralytics' ``get_split_fraction``).
        classes, single_cls: Ultralytics' keys: keep only these class ids; make every class id 0 (``LabelView``).
        masks: for a segment pack, (``mask_ratio``, ``overlap_mask``): each batch carries ``Format``'s masks of its
            letterboxed polygons, its labels in their order; None: the polygons are not read (a detection run).
    """

    def __init__(self, pack: Pack, batch_size: int, device: torch.device | str, stride: int = 32, sync: bool = False,
                 decode: str = "auto", fraction: float | int = 1.0, classes: int | list[int] | None = None,
                 single_cls: bool = False, masks: tuple[int, bool] | None = None):
        self.pack, self.batch_size, self.device = pack, batch_size, torch.device(device)
        self.masks = masks
        used = subset(pack, fraction)  # cut before the aspect-ratio sort, as Ultralytics cuts its file list
        labels = LabelView.of(pack, classes, single_cls)
        if masks is None:  # a detection pack's polygons: validation's boxes are the letterboxed ones, as Ultralytics'
            labels = dataclasses.replace(labels, polygons=None)
        order, batches, self.shapes = rect_batches(pack.ori_shapes[used], batch_size, pack.imgsz, stride)
        self.order, self.batches = used[order], [used[b] for b in batches]
        self.dataset = PackDataset(pack, self.order, labels)  # the validator reads im_files in batch order
        self.num_workers, self.drop_last = 0, False
        self.sampler = range(len(self.dataset))  # the validator lists it under save_json: the images' ids, in order
        self.prefetcher = Prefetcher(pack, device, batch_size, slots=2, sync=sync, decode=decode, labels=labels)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[dict]:
        shapes = iter(self.shapes.tolist())
        for b in self.prefetcher.iterate(self.batches):
            yield self._format(b, next(shapes))

    def _format(self, b, shape: list[int]) -> dict:
        src = b.source
        img, off = letterbox(src.images, src.hw, shape)
        hw = src.hw.to(torch.float32)
        H, W = float(shape[0]), float(shape[1])
        # LetterBox._update_labels then Format: xywh -> xyxy, x resized w/h, + pad, -> xywh, / letterbox w/h
        xy, half = src.boxes[..., :2], src.boxes[..., 2:] / 2
        wh = torch.stack([hw[:, 1], hw[:, 0]], -1)[:, None, :]
        pad = torch.stack([off[:, 1], off[:, 0]], -1)[:, None, :].to(torch.float32)
        x1y1, x2y2 = (xy - half) * wh + pad, (xy + half) * wh + pad
        xywh = torch.cat([(x1y1 + x2y2) / 2, x2y2 - x1y1], -1) / torch.tensor([W, H, W, H], device=img.device)
        v = src.valid
        bidx = torch.arange(len(v), device=img.device, dtype=torch.float32)[:, None].expand_as(v)
        extra = {}
        if src.keypoints is not None:  # pose: the points move as the boxes do (Instances: denormalize, + pad)
            xy = (src.keypoints[..., :2] * wh[:, :, None] + pad[:, :, None]) / torch.tensor([W, H], device=img.device)
            extra["keypoints"] = torch.cat([xy, src.keypoints[..., 2:]], -1)[v]
        if src.corners is not None:  # OBB: Format(return_obb) takes the minimum-area rectangle of the moved segments
            # Ultralytics' own (cv2.minAreaRect on the host, a sync: validation only), of its 100 points: where two
            # rectangles tie (a rhombus) the one it picks is stock's, which the batched one on the GPU may not be
            segments = (resample_corners(src.corners) * wh[:, :, None] + pad[:, :, None])[v]  # (N, 100, 2) pixels
            rboxes = xyxyxyxy2xywhr(segments)
            extra["bboxes"] = torch.cat([rboxes[:, :4] / torch.tensor([W, H, W, H], device=img.device),
                                         rboxes[:, 4:]], -1)
        cls, v = src.cls, src.valid
        if src.polygons is not None and self.masks is not None:  # segment: Format's masks at the batch's shape
            # the polygons as the dataset resamples them, moved as LetterBox moves the boxes (Instances: denormalize,
            # + pad, in float32), then rasterised as polygons2masks(_overlap) does; with overlap the labels follow
            # the masks' area order (Format reorders them)
            polygons, _ = source_polygons(src.polygons, src.polygon_lengths, src.valid)
            pixels = polygons * wh[:, :, None] + pad[:, :, None]
            m = polygons_to_masks(pixels, v, int(H), int(W), *self.masks)
            cls, xywh, v = m.reorder(cls), m.reorder(xywh), m.valid
            bidx = m.reorder(bidx)
            extra = {**extra, **m.collated(cls)}
        ori = self.pack.ori_shapes[b.indices]
        res = self.pack.shapes[b.indices]
        offs = off.tolist()  # validation only, once per batch: the validator needs these on the host anyway
        return {"img": img, "cls": cls[v][:, None], "bboxes": xywh[v], "batch_idx": bidx[v],  # OBB: in extra
                "im_file": b.im_file,
                "ori_shape": [tuple(int(x) for x in s) for s in ori],
                "resized_shape": [tuple(shape) for _ in range(len(ori))],
                "ratio_pad": [((r[0] / o[0], r[1] / o[1]), (p[1], p[0])) for r, o, p in zip(res, ori, offs)], **extra}

    def reset(self) -> None:
        self.prefetcher.close()

    def stop_soon(self) -> None:
        self.prefetcher.stop_soon()

    def close(self) -> None:
        self.prefetcher.close()

    def release(self) -> None:
        """``close``, and let go of the pack and the buffers for good (``Prefetcher.release``)."""
        self.prefetcher.release()
        self.dataset.release()
        self.pack = None

"""The batches the stages hand on: the loader's ``SourceBatch`` to augment, augment's ``AugmentedBatch`` to train.

Labels are padded to a fixed number of slots per image, with a validity mask, so that shapes stay static
(CUDA graphs, no host syncs). Detection fills images, classes and boxes; ``keypoints``, ``corners`` and
``polygons`` are the room for pose, oriented boxes and segmentation, None in a detection batch; the augmentation
hands the oriented boxes on as ``rboxes`` and the polygons as ``masks`` (``AUGMENTED_KINDS``), as Ultralytics'
``Format`` makes them; until the masks are made, the polygons as ``segments`` (pixels). Every per-slot field shares
the one ``valid`` mask. Below the loader and augment, so both import it and neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from yolofeed.errors import ConfigError

LABEL_KINDS = ("keypoints", "corners", "polygons")  # beyond detection's classes and boxes; None where not carried
# what each kind is in the augmented batch: OBB's corners leave the augmentation as oriented boxes (Format's xywhr),
# segmentation's polygons as masks (Format's polygons2masks)
AUGMENTED_KINDS = {"keypoints": "keypoints", "corners": "rboxes", "polygons": "masks"}


class LabelKinds:
    """Which optional label kinds a batch carries, and the refusal of an op that would drop them.

    Attributes:
        KINDS: the batch's fields of the optional kinds.
    """

    KINDS: tuple[str, ...] = LABEL_KINDS

    def kinds(self) -> tuple[str, ...]:
        """The optional label kinds this batch carries: () for detection."""
        return tuple(k for k in self.KINDS if getattr(self, k) is not None)

    def require_detection(self, op: str) -> None:
        """Raise where this batch carries labels ``op`` would drop (it reads classes and boxes only)."""
        self.require_only(op, ())

    def require_only(self, op: str, carried: tuple[str, ...]) -> None:
        """Raise where this batch carries labels ``op`` would drop: it reads classes, boxes and ``carried``."""
        if kinds := tuple(k for k in self.kinds() if k not in carried):
            takes, tasks = "detection labels (classes and boxes)", "a detection model (task=detect)"
            if carried:
                takes, tasks = ", ".join(("classes", "boxes", *carried)), "a task whose labels it takes"
            raise ConfigError(f"{op} takes {takes}; this batch also carries {', '.join(kinds)}, which it would drop: "
                              f"train {tasks}")


@dataclass
class SourceBatch(LabelKinds):
    """What the loader hands over: stored images and their labels, on the target device.

    Shape:
        images: (N, Hmax, Wmax, 3) uint8 RGB, image i in its top-left ``hw[i]`` corner.
        hw: (N, 2) int64. cls: (N, L) float32. boxes: (N, L, 4) float32 normalised xywh. valid: (N, L) bool.
        keypoints: (N, L, P, 3) float32 normalised x, y and visibility (0: the point is absent).
        corners: (N, L, 4, 2) float32 normalised x, y of the oriented boxes' corners (Ultralytics moves them as
            segments; their xywhr is made at the end, as ``Format`` makes it).
        polygons: (N, L, P, 2) float32 normalised x, y of each slot's polygon as its label file lists it, zero past
            its ``polygon_lengths`` (N, L) int64 points (0 in a slot without a label); P the most any row has.
            Ultralytics resamples them (``geometry.polygons``) before the ops move them and makes masks at the end.
        resampled_polygons: (N, L, W, 2) float32 the polygons resampled so (``geometry.polygons.source_polygons``),
            made once as a batch enters a partner pool's ring, which the ops then read instead of resampling every
            row of it each batch; None: the augmentation resamples ``polygons``. resampled_points: (N,) int64 every
            image's n where the polygons are padded to more than 1,000 points (P > 1,000), else None.
    """

    images: Tensor
    hw: Tensor
    cls: Tensor
    boxes: Tensor
    valid: Tensor
    keypoints: Tensor | None = None
    corners: Tensor | None = None
    polygons: Tensor | None = None
    polygon_lengths: Tensor | None = None  # with polygons: how many of each slot's P points are its own
    resampled_polygons: Tensor | None = None
    resampled_points: Tensor | None = None


@dataclass
class AugmentedBatch(LabelKinds):
    """The augmented batch, boxes still padded.

    Shape: img (B, 3, S, S) uint8 RGB; cls (B, K) float32; boxes (B, K, 4) float32 xyxy pixels; valid (B, K) bool;
    keypoints (B, K, P, 3) float32 pixels and visibility; rboxes (B, K, 5) float32 oriented boxes cx, cy, w, h in
    pixels and theta in radians, canonical as Ultralytics' ``xyxyxyxy2xywhr`` (w the longer side, theta in
    [-pi/4, 3pi/4)), beside ``boxes`` their axis-aligned bounds; masks: the segment task's masks as ``Format`` makes
    them (``augment.masks.SegmentMasks``: index masks (B, S / r, S / r), or one (B, K, S / r, S / r) per slot), the
    per-slot labels then in its order (``SegmentMasks.reorder``: Ultralytics' area sort); segments (B, K, W, 2)
    float32 pixel x, y of the segmentation polygons, as Ultralytics' ``Instances.segments`` holds them before
    ``Format`` makes masks of them: W 1,000 (more where a stored polygon is longer; a row of fewer points repeats its
    last one, the same polygon).
    """

    KINDS = (*AUGMENTED_KINDS.values(), "segments")  # segments: the polygons before masks are made of them

    img: Tensor
    cls: Tensor
    boxes: Tensor
    valid: Tensor
    keypoints: Tensor | None = None
    rboxes: Tensor | None = None
    masks: Any = None  # augment.masks.SegmentMasks (a stage above this one: not imported here)
    segments: Tensor | None = None
    paste_lost: Tensor | None = None  # () int64: copies copy-paste left out, and its fill's dropped events
    polygons_past: Tensor | None = None  # () int64: valid slots past the perspective's bound, not moved: left out

    def to_ultralytics(self, total: int | None = None) -> dict[str, Tensor]:
        """Ultralytics' collated batch: ``img``, ``cls`` (N, 1), ``bboxes`` (N, 4) normalised xywh, ``batch_idx`` (N,);
        with keypoints also ``keypoints`` (N, P, 3) float32: x / S, y / S and visibility (``Format``'s
        normalisation, concatenated as ``YOLODataset.collate_fn`` does), row j the keypoints of box j; with
        oriented boxes ``bboxes`` is (N, 5) float32 cx / S, cy / S, w / S, h / S, theta (``Format(return_obb=True)``);
        with masks also ``masks`` and ``sem_masks`` in ``collate_fn``'s layout (``SegmentMasks.collated``).

        Rows are in row-major (B, K) order either way. Without ``total`` boolean indexing must learn
        N: the host waits for every kernel that made ``valid``. With ``total`` (N, known on the host,
        e.g. read a step early from pinned memory) nothing waits: row j is the valid entry whose
        running count is j + 1, found by ``searchsorted`` (no scatter: no duplicate writes, so it
        stays deterministic under ``torch.use_deterministic_algorithms``).

        Args:
            total: the exact number of valid boxes, ``int(valid.sum())``; a wrong count gives wrong
                rows or an index error.
        """
        if self.segments is not None and self.masks is None:
            raise ConfigError("AugmentedBatch.to_ultralytics: this batch carries segmentation polygons and no masks; "
                              "a segment model's loss reads masks: make them of the polygons first (Format's "
                              "polygons2masks), or train a detection model on boxes")
        self.require_only("AugmentedBatch.to_ultralytics", ("keypoints", "rboxes", "masks", "segments"))
        size = self.img.shape[-1]
        kp, rb = self.keypoints, self.rboxes
        if total is None:
            v = self.valid
            idx = torch.arange(len(v), device=v.device, dtype=torch.float32)[:, None].expand_as(v)
            cls, b, batch_idx = self.cls[v], self.boxes[v], idx[v]
            kp, rb = (None if t is None else t[v] for t in (kp, rb))
        else:
            flat = self.valid.flatten()
            want = torch.arange(1, total + 1, device=flat.device)
            src = torch.searchsorted(flat.cumsum(0), want)  # (N,) flat (B*K) position of each valid box
            cls = self.cls.flatten().index_select(0, src)
            b = self.boxes.flatten(0, 1).index_select(0, src)
            batch_idx = src.div(max(self.valid.shape[1], 1), rounding_mode="floor").to(torch.float32)
            kp, rb = (None if t is None else t.flatten(0, 1).index_select(0, src) for t in (kp, rb))
        boxes = normalised_xywh(b, size) if rb is None else torch.cat([rb[..., :4] / size, rb[..., 4:]], -1)
        out = {"img": self.img, "cls": cls[:, None], "bboxes": boxes, "batch_idx": batch_idx}
        if kp is not None:
            out["keypoints"] = torch.cat([kp[..., :2] / size, kp[..., 2:]], -1)
        if self.masks is not None:
            out.update(self.masks.collated(self.cls, total))
        return out


def normalised_xywh(b: Tensor, size: int) -> Tensor:
    """Pixel xyxy boxes (..., 4) to Ultralytics' normalised xywh, elementwise (the same values in any layout)."""
    return torch.stack([(b[..., 0] + b[..., 2]) / 2, (b[..., 1] + b[..., 3]) / 2, b[..., 2] - b[..., 0],
                        b[..., 3] - b[..., 1]], -1) / size


__all__ = ["AUGMENTED_KINDS", "LABEL_KINDS", "AugmentedBatch", "SourceBatch", "normalised_xywh"]

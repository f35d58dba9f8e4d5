"""What Ultralytics' trainer and validator read from ``loader.dataset``, answered from a pack."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np

from yolofeed.loader.labels import LabelView
from yolofeed.pack import Pack


class PackDataset:
    """The dataset facade: ``labels`` (class counts, label plots, ``max_det`` checks), ``im_files``, ``len``.

    Args:
        pack: the split's pack.
        indices: the pack samples in use (a ``fraction`` subset, or all).
        labels: the labels in use (``classes``/``single_cls`` applied); None: the pack's own.
    """

    def __init__(self, pack: Pack, indices: np.ndarray | None = None, labels: LabelView | None = None):
        self.pack = pack
        self.indices = np.arange(len(pack)) if indices is None else np.asarray(indices, dtype=np.int64)
        self.label_view = LabelView.of(pack) if labels is None else labels

    def __len__(self) -> int:
        return len(self.indices)

    @cached_property
    def im_files(self) -> list[str]:
        files = self.pack.im_files
        return [files[i] for i in self.indices]

    @cached_property
    def labels(self) -> list[dict]:
        """Ultralytics' label dicts (views into the pack): im_file, shape (original hw), cls (n, 1), bboxes (n, 4),
        and for a pose pack keypoints (n, K, 3); an OBB pack's segments are its corners (n, 4, 2), as Ultralytics'
        OBB labels carry them, a segment pack's its polygons (a list of (P, 2)), as its segment labels do.

        Ultralytics' trainer reads them all before the first step (its ``max_det`` check): one dict and two row
        slices an image, the bounds and shapes turned into Python lists first (~5 us an image, 0.6 s for COCO).
        """
        if self.pack is None:
            from yolofeed.loader.prefetch import LoaderError

            raise LoaderError(f"{self!r}: its labels were let go of with its pack when its run ended (release)")
        lv, idx = self.label_view, self.indices
        starts, ends = lv.start[idx].tolist(), (lv.start[idx] + lv.count[idx]).tolist()
        cls, boxes = lv.table[:, :1], lv.table[:, 1:]
        shapes = map(tuple, self.pack.ori_shapes[idx].tolist())
        out = [{"im_file": f, "shape": hw, "cls": cls[a:b], "bboxes": boxes[a:b], "segments": [], "normalized": True,
                "bbox_format": "xywh"} for f, a, b, hw in zip(self.im_files, starts, ends, shapes)]
        if lv.keypoints is not None:  # pose: a third row slice an image
            for d, a, b in zip(out, starts, ends):
                d["keypoints"] = lv.keypoints[a:b]
        if lv.corners is not None:  # OBB
            for d, a, b in zip(out, starts, ends):
                d["segments"] = lv.corners[a:b]
        if lv.polygons is not None:  # segment: a slice of the points a polygon
            points, first, length = lv.polygons
            for d, a, b in zip(out, starts, ends):
                d["segments"] = [points[s:s + n] for s, n in zip(first[a:b].tolist(), length[a:b].tolist())]
        return out

    def release(self) -> None:
        """Let go of the pack: its labels (views of its memory map) and the map go with it; ``im_files`` and
        ``len`` stay. The pack's file is closed, and a deleted or replaced one's disk space freed, once nothing else
        holds the pack."""
        if self.pack is None:
            return
        self.im_files  # noqa: B018  (made from the pack, kept)
        self.name = Path(self.pack.path).name
        self.__dict__.pop("labels", None)
        self.pack = self.label_view = None

    def close_mosaic(self, hyp=None) -> None:
        """Ultralytics calls this to end mosaic; augmentation lives on the GPU (FastDetectionTrainer) instead."""

    def __repr__(self) -> str:
        name = Path(self.pack.path).name if self.pack is not None else f"{self.name}, released"
        return f"PackDataset({name}, {len(self)} images)"


def source_positions(pack: Pack) -> np.ndarray:
    """Each pack sample's position in the sorted list of source files the pack was built from.

    Skipped files leave gaps; Ultralytics' ``fraction`` counts them (it cuts the file list before checking it).
    """
    skipped = [f for f, _ in pack.header.get("skipped", [])]
    if not skipped:
        return np.arange(len(pack))
    everything = sorted(pack.im_files + skipped)
    where = {f: k for k, f in enumerate(everything)}
    return np.array([where[f] for f in pack.im_files], dtype=np.int64)

"""The labels a run trains and validates on: the pack's, filtered by ``classes`` and merged by ``single_cls``.

Ultralytics applies both keys in ``BaseDataset.update_labels`` when it builds a dataset, for training and
validation alike: boxes of other classes are dropped (the image stays, as a background image when none is
left; class ids are not renumbered), then every class id becomes 0 under ``single_cls``. The same here,
once per loader, on a copy of the label table (20 bytes a box): the pack on disk never changes, so one
pack serves every choice of ``classes`` and ``single_cls``. A pose pack's keypoints, an OBB pack's corners and a
segment pack's polygons follow their rows (Ultralytics filters them with the same mask).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from yolofeed.errors import ConfigError
from yolofeed.pack import Pack


def class_ids(classes: Any) -> np.ndarray | None:
    """Ultralytics' ``classes`` (an int or a list of ints, or None for all) as an int64 array.

    Raises:
        ConfigError: a value that is not a class id (a string, a fraction, a negative number).
    """
    if classes is None:
        return None
    values = list(classes) if isinstance(classes, (list, tuple)) else [classes]
    if not values or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in values):
        raise ConfigError(f"classes={classes!r}: expected a class id or a list of them, e.g. classes=0 or "
                          "classes=[0,2,3]")
    return np.asarray(values, dtype=np.int64)


@dataclass(frozen=True)
class LabelView:
    """Per-image label rows: image ``i`` owns ``table[start[i] : start[i] + count[i]]``.

    Shape:
        start, count: (N,) int64, one per pack image. table: (M, 5) float32 [class, x, y, w, h] normalised.
        keypoints: (M, K, 3) float32 [x, y, visibility], row j those of table row j; None but for a pose pack.
        corners: (M, 4, 2) float32 normalised x, y, row j the oriented box of table row j; None but for an OBB pack.
        polygons: (points, starts, lengths), row j's polygon ``points[starts[j]:starts[j] + lengths[j]]``: (P, 2)
            float32 normalised x, y (the pack's, never copied), (M,) int64 and (M,) int64; None but for a segment pack.
    """

    start: np.ndarray
    count: np.ndarray
    table: np.ndarray
    keypoints: np.ndarray | None = None
    corners: np.ndarray | None = None
    polygons: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @classmethod
    def of(cls, pack: Pack, classes: Any = None, single_cls: bool = False) -> LabelView:
        """The pack's labels as Ultralytics' ``update_labels(include_class=classes)`` leaves them.

        Without ``classes`` and ``single_cls`` the table is the pack's own (a view of the memory map, no copy).

        Raises:
            ConfigError: ``classes`` is not a class id or a list of them.
        """
        include = class_ids(classes)
        start = pack.index["label_start"].astype(np.int64)
        count = pack.index["label_count"].astype(np.int64)
        table, keypoints, corners = pack.label_table, pack.keypoint_table, pack.corner_table
        polygons = None
        if pack.polygon_lengths is not None:
            polygons = (pack.polygon_points, pack.polygon_starts[:-1], pack.polygon_lengths.astype(np.int64))
        if include is None and not single_cls:
            return cls(start, count, table, keypoints, corners, polygons)
        owner = np.repeat(np.arange(len(count)), count)  # every image's rows, in image order
        rows = np.repeat(start - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))
        if include is not None:
            keep = np.isin(table[rows, 0], include)
            rows, owner = rows[keep], owner[keep]
        kept = np.array(table[rows], dtype=np.float32)
        if single_cls:
            kept[:, 0] = 0.0
        count = np.bincount(owner, minlength=len(count)).astype(np.int64)
        def kept_rows(per_row):  # the same rows of a per-row section
            return None if per_row is None else np.array(per_row[rows], dtype=np.float32)
        if polygons is not None:  # the kept rows' starts and lengths; the points stay the pack's
            polygons = (polygons[0], polygons[1][rows], polygons[2][rows])
        return cls(np.cumsum(count) - count, count, kept.reshape(-1, 5), kept_rows(keypoints), kept_rows(corners),
                   polygons)

    def __call__(self, i: int) -> np.ndarray:
        """(n, 5) labels of image ``i``."""
        s = int(self.start[i])
        return self.table[s:s + int(self.count[i])]

    @property
    def width(self) -> int:
        """The most labels one image has (the loader pads to it)."""
        return int(self.count.max()) if len(self.count) else 0

    @property
    def polygon_width(self) -> int:
        """The most points one polygon has (the loader pads polygons to it); 0 without polygons."""
        return int(self.polygons[2].max()) if self.polygons is not None and len(self.polygons[2]) else 0


__all__ = ["LabelView", "class_ids"]

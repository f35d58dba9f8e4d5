"""The augmentation hyperparameters: Ultralytics' names, defaults and meaning.

A user's ``mosaic=0.5 degrees=10`` means here what it means to ``yolo train``. Defaults are read from
Ultralytics' ``default.yaml`` (through ``DEFAULT_CFG``), so they cannot drift from the installed version.
"""

from __future__ import annotations

import dataclasses
import numbers
import warnings
from dataclasses import dataclass
from typing import Any

from yolofeed.config import MIN_IMGSZ
from yolofeed.errors import ConfigError

KEYS = ("mosaic", "mixup", "cutmix", "degrees", "translate", "scale", "shear", "perspective", "hsv_h", "hsv_s",
        "hsv_v", "flipud", "fliplr", "bgr", "close_mosaic", "copy_paste")
PROBABILITIES = ("mosaic", "mixup", "cutmix", "flipud", "fliplr", "bgr", "copy_paste")


def _whole_numbers(values: Any) -> tuple[int, ...] | None:
    """``values`` as a tuple of ints where it is a list or tuple of whole numbers (not bools, floats or strings)."""
    if not isinstance(values, (list, tuple)):
        return None
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values):
        return None
    return tuple(int(v) for v in values)


@dataclass(frozen=True)
class AugmentHyp:
    """Training augmentation settings, as Ultralytics' ``v8_transforms`` reads them.

    Attributes:
        imgsz: output side; mosaic canvases are 2 * imgsz.
        mosaic_grid: 4 (Ultralytics' default 2x2) or 9 (its 3x3 ``Mosaic(n=9)`` variant). yolofeed-only:
            ``v8_transforms`` always uses 4.
        kpt_shape: the pose task's (keypoints per instance, 2 or 3 values each), the data yaml's ``kpt_shape``;
            None for a task without keypoints. Batches carry (x, y, visibility) either way: with 2 values the
            visibility is derived when labels are read, as Ultralytics' ``verify_image_label`` does.
        flip_idx: the data yaml's ``flip_idx``, the keypoint order after a flip (left and right swapped). Without
            it a pose task does not flip: both flips are switched off with a warning, as ``v8_transforms`` does.
    """

    imgsz: int = 640
    mosaic: float = 1.0
    mixup: float = 0.0
    cutmix: float = 0.0
    degrees: float = 0.0
    translate: float = 0.1
    scale: float = 0.5
    shear: float = 0.0
    perspective: float = 0.0
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    flipud: float = 0.0
    fliplr: float = 0.5
    bgr: float = 0.0
    close_mosaic: int = 10
    copy_paste: float = 0.0
    mosaic_grid: int = 4
    kpt_shape: tuple[int, int] | None = None
    flip_idx: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for k in PROBABILITIES:
            v = getattr(self, k)
            if not 0.0 <= float(v) <= 1.0:
                raise ConfigError(f"{k}={v}: a probability, expected a value in [0, 1]")
        if self.mosaic_grid not in (4, 9):
            raise ConfigError(f"mosaic_grid={self.mosaic_grid}: expected 4 or 9")
        if self.imgsz < MIN_IMGSZ:
            raise ConfigError(f"imgsz={self.imgsz}: expected at least {MIN_IMGSZ}")
        self._check_keypoints()

    def _check_keypoints(self) -> None:
        """``kpt_shape`` and ``flip_idx`` as tuples, checked as ``v8_transforms`` checks them (frozen: set in place)."""
        if self.kpt_shape is not None:
            shape = _whole_numbers(self.kpt_shape)
            if shape is None or len(shape) != 2 or shape[0] < 1 or shape[1] not in (2, 3):
                raise ConfigError(f"kpt_shape={self.kpt_shape!r}: expected [keypoints per instance, 2 or 3] "
                                  "(the data yaml's kpt_shape, e.g. [17, 3])")
            object.__setattr__(self, "kpt_shape", shape)
        if self.flip_idx is not None:
            idx = _whole_numbers(self.flip_idx)
            if idx is None:
                raise ConfigError(f"flip_idx={self.flip_idx!r}: expected a list of keypoint indices (whole numbers, "
                                  "e.g. [0, 2, 1, 4, 3]), as in the data yaml")
            object.__setattr__(self, "flip_idx", idx)
        if self.kpt_shape is None:
            if self.flip_idx:
                raise ConfigError(f"flip_idx={list(self.flip_idx)} without kpt_shape: flip_idx orders keypoints, "
                                  "give the data yaml's kpt_shape with it")
            return
        k = self.kpt_shape[0]
        if self.flip_idx and (len(self.flip_idx) != k or not all(0 <= i < k for i in self.flip_idx)):
            raise ConfigError(f"flip_idx={list(self.flip_idx)}: expected kpt_shape[0]={k} indices, each in 0..{k - 1} "
                              "(the keypoint each one becomes after a flip), as in the data yaml; or kpt_shape="
                              f"{list(self.kpt_shape)} is the one to mend: the label rows hold 5 + keypoints x "
                              f"{self.kpt_shape[1]} columns")
        if not self.flip_idx and (self.fliplr > 0 or self.flipud > 0):
            warnings.warn("no flip_idx for the keypoints (data yaml): fliplr and flipud switched off, as Ultralytics' "
                          f"v8_transforms does (fliplr={self.fliplr}, flipud={self.flipud})", stacklevel=4)
            object.__setattr__(self, "fliplr", 0.0)
            object.__setattr__(self, "flipud", 0.0)

    @classmethod
    def from_args(cls, args: Any = None, data: dict | None = None, **overrides: Any) -> AugmentHyp:
        """Read the keys from Ultralytics training args (a namespace or dict); missing keys take the defaults.

        Args:
            args: e.g. ``trainer.args``; None uses Ultralytics' ``DEFAULT_CFG``.
            data: the dataset's yaml, e.g. ``trainer.data``: where ``args.task`` is ``pose`` its ``kpt_shape`` and
                ``flip_idx`` are read (Ultralytics' ``use_keypoints``); other tasks carry no keypoints.
        """
        from yolofeed.ultralytics_seam import get_cfg

        src = vars(get_cfg()) | (dict(args) if isinstance(args, dict) else vars(args) if args is not None else {})
        values = {k: src[k] for k in KEYS if k in src and src[k] is not None}
        if "imgsz" in src and src["imgsz"] is not None:
            imgsz = src["imgsz"]
            values["imgsz"] = int(max(imgsz) if isinstance(imgsz, (list, tuple)) else imgsz)
        if data is not None and src.get("task") == "pose":
            values["kpt_shape"] = data.get("kpt_shape")
            values["flip_idx"] = data.get("flip_idx") or None
        return cls(**(values | overrides))

    def closed(self) -> AugmentHyp:
        """Ultralytics' ``close_mosaic``: mosaic, mixup, cutmix and copy_paste off; everything else kept."""
        return dataclasses.replace(self, mosaic=0.0, mixup=0.0, cutmix=0.0, copy_paste=0.0)

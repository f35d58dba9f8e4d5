"""The augmentation hyperparameters: Ultralytics' names, defaults and meaning.

A user's ``mosaic=0.5 degrees=10`` means here what it means to ``yolo train``. Defaults are read from
Ultralytics' ``default.yaml`` (through ``DEFAULT_CFG``), so they cannot drift from the installed version.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

from yolofeed.errors import ConfigError

KEYS = ("mosaic", "mixup", "cutmix", "degrees", "translate", "scale", "shear", "perspective", "hsv_h", "hsv_s",
        "hsv_v", "flipud", "fliplr", "bgr", "close_mosaic", "copy_paste")
PROBABILITIES = ("mosaic", "mixup", "cutmix", "flipud", "fliplr", "bgr", "copy_paste")


@dataclass(frozen=True)
class AugmentHyp:
    """Training augmentation settings, as Ultralytics' ``v8_transforms`` reads them.

    Attributes:
        imgsz: output side; mosaic canvases are 2 * imgsz.
        mosaic_grid: 4 (Ultralytics' default 2x2) or 9 (its 3x3 ``Mosaic(n=9)`` variant). yolofeed-only:
            ``v8_transforms`` always uses 4.
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

    def __post_init__(self) -> None:
        for k in PROBABILITIES:
            v = getattr(self, k)
            if not 0.0 <= float(v) <= 1.0:
                raise ConfigError(f"{k}={v}: a probability, expected a value in [0, 1]")
        if self.mosaic_grid not in (4, 9):
            raise ConfigError(f"mosaic_grid={self.mosaic_grid}: expected 4 or 9")
        if self.imgsz < 32:
            raise ConfigError(f"imgsz={self.imgsz}: expected at least 32")
        if self.copy_paste:
            warnings.warn("copy_paste needs segment labels; yolofeed trains detection boxes and ignores it "
                          f"(copy_paste={self.copy_paste})", stacklevel=2)

    @classmethod
    def from_args(cls, args: Any = None, **overrides: Any) -> AugmentHyp:
        """Read the keys from Ultralytics training args (a namespace or dict); missing keys take the defaults.

        Args:
            args: e.g. ``trainer.args``; None uses Ultralytics' ``DEFAULT_CFG``.
        """
        from yolofeed.ultralytics_seam import get_cfg

        src = vars(get_cfg()) | (dict(args) if isinstance(args, dict) else vars(args) if args is not None else {})
        values = {k: src[k] for k in KEYS if k in src and src[k] is not None}
        if "imgsz" in src and src["imgsz"] is not None:
            imgsz = src["imgsz"]
            values["imgsz"] = int(max(imgsz) if isinstance(imgsz, (list, tuple)) else imgsz)
        return cls(**(values | overrides))

    def closed(self) -> AugmentHyp:
        """Ultralytics' ``close_mosaic``: mosaic, mixup, cutmix and copy_paste off; everything else kept."""
        return dataclasses.replace(self, mosaic=0.0, mixup=0.0, cutmix=0.0, copy_paste=0.0)

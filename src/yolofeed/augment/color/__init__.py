"""The colour ops, one per file: each changes pixel values where they are, a term of the compose pass.

``hsv`` is Ultralytics' ``RandomHSV``, bit for bit; ``bgr`` the channel swap of its ``Format``.
"""

from yolofeed.augment.color.bgr import ToBGR
from yolofeed.augment.color.hsv import HSVParams, RandomHSV, hsv_luts, sample_hsv

__all__ = ["HSVParams", "RandomHSV", "ToBGR", "hsv_luts", "sample_hsv"]

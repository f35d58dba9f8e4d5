"""Ultralytics' ``RandomHSV`` (LUTs in OpenCV's 8-bit HSV space), bit for bit.

Ultralytics converts BGR -> HSV with ``cv2.cvtColor`` (hue 0-179), maps each channel through a per-image LUT,
and converts back. Here: the per-image gains and their LUTs; the conversions and the lookup are pixel work, a
term of the compose pass (``kernels/hsv.py`` is their torch reference, exact to ``cv2``;
``kernels/compose_triton.py`` runs them in one pass with MixUp, CutMix and the BGR swap).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from yolofeed.augment.hyp import AugmentHyp
from yolofeed.augment.op import Draw, Labels, PixelOp
from yolofeed.kernels.hsv import HUE_RANGE


@dataclass
class HSVParams:
    """Shape: gains (B, 3) float64, Ultralytics' ``r = uniform(-1, 1, 3) * [hsv_h, hsv_s, hsv_v]``."""

    gains: Tensor
    enabled: bool  # False when all three hyperparameters are 0: the image is left untouched


def sample_hsv(batch_size: int, hyp: AugmentHyp, generator: torch.Generator | None, device: torch.device) -> HSVParams:
    u = torch.rand((batch_size, 3), generator=generator, device=device, dtype=torch.float64)
    gains = u * 2 - 1
    for c, g in enumerate((hyp.hsv_h, hyp.hsv_s, hyp.hsv_v)):  # Python scalars: no host-to-device copy
        gains[:, c] *= g
    return HSVParams(gains, bool(hyp.hsv_h or hyp.hsv_s or hyp.hsv_v))


def hsv_luts(p: HSVParams) -> Tensor:
    """Ultralytics' three LUTs per image, float64 arithmetic then truncation to uint8.

    Returns: (B, 3, 256) uint8: hue shift modulo 180, saturation and value gains clipped to 255.
    """
    x = torch.arange(256, dtype=torch.float64, device=p.gains.device)
    r = p.gains[:, :, None]
    hue = torch.remainder(x + r[:, 0] * HUE_RANGE, HUE_RANGE)  # Python/numpy % is never negative
    sat = (x * (r[:, 1] + 1)).clamp(0, 255)
    val = (x * (r[:, 2] + 1)).clamp(0, 255)
    sat[:, 0] = 0  # Ultralytics 8.3.79: keeps pure white white
    return torch.stack([hue, sat, val], 1).to(torch.uint8)


class RandomHSV(PixelOp):
    """Ultralytics' ``RandomHSV`` (``hsv_h``, ``hsv_s``, ``hsv_v``); boxes stay where they are."""

    name, Params, term = "hsv", HSVParams, "luts"

    def on(self, hyp: AugmentHyp) -> bool:
        return bool(hyp.hsv_h or hyp.hsv_s or hyp.hsv_v)

    def sample(self, draw: Draw, hyp: AugmentHyp, generator: torch.Generator | None) -> HSVParams:
        return sample_hsv(draw.rows, hyp, generator, draw.device)

    def compose_term(self, p: HSVParams, labels: Labels, rows: Labels, hyp: AugmentHyp) -> Tensor | None:
        return hsv_luts(p) if p.enabled else None

"""OpenCV's uint8 RGB <-> HSV (hue 0-179), bit for bit: the torch reference of the compose kernel's HSV step.

* RGB -> HSV is OpenCV's integer algorithm with its division tables (``hsv_shift = 12``).
* HSV -> RGB is OpenCV's float path: sector, ``v * (1 - s * h)`` with a fused multiply-add, x255,
  truncation. The fused steps are emulated in float64 here and are native ``fma`` in the kernel.

Checked against ``cv2`` on 1.2 M colours and 0.8 M HSV triples, every value of two channels
(``tests/test_augment_ops.py``). ``compose_triton.py`` runs the same per-pixel steps in one kernel on CUDA
and takes its division tables from here.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

HSV_SHIFT = 12
HUE_RANGE = 180  # OpenCV's 8-bit hue: degrees / 2
# OpenCV's HSV2RGB sector table: which of (v, v(1-s), v(1-s h), v(1-s(1-h))) is b, g, r in each sector
SECTOR_BGR = ((1, 3, 0), (1, 0, 2), (3, 0, 1), (0, 2, 1), (0, 1, 3), (2, 1, 0))


def division_tables(device: torch.device | None = None) -> tuple[Tensor, Tensor]:
    """OpenCV's ``sdiv_table`` and ``hdiv_table180`` (int64, 256 entries): rounded (255<<12)/i and (180<<12)/(6i)."""
    i = torch.arange(256, dtype=torch.float64, device=device)
    sdiv = torch.where(i > 0, torch.round((255 << HSV_SHIFT) / i.clamp(min=1)), torch.zeros_like(i)).long()
    hdiv = torch.where(i > 0, torch.round((HUE_RANGE << HSV_SHIFT) / (6 * i.clamp(min=1))), torch.zeros_like(i)).long()
    return sdiv, hdiv


def rgb_to_hsv(rgb: Tensor) -> Tensor:
    """``cv2.cvtColor(..., COLOR_RGB2HSV)`` for uint8: exact.

    Shape: rgb (..., 3) uint8 -> (..., 3) int64 H in [0, 180), S, V in [0, 255].
    """
    sdiv, hdiv = division_tables(rgb.device)
    r, g, b = rgb.long().unbind(-1)
    v = torch.maximum(torch.maximum(r, g), b)
    diff = v - torch.minimum(torch.minimum(r, g), b)
    half = 1 << (HSV_SHIFT - 1)
    s = (diff * sdiv[v] + half) >> HSV_SHIFT
    h = torch.where(v == r, g - b, torch.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
    h = (h * hdiv[diff] + half) >> HSV_SHIFT
    h = torch.where(h < 0, h + HUE_RANGE, h)
    return torch.stack([h, s, v], -1)


@functools.cache
def sector_table(device: torch.device) -> Tensor:
    """``SECTOR_BGR`` on ``device``, copied there once: a CUDA graph cannot capture a copy from pageable host
    memory, and its warm-up runs (``augment/graphs.py``) call this first."""
    return torch.tensor(SECTOR_BGR, device=device)


def hsv_to_rgb(hsv: Tensor) -> Tensor:
    """``cv2.cvtColor(..., COLOR_HSV2RGB)`` for uint8 (hue 0-179): exact.

    Shape: hsv (..., 3) integer -> (..., 3) uint8.
    """
    f32 = torch.float32
    h = hsv[..., 0].to(f32) * torch.tensor(6.0 / HUE_RANGE, dtype=f32)
    s = hsv[..., 1].to(f32) * torch.tensor(1 / 255.0, dtype=f32)
    v = hsv[..., 2].to(f32) * torch.tensor(1 / 255.0, dtype=f32)
    pre = torch.trunc(h)
    h = h - pre

    def one_minus(a: Tensor, b: Tensor) -> Tensor:  # float32 fma(-a, b, 1), emulated exactly
        return (1.0 - a.double() * b.double()).float()

    tab = torch.stack([v, v * (1 - s), v * one_minus(s, h), v * one_minus(s, 1 - h)], -1)
    sector = (pre - torch.trunc(pre * torch.tensor(1 / 6.0, dtype=f32)) * 6).long()
    idx = sector_table(hsv.device)[sector]  # (..., 3) table entries for b, g, r
    bgr = torch.gather(tab, -1, idx) * 255
    return torch.trunc(bgr).clamp(0, 255).to(torch.uint8).flip(-1)


def apply_hsv(images: Tensor, luts: Tensor) -> Tensor:
    """RGB -> HSV -> per-image LUT -> RGB.

    Shape: images (B, 3, H, W) uint8 RGB; luts (B, 3, 256) uint8. Returns (B, 3, H, W) uint8.
    """
    hsv = rgb_to_hsv(images.permute(0, 2, 3, 1))  # (B, H, W, 3)
    bsz = images.shape[0]
    mapped = torch.stack([torch.gather(luts[:, c], 1, hsv[..., c].reshape(bsz, -1)).reshape(hsv.shape[:-1])
                          for c in range(3)], -1)
    return hsv_to_rgb(mapped).permute(0, 3, 1, 2).contiguous()

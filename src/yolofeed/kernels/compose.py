"""One elementwise pass after the warp: MixUp, CutMix, HSV and the BGR swap, in Ultralytics' order.

This is the torch reference (a dozen torch passes over the batch; HSV from ``hsv.py``); ``compose_triton.py``
is the same pass as one kernel, one read and one write of the batch, and ``augment.pipeline.compose`` picks
one. Tests hold the two equal.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from yolofeed.kernels.hsv import apply_hsv


class MixUp(Protocol):
    """What compose reads of ``augment.mix.MixUpParams``.

    Shape: apply (B,) bool; ratio (B,) float64, the sample's weight; partner (B,) int64 rows of the warped batch.
    """

    apply: Tensor
    ratio: Tensor
    partner: Tensor


class CutMix(Protocol):
    """What compose reads of ``augment.mix.CutMixPlan``.

    Shape: apply (B,) bool; partner (B,) int64 rows of the warped batch; area (B, 4) int64 x1, y1, x2, y2 pasted.
    """

    apply: Tensor
    partner: Tensor
    area: Tensor


def compose_reference(warped: Tensor, mixup: MixUp | None, cut: CutMix | None,
                      luts: Tensor | None, bgr: Tensor | None, rows: int | None = None) -> Tensor:
    """The torch implementation of ``augment.pipeline.compose`` (CPU, tests, and CUDA without Triton).

    Shape: warped (R, 3, S, S) uint8; luts (rows, 3, 256) uint8. Returns (rows, 3, S, S) uint8.
    """
    out = warped[:len(warped) if rows is None else rows]
    if mixup is not None:  # numpy: (uint8 * r + uint8 * (1 - r)).astype(uint8): float64, truncated
        r = mixup.ratio[:, None, None, None]
        blend = (out.double() * r + warped[mixup.partner].double() * (1 - r)).to(torch.uint8)
        out = torch.where(mixup.apply[:, None, None, None], blend, out)
    if cut is not None:
        s = warped.shape[-1]
        ar = torch.arange(s, device=warped.device)
        x1, y1, x2, y2 = (cut.area[:, j, None] for j in range(4))
        inside = ((ar >= y1) & (ar < y2))[:, :, None] & ((ar >= x1) & (ar < x2))[:, None, :]  # (B, S, S)
        out = torch.where((inside & cut.apply[:, None, None])[:, None], warped[cut.partner], out)
    if luts is not None:
        out = apply_hsv(out, luts)
    if bgr is not None:
        out = torch.where(bgr[:, None, None, None], out.flip(1), out)
    return out

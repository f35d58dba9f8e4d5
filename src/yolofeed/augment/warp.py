"""The warp the pipeline runs: mosaic placement, perspective and flips in one sampling pass.

A Triton kernel on CUDA (``kernels/warp_triton.py``) and the torch reference elsewhere (``kernels/warp.py``,
where the arithmetic is described); the two give the same pixels.
"""

from __future__ import annotations

from torch import Tensor

from yolofeed.augment.geometry.flip import FlipParams
from yolofeed.augment.geometry.mosaic import Layout
from yolofeed.kernels.warp import BORDER, warp_reference


def warp(sources: Tensor, layout: Layout, M: Tensor, flips: FlipParams, size: int, perspective: bool,
         border: int = BORDER, paste: Tensor | None = None) -> Tensor:
    """Sample every output image through its mosaic layout and matrix; see ``kernels/warp.py``.

    Shape:
        sources: (N, Hmax, Wmax, 3) uint8 RGB, image i in its top-left (h_i, w_i) corner.
        M: (B, 3, 3) float32 forward matrix (canvas -> output). Returns (B, 3, size, size) uint8.
        paste: (B, H, W) bool, the canvas pixels that read their mirror (x -> w - 1 - x), or None.
    """
    if sources.is_cuda and (kernels := triton_kernels()) is not None:
        return kernels.warp(sources, layout, M, flips, size, perspective, border, paste=paste)
    return warp_reference(sources, layout, M, flips, size, perspective, border, paste=paste)


def triton_kernels():
    """The Triton module, or None where Triton is not installed (torch without CUDA wheels, macOS...)."""
    try:
        from yolofeed.kernels import warp_triton
    except ImportError:
        return None
    return warp_triton

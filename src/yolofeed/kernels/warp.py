"""One sampling pass: mosaic canvas + perspective warp + flips, as OpenCV computes it.

Ultralytics builds a 2s x 2s mosaic canvas, then ``cv2.warpAffine`` (or ``warpPerspective``) samples
it bilinearly with border value 114. We never build the canvas: each output pixel maps through the
inverse matrix to canvas coordinates, and each of its four bilinear neighbours is looked up in the
tile that covers it (or is 114). That reads each source pixel ~once instead of writing and reading
a 4x larger canvas, and it is the same arithmetic, so the result is the same, seams included.

The arithmetic is OpenCV 5.0's float path (``warp_kernels.simd.hpp``), reproduced bit for bit:
the inverse in float64 (``invertAffineTransform`` / ``invert``), cast to float32; per output pixel
``sx = fma(M0, x, float(y*M1) + M2)`` (the row term rounded twice, the column term fused);
``alpha = sx - floor(sx)``; lerps ``fma(alpha, p1 - p0, p0)`` across then down; round half to even.
Flips reflect the output index (x -> S-1-x), as ``np.fliplr`` after the warp does. Other OpenCV releases round
otherwise: 5.1 by one level in about 0.001 % of values (those within 1e-4 of a half); 4.x's fixed-point path
(5-bit coordinates, 15-bit weights) in about 8 % of values, by up to 4 levels in 0.4 % of them.

This is the torch reference; ``warp_triton.py`` is the same pass as one Triton kernel, and
``augment/warp.py`` picks one. Tests hold the reference to ``cv2`` and the kernel to the reference.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

BORDER = 114  # Ultralytics' fill value for mosaic canvases and warp borders
CHUNK_PIXELS = 1 << 22  # the reference processes this many output pixels at a time (memory, not speed)


class Tiles(Protocol):
    """Where each tile's pixels land on each output's canvas: what the warp reads of ``augment.geometry.Layout``.

    Shape: src (B, T) int64 source rows; rect (B, T, 4) int64 x1, y1, x2, y2 on the canvas; pad (B, T, 2) int64
    canvas minus source position; canvas_hw (B, 2) int64.
    """

    src: Tensor
    rect: Tensor
    pad: Tensor
    canvas_hw: Tensor


class Flips(Protocol):
    """Shape: ud, lr (B,) bool, flip each output up-down, left-right (``augment.geometry.FlipParams``)."""

    ud: Tensor
    lr: Tensor


def inverse_matrix(M: Tensor, perspective: bool) -> Tensor:
    """OpenCV's inverse of the forward matrix, float64 -> float32, flattened to (B, 9).

    Affine: ``invertAffineTransform`` (third row assumed 0 0 1). Perspective: the full inverse.
    """
    m = M.double()
    if not perspective:
        a, b, c, d, e, f = m[:, 0, 0], m[:, 0, 1], m[:, 0, 2], m[:, 1, 0], m[:, 1, 1], m[:, 1, 2]
        det = a * e - b * d
        D = torch.where(det != 0, 1.0 / det, torch.zeros_like(det))
        A11, A12, A21, A22 = e * D, -b * D, -d * D, a * D
        b1, b2 = -A11 * c - A12 * f, -A21 * c - A22 * f
        zero, one = torch.zeros_like(a), torch.ones_like(a)
        inv = torch.stack([A11, A12, b1, A21, A22, b2, zero, zero, one], -1)
    else:  # adjugate / determinant: no solver, so no host sync for error checks
        a, b, c, d, e, f, g, h, i = m.reshape(-1, 9).unbind(-1)
        co = torch.stack([e * i - f * h, c * h - b * i, b * f - c * e, f * g - d * i, a * i - c * g, c * d - a * f,
                          d * h - e * g, b * g - a * h, a * e - b * d], -1)
        det = a * co[:, 0] + b * co[:, 3] + c * co[:, 6]
        inv = co * torch.where(det != 0, 1.0 / det, torch.zeros_like(det))[:, None]
    return inv.float()


def _fma(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """float32 fused multiply-add, emulated exactly in float64 (the product of two floats is exact there)."""
    return (a.double() * b.double() + c.double()).float()


def _row(ys: Tensor, A: Tensor, j: int) -> Tensor:
    """``float(y * A[j]) + A[j + 1]`` per output row: two roundings, as OpenCV's row term.

    Shape: ys (n, H) float32; A (n, 9). Returns (n, H, 1).
    """
    return ((ys * A[:, j, None]) + A[:, j + 1, None])[:, :, None]


def _fetch(sources: Tensor, layout: Tiles, b: Tensor, cx: Tensor, cy: Tensor, border: int,
           paste: Tensor | None = None) -> Tensor:
    """Canvas pixels (cx, cy) of samples ``b``: the covering tile's source pixel, else ``border``; where ``paste``
    is set, its mirror's (x -> w - 1 - x, ``cv2.flip`` of the canvas).

    Shape: b: (n, 1, 1); cx, cy: (n, H, W) int64; paste (B, Hp, Wp) bool. Returns (n, H, W, 3) float32.
    """
    _, hm, wm, _ = sources.shape
    ch, cw = layout.canvas_hw[b, 0], layout.canvas_hw[b, 1]
    on_canvas = (cx >= 0) & (cy >= 0) & (cx < cw) & (cy < ch)
    if paste is not None:
        hp, wp = paste.shape[1:]
        mirrored = on_canvas & paste[b, cy.clamp(0, hp - 1), cx.clamp(0, wp - 1)]
        cx = torch.where(mirrored, cw - 1 - cx, cx)
    src_index = torch.full_like(cx, -1)
    sx, sy = torch.zeros_like(cx), torch.zeros_like(cy)
    for k in range(layout.src.shape[1]):  # later tiles win, as pasting in order does
        x1, y1, x2, y2 = (layout.rect[b, k, j] for j in range(4))
        hit = on_canvas & (cx >= x1) & (cx < x2) & (cy >= y1) & (cy < y2)
        src_index = torch.where(hit, layout.src[b, k], src_index)
        sx = torch.where(hit, cx - layout.pad[b, k, 0], sx)
        sy = torch.where(hit, cy - layout.pad[b, k, 1], sy)
    pix = sources[src_index.clamp(min=0), sy.clamp(0, hm - 1), sx.clamp(0, wm - 1)].float()
    return torch.where((src_index >= 0)[..., None], pix, torch.full_like(pix, border))


def warp_reference(sources: Tensor, layout: Tiles, M: Tensor, flips: Flips, size: int, perspective: bool,
                   border: int = BORDER, paste: Tensor | None = None) -> Tensor:
    """The torch implementation of ``augment.warp.warp`` (CPU, tests, and CUDA without Triton).

    Shape:
        sources: (N, Hmax, Wmax, 3) uint8, each image top-left. M: (B, 3, 3) float32 canvas -> output.
        Returns (B, 3, size, size) uint8.
    """
    bsz, dev = M.shape[0], M.device
    inv = inverse_matrix(M, perspective)
    out = torch.empty((bsz, size, size, 3), dtype=torch.uint8, device=dev)
    ar = torch.arange(size, device=dev)
    step = max(1, CHUNK_PIXELS // (size * size))
    for start in range(0, bsz, step):  # chunks bound memory on the CPU; each chunk is fully batched
        sl = slice(start, min(bsz, start + step))
        A = inv[sl]
        b = torch.arange(sl.start, sl.stop, device=dev)[:, None, None]
        xs = torch.where(flips.lr[sl, None], size - 1 - ar, ar).float()  # (n, W) output index after flip
        ys = torch.where(flips.ud[sl, None], size - 1 - ar, ar).float()  # (n, H)

        X = xs[:, None, :].expand(-1, size, -1)
        sx = _fma(A[:, 0, None, None].expand_as(X), X, _row(ys, A, 1).expand_as(X))
        sy = _fma(A[:, 3, None, None].expand_as(X), X, _row(ys, A, 4).expand_as(X))
        if perspective:
            w = _fma(A[:, 6, None, None].expand_as(X), X, _row(ys, A, 7).expand_as(X))
            sx, sy = sx / w, sy / w
        fx, fy = torch.floor(sx), torch.floor(sy)
        ax, ay = (sx - fx)[..., None], (sy - fy)[..., None]
        ix, iy = fx.long(), fy.long()
        p00 = _fetch(sources, layout, b, ix, iy, border, paste)
        p01 = _fetch(sources, layout, b, ix + 1, iy, border, paste)
        p10 = _fetch(sources, layout, b, ix, iy + 1, border, paste)
        p11 = _fetch(sources, layout, b, ix + 1, iy + 1, border, paste)
        f0 = _fma(ax, p01 - p00, p00)
        f1 = _fma(ax, p11 - p10, p10)
        f = _fma(ay, f1 - f0, f0)
        out[sl] = torch.round(f).clamp(0, 255).to(torch.uint8)  # torch.round: half to even, like v_round
    return out.permute(0, 3, 1, 2).contiguous()

"""The warp of ``warp.py`` as one Triton kernel: one program per block of output pixels of one sample.

Per output pixel it does what ``warp_reference`` does (and tests hold the two equal): OpenCV's
float32 coordinate arithmetic (fp fusion off, explicit ``fma`` where OpenCV fuses), the tile
lookup of the four bilinear neighbours, the lerps and round-half-to-even. Cost: 12 byte gathers
per pixel from the HWC sources (cached: neighbours share lines) and 3 byte stores; no
intermediate canvas, no float image in memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from yolofeed.kernels.common_triton import round_even
from yolofeed.kernels.warp import Flips, Tiles, inverse_matrix

BLOCK = 128  # with 4 warps: 1.96 ms for 128 images at 640 px on the H200, 3.3 ms for 128/2 and 256/4 (BENCHMARKS.md)


@triton.jit
def fetch(src_ptr, tiles_ptr, paste_ptr, b, cx, cy, ch, cw, hm, wm, hp, wp, mask, T: tl.constexpr,
          BORDER: tl.constexpr, PASTE: tl.constexpr):
    """The three channels of canvas pixel (cx, cy) as float32: the covering tile's source pixel, or BORDER; with
    PASTE, its mirror's (x -> cw - 1 - x) where copy-paste's mask is set."""
    on = (cx >= 0) & (cy >= 0) & (cx < cw) & (cy < ch)
    if PASTE:  # one more byte gather per neighbour, on canvas only (cx < cw <= wp, cy < ch <= hp)
        mirrored = tl.load(paste_ptr + (b * hp + cy) * wp + cx, mask=mask & on, other=0) != 0
        cx = tl.where(mirrored, cw - 1 - cx, cx)
    src = tl.full(cx.shape, -1, tl.int64)
    sx = tl.zeros(cx.shape, tl.int64)
    sy = tl.zeros(cx.shape, tl.int64)
    for k in tl.static_range(T):  # later tiles win, as pasting in order does
        base = tiles_ptr + (b * T + k) * 7  # src, x1, y1, x2, y2, padx, pady
        t_src = tl.load(base)
        x1, y1, x2, y2 = tl.load(base + 1), tl.load(base + 2), tl.load(base + 3), tl.load(base + 4)
        hit = on & (cx >= x1) & (cx < x2) & (cy >= y1) & (cy < y2)
        src = tl.where(hit, t_src, src)
        sx = tl.where(hit, cx - tl.load(base + 5), sx)
        sy = tl.where(hit, cy - tl.load(base + 6), sy)
    found = src >= 0
    addr = ((tl.maximum(src, 0) * hm + sy) * wm + sx) * 3
    m = mask & found
    r = tl.where(found, tl.load(src_ptr + addr, mask=m, other=0).to(tl.float32), BORDER)
    g = tl.where(found, tl.load(src_ptr + addr + 1, mask=m, other=0).to(tl.float32), BORDER)
    bl = tl.where(found, tl.load(src_ptr + addr + 2, mask=m, other=0).to(tl.float32), BORDER)
    return r, g, bl

@triton.jit
def lerp(ax, ay, p00, p01, p10, p11):
    f0 = tl.fma(ax, p01 - p00, p00)
    f1 = tl.fma(ax, p11 - p10, p10)
    f = tl.fma(ay, f1 - f0, f0)
    return tl.minimum(tl.maximum(round_even(f), 0.0), 255.0).to(tl.uint8)

@triton.jit
def warp_kernel(src_ptr, out_ptr, inv_ptr, tiles_ptr, canvas_ptr, flip_ptr, paste_ptr, hm, wm, hp, wp,
                S: tl.constexpr, T: tl.constexpr, PERSPECTIVE: tl.constexpr, BORDER: tl.constexpr,
                PASTE: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < S * S
    y, x = offs // S, offs % S
    lr, ud = tl.load(flip_ptr + b * 2), tl.load(flip_ptr + b * 2 + 1)
    xs = tl.where(lr != 0, S - 1 - x, x).to(tl.float32)  # flips reflect the output index
    ys = tl.where(ud != 0, S - 1 - y, y).to(tl.float32)
    A = inv_ptr + b * 9
    # OpenCV: row term float(y*M1) + M2 rounded twice (fp fusion is off for this kernel), column term fused
    sx = tl.fma(tl.load(A + 0), xs, ys * tl.load(A + 1) + tl.load(A + 2))
    sy = tl.fma(tl.load(A + 3), xs, ys * tl.load(A + 4) + tl.load(A + 5))
    if PERSPECTIVE:
        w = tl.fma(tl.load(A + 6), xs, ys * tl.load(A + 7) + tl.load(A + 8))
        sx = tl.div_rn(sx, w)
        sy = tl.div_rn(sy, w)
    fx, fy = tl.floor(sx), tl.floor(sy)
    ax, ay = sx - fx, sy - fy
    ix, iy = fx.to(tl.int64), fy.to(tl.int64)
    ch, cw = tl.load(canvas_ptr + b * 2), tl.load(canvas_ptr + b * 2 + 1)
    r00, g00, b00 = fetch(src_ptr, tiles_ptr, paste_ptr, b, ix, iy, ch, cw, hm, wm, hp, wp, mask, T, BORDER, PASTE)
    r01, g01, b01 = fetch(src_ptr, tiles_ptr, paste_ptr, b, ix + 1, iy, ch, cw, hm, wm, hp, wp, mask, T,
                                 BORDER, PASTE)
    r10, g10, b10 = fetch(src_ptr, tiles_ptr, paste_ptr, b, ix, iy + 1, ch, cw, hm, wm, hp, wp, mask, T,
                                 BORDER, PASTE)
    r11, g11, b11 = fetch(src_ptr, tiles_ptr, paste_ptr, b, ix + 1, iy + 1, ch, cw, hm, wm, hp, wp, mask,
                                 T, BORDER, PASTE)
    out = out_ptr + b * 3 * S * S + offs
    tl.store(out, lerp(ax, ay, r00, r01, r10, r11), mask=mask)
    tl.store(out + S * S, lerp(ax, ay, g00, g01, g10, g11), mask=mask)
    tl.store(out + 2 * S * S, lerp(ax, ay, b00, b01, b10, b11), mask=mask)


def warp(sources: Tensor, layout: Tiles, M: Tensor, flips: Flips, size: int, perspective: bool,
         border: int, block: int = BLOCK, num_warps: int = 4, paste: Tensor | None = None) -> Tensor:
    """Same contract as ``augment.warp.warp``; sources and parameters on one CUDA device (or CPU under
    TRITON_INTERPRET=1)."""
    bsz, t = layout.src.shape
    dev = sources.device
    inv = inverse_matrix(M, perspective).contiguous()
    tiles = torch.cat([layout.src[..., None], layout.rect, layout.pad], -1).to(torch.int64).contiguous()  # (B, T, 7)
    canvas = layout.canvas_hw.to(torch.int64).contiguous()
    flip = torch.stack([flips.lr, flips.ud], 1).to(torch.int32).contiguous()
    out = torch.empty((bsz, 3, size, size), dtype=torch.uint8, device=dev)
    grid = (bsz, triton.cdiv(size * size, block))
    mirror = out if paste is None else paste.contiguous().view(torch.uint8)  # bool as bytes, no copy; any pointer
    # where there is none
    hp, wp = (1, 1) if paste is None else paste.shape[1:]
    warp_kernel[grid](sources.contiguous(), out, inv, tiles, canvas, flip, mirror, sources.shape[1], sources.shape[2],
                    hp, wp, S=size, T=t, PERSPECTIVE=perspective, BORDER=float(border), PASTE=paste is not None,
                    BLOCK=block, num_warps=num_warps, enable_fp_fusion=False)
    return out

"""``jpeg.place`` as one Triton kernel: a batch's decoded images resized and written into the batch in one launch.

The torch path launches a copy per image (CHW to HWC) and, per group of images that share a size pair, a
stack, a float copy, the resize, the rounding and a narrowing copy: ~140 launches and five float passes
over the resized images for a batch of 128, all beside the training step on the loader's side stream.
Here one program writes one block of one output row of one image: 3 byte loads per pixel for an image kept
at its size, 12 (cached: neighbours share lines) for a resized one, and 3 byte stores, no intermediate.

Per pixel it does what ``torch.nn.functional.interpolate(bilinear, align_corners=False, antialias=False)``
does in float32 (the source index ``scale * (dst + 0.5) - 0.5``, clamped at 0; the lerps; round half to
even; clamp), so the two paths agree within a level (tests hold them to that; an image kept at its size is
copied exactly).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 256  # pixels of one output row a program


@triton.jit
def _round_even(x):
    r = tl.floor(x + 0.5)  # exact for 0 <= x < 256: x has at most 16 fractional bits there
    tie = (r - x) == 0.5
    odd = (r.to(tl.int32) & 1) == 1
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def _source_index(scale, dst):
    """PyTorch's ``area_pixel_compute_source_index`` (align_corners=False): index, its next one, weight."""
    s = tl.maximum(scale * (dst.to(tl.float32) + 0.5) - 0.5, 0.0)
    i = s.to(tl.int32)  # s >= 0: truncation is floor
    return i, s - i.to(tl.float32)


@triton.jit
def _lerp(src, plane, a00, a01, a10, a11, wx, wy, mask):
    p00 = tl.load(src + plane + a00, mask=mask, other=0).to(tl.float32)
    p01 = tl.load(src + plane + a01, mask=mask, other=0).to(tl.float32)
    p10 = tl.load(src + plane + a10, mask=mask, other=0).to(tl.float32)
    p11 = tl.load(src + plane + a11, mask=mask, other=0).to(tl.float32)
    top = (1.0 - wx) * p00 + wx * p01
    bottom = (1.0 - wx) * p10 + wx * p11
    v = (1.0 - wy) * top + wy * bottom
    return tl.minimum(tl.maximum(_round_even(v), 0.0), 255.0).to(tl.uint8)


@triton.jit
def place_kernel(ptrs_ptr, meta_ptr, out_ptr, out_image, out_row, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    y = tl.program_id(1)
    m = meta_ptr + i * 5  # slot in out, decoded h0 and w0, target h and w
    h0, w0 = tl.load(m + 1), tl.load(m + 2)
    h, w = tl.load(m + 3), tl.load(m + 4)
    if y < h:
        x = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
        mask = x < w
        src = tl.load(ptrs_ptr + i).to(tl.pointer_type(tl.uint8))  # image i's CHW bytes
        plane = h0.to(tl.int64) * w0
        dst = out_ptr + tl.load(m).to(tl.int64) * out_image + y.to(tl.int64) * out_row + x * 3
        if (h0 == h) & (w0 == w):
            a = src + y.to(tl.int64) * w0 + x
            r = tl.load(a, mask=mask)
            g = tl.load(a + plane, mask=mask)
            b = tl.load(a + 2 * plane, mask=mask)
        else:
            y1, wy = _source_index(tl.div_rn(h0.to(tl.float32), h.to(tl.float32)), y)
            x1, wx = _source_index(tl.div_rn(w0.to(tl.float32), w.to(tl.float32)), x)
            y2 = tl.where(y1 < h0 - 1, y1 + 1, y1)
            x2 = tl.where(x1 < w0 - 1, x1 + 1, x1)
            r1, r2 = y1.to(tl.int64) * w0, y2.to(tl.int64) * w0
            r = _lerp(src, 0, r1 + x1, r1 + x2, r2 + x1, r2 + x2, wx, wy, mask)
            g = _lerp(src, plane, r1 + x1, r1 + x2, r2 + x1, r2 + x2, wx, wy, mask)
            b = _lerp(src, 2 * plane, r1 + x1, r1 + x2, r2 + x1, r2 + x2, wx, wy, mask)
        tl.store(dst, r, mask=mask)
        tl.store(dst + 1, g, mask=mask)
        tl.store(dst + 2, b, mask=mask)


def place(images: dict[int, Tensor], hw: Sequence[tuple[int, int]], out: Tensor) -> None:
    """Same contract as ``jpeg.place``; images and ``out`` on one CUDA device (or CPU under TRITON_INTERPRET=1).

    The images stay referenced by the caller until this returns, and the kernel is queued on the current stream,
    where the caching allocator can only hand their memory out again after it.
    """
    if not images:
        return
    ks = list(images)
    ims = [images[k].contiguous() for k in ks]
    meta = torch.tensor([(k, im.shape[1], im.shape[2], *hw[k]) for k, im in zip(ks, ims)], dtype=torch.int32)
    ptrs = torch.tensor([im.data_ptr() for im in ims], dtype=torch.int64)
    if out.is_cuda:  # both from pinned memory: the copies do not block the loader thread
        meta, ptrs = (t.pin_memory().to(out.device, non_blocking=True) for t in (meta, ptrs))
    grid = (len(ks), max(h for h, _ in hw), triton.cdiv(max(w for _, w in hw), BLOCK))
    place_kernel[grid](ptrs, meta, out, out.stride(0), out.stride(1), BLOCK=BLOCK, num_warps=4)

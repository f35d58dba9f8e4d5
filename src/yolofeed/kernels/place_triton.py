"""``pack.codecs.jpeg.place`` as one Triton kernel: a batch's decoded images resized and written into the batch in
one launch. The torch path, its reference, is ``jpeg.place`` itself, which picks this kernel on CUDA.

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

import contextlib
from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from yolofeed.kernels.common_triton import round_even  # the warp's rounding: half to even, as torch's round_

BLOCK = 256  # pixels of one output row a program


@triton.jit
def _source_index(scale, dst):
    """PyTorch's ``area_pixel_compute_source_index`` (align_corners=False): the index below and its weight."""
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
    return tl.minimum(tl.maximum(round_even(v), 0.0), 255.0).to(tl.uint8)


@triton.jit
def place_kernel(table_ptr, out_ptr, out_image, out_row, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    y = tl.program_id(1).to(tl.int64)
    m = table_ptr + i * 6  # image i's CHW bytes, its slot in out, decoded h0 and w0, target h and w
    h0, w0 = tl.load(m + 2), tl.load(m + 3)
    h, w = tl.load(m + 4), tl.load(m + 5)
    if y < h:
        x = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
        mask = x < w
        src = tl.load(m).to(tl.pointer_type(tl.uint8))
        plane = h0 * w0
        dst = out_ptr + tl.load(m + 1) * out_image + y * out_row + x * 3
        if (h0 == h) & (w0 == w):
            a = src + y * w0 + x
            r = tl.load(a, mask=mask)
            g = tl.load(a + plane, mask=mask)
            b = tl.load(a + 2 * plane, mask=mask)
        else:
            y1, wy = _source_index(tl.div_rn(h0.to(tl.float32), h.to(tl.float32)), y)
            x1, wx = _source_index(tl.div_rn(w0.to(tl.float32), w.to(tl.float32)), x)
            y2 = tl.where(y1 < h0 - 1, y1 + 1, y1)
            x2 = tl.where(x1 < w0 - 1, x1 + 1, x1)
            r1, r2 = y1 * w0, y2 * w0
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
    # one int64 table (pointer, slot, h0, w0, h, w), one copy to the device; host work only, no launch per image
    table = torch.tensor([(im.data_ptr(), k, im.shape[1], im.shape[2], *hw[k]) for k, im in zip(ks, ims)],
                         dtype=torch.int64)
    top = table[:, 1:].amax(0).tolist()
    # the kernel does not check its bounds, where the torch ops raise: an image must fit its slot of ``out``
    if table[:, 2:].amin().item() < 1 or top[0] >= out.shape[0] or top[3] > out.shape[1] or top[4] > out.shape[2]:
        raise ValueError(f"place: images of up to {top[3]}x{top[4]} into slots up to {top[0]} do not fit a batch "
                         f"of shape {tuple(out.shape)}")
    with torch.cuda.device(out.device) if out.is_cuda else contextlib.nullcontext():  # the launch goes to the
        # current device's current stream: the loader's side stream on ``out``'s device
        if out.is_cuda:  # from pinned memory: the copy does not block the loader thread
            table = table.pin_memory().to(out.device, non_blocking=True)
        grid = (len(ks), top[3], triton.cdiv(top[4], BLOCK))
        place_kernel[grid](table, out, out.stride(0), out.stride(1), BLOCK=BLOCK, num_warps=4)

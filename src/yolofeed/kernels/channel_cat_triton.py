"""One input of a channel concatenation of NHWC (channels-last) activations, copied as (M, C) rows.

``torch.cat`` of channels-last tensors along the channels takes a slow path on the GPU: where an input is a channel
slice of a wider tensor (C2f's ``chunk``), it copies each input through a generic strided kernel that reads and
writes one element a thread; where all are dense, its batched kernel walks the NCHW order. Seen as rows, each input
is M rows of C contiguous values ``src_stride`` apart, and its place in the output the same rows ``dst_stride``
apart: a 2-D tile copy reads and writes whole rows. ``channel_cat.py`` launches it once an input.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def copy_rows(src_ptr, src_stride, dst_ptr, dst_stride, M, C, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """dst[r, c] = src[r, c] for the (M, C) rows, over (BLOCK_M, BLOCK_C) tiles; ``dst_ptr`` is the input's first
    channel in the output."""
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < M)[:, None] & (cols < C)[None, :]
    x = tl.load(src_ptr + rows[:, None] * src_stride + cols[None, :], mask=mask)
    tl.store(dst_ptr + rows[:, None] * dst_stride + cols[None, :], x, mask=mask)

"""The detection loss's classification term as two Triton passes: ``partials`` (forward: the elementwise BCE with
logits of (x, t rounded to x's dtype), summed per program in float32) and ``grad`` (backward: (sigmoid(x) - t) * g,
rounded to x's dtype). ``bce_sum.py`` says what they replace and which roundings are ATen's.

ATen's float32 sigmoid is ``1 / (1 + expf(-x))`` with IEEE division; Triton's ``tl.exp`` and ``/`` are the GPU's
approximate instructions, so the backward takes libdevice's ``expf`` (CUDA's own) and ``div_rn``. Under Triton's
interpreter (``TRITON_INTERPRET=1``, the CPU tests), which has no libdevice, the same passes run on ``tl.exp``,
``tl.log`` and ``/``: the structure is tested there, the bits on the GPU.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

if os.environ.get("TRITON_INTERPRET") == "1":
    @triton.jit
    def _exp(x):
        return tl.exp(x)

    @triton.jit
    def _log1p(x):
        return tl.log(1.0 + x)

    @triton.jit
    def _recip_rn(x):
        return 1.0 / x
else:
    from triton.language.extra.cuda import libdevice

    @triton.jit
    def _exp(x):
        return libdevice.exp(x)  # CUDA's expf, as ATen's sigmoid and log_sigmoid call it

    @triton.jit
    def _log1p(x):
        return libdevice.log1p(x)

    @triton.jit
    def _recip_rn(x):
        return libdevice.div_rn(1.0, x)


@triton.jit
def _load(x_ptr, t_ptr, offs, mask):
    """x in float32, and t rounded to x's dtype first (Ultralytics' ``target_scores.to(dtype)``), in float32."""
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    t = tl.load(t_ptr + offs, mask=mask, other=0.0).to(x_ptr.dtype.element_ty).to(tl.float32)
    return x, t


@triton.jit
def partials(x_ptr, t_ptr, part_ptr, N, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """part[program] = the sum over the program's ITERS x BLOCK elements of (1 - t) x - log_sigmoid(x), with
    log_sigmoid(x) = min(x, 0) - log1p(exp(-|x|)) (ATen's formulas, float32); one lane a running sum."""
    start = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], tl.float32)
    for i in tl.static_range(ITERS):
        offs = start + i * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        x, t = _load(x_ptr, t_ptr, offs, mask)
        log_sigmoid = tl.minimum(x, 0.0) - _log1p(_exp(-tl.abs(x)))
        acc += tl.where(mask, (1.0 - t) * x - log_sigmoid, 0.0)
    tl.store(part_ptr + tl.program_id(0), tl.sum(acc, 0))


@triton.jit
def grad(x_ptr, t_ptr, g_ptr, dx_ptr, N, BLOCK: tl.constexpr):
    """dx = (sigmoid(x) - t) * g in float32, rounded to dx's dtype; g the sum's gradient (a float32 scalar on the
    device: no sync)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x, t = _load(x_ptr, t_ptr, offs, mask)
    sigmoid = _recip_rn(1.0 + _exp(-x))
    g = tl.load(g_ptr)
    tl.store(dx_ptr + offs, ((sigmoid - t) * g).to(dx_ptr.dtype.element_ty), mask=mask)

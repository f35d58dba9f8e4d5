"""Training-mode batch norm followed by SiLU, as one autograd op on an NHWC (channels-last) activation.

``bn_silu(x, weight, bias, running_mean, running_var, momentum, eps)`` is ``F.silu(F.batch_norm(x, ..., True,
momentum, eps))``: the same per-channel statistics (biased variance to normalise, unbiased into ``running_var``),
the same running-statistics update, the same gradients. What differs is where the time goes: the BN output is never
stored (the backward recomputes it from x), and each direction is two passes over the activation instead of cuDNN's
batch norm plus SiLU's (``bn_silu_triton.py`` says how many). Sums are float32 in both; the results differ from
cuDNN's by float32 rounding of another summation order, which ``tests/test_bn_silu.py`` bounds.

``bn_silu_halves(..., split)`` is the same op with its output as two dense tensors, its channels before ``split``
and after: what a C2f block's ``chunk`` of it is, without the copy a convolution makes of a channel slice, or the one
the chunk's backward makes to join the two gradients.

``fusable(x)`` says whether an activation can take it: a channels-last 4-D tensor with more than one value per
channel. The torch path (``reference``) runs the same arithmetic on any device; the Triton path runs on CUDA.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

# Launch configuration, measured on yolo11n's 71 activations at batch 128 on an H200 (tools/device/bn_silu_tune.py):
# the statistics passes run faster as fewer, wider programs (each partial, its store, its ticket and the last
# program's merge cost about as much as a long stretch of rows), the elementwise passes as small tiles.
_GROUPS = 256  # row groups of the statistics passes: about two programs per SM of an H100/H200
_TILE = 4096  # elements of a statistics program's tile
_WARPS = 8  # warps of a statistics program
_UNROLL = 2  # tiles a statistics program reads an iteration (two: half the loop's iterations; four are no faster)
_STAGES = 3  # the statistics passes' software pipelining (Triton's num_stages; 3 is its default)
_FLAT_TILE = 1024  # elements of an elementwise program's tile
_FLAT_WARPS = 2  # warps of an elementwise program
_tickets: dict[tuple, Tensor] = {}  # (device, stream) -> the statistics passes' ticket counters, int32 zeros
# Set around a CUDA graph's capture: the graph's replays then use counters no eager call shares (a stream id is
# reused by later streams, which could run beside a replay).
own_tickets: Tensor | None = None
TICKETS = 4096  # counters: one per channel block of 64


def fusable(x: Tensor) -> bool:
    """Whether ``x`` is an activation the fused op takes: 4-D, channels-last dense, more than one value a channel."""
    return (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
            and x.shape[0] * x.shape[2] * x.shape[3] > 1 and x.dtype in (torch.float16, torch.bfloat16, torch.float32))


def row_stride(dy: Tensor) -> int | None:
    """The row stride of ``dy`` seen as (M, C) rows of unit channel stride (a channel slice of a wider channels-last
    tensor has one), or None where its strides are not rows."""
    n, c, h, w = dy.shape
    s = dy.stride()
    r = s[3]
    ok = (s[1] == 1 or c == 1) and r >= c and s[2] == w * r and (s[0] == h * w * r or n == 1)
    return r if ok else None


class _Plan(NamedTuple):
    """An (m, c) activation's launches: the statistics passes' and the elementwise passes'."""

    grid: tuple[int, int]  # statistics: (row groups G, channel blocks)
    block_m: int
    block_c: int
    rows: int  # rows a statistics program reads
    groups: int
    block_g: int  # the last program's merge reads (G, 2, BLOCK_C) partials in tiles of BLOCK_G rows
    launch: dict  # statistics: UNROLL, num_warps, num_stages
    flat_grid: tuple[int, int]
    flat_m: int
    flat_c: int
    flat_warps: int


_plans: dict[tuple[int, int], _Plan] = {}


def _plan(m: int, c: int) -> _Plan:
    """The launches for an (m, c) activation. Cached: the host's time per launch is what the small activations of a
    detector's later layers cost."""
    plan = _plans.get((m, c))
    if plan is None:
        import triton

        block_c = min(triton.next_power_of_2(c), 64)
        block_m = max(_TILE // block_c, 16)
        cb = triton.cdiv(c, block_c)
        groups = max(1, min(triton.cdiv(m, block_m), triton.cdiv(_GROUPS, cb)))
        step = block_m * _UNROLL
        rows = triton.cdiv(triton.cdiv(m, groups), step) * step
        groups = triton.cdiv(m, rows)
        flat_c = min(triton.next_power_of_2(c), 256)
        flat_m = max(_FLAT_TILE // flat_c, 1)
        plan = _plans[(m, c)] = _Plan(
            (groups, cb), block_m, block_c, rows, groups, min(triton.next_power_of_2(groups), max(64, 8192 // block_c)),
            {"UNROLL": _UNROLL, "num_warps": _WARPS, "num_stages": _STAGES},
            (triton.cdiv(m, flat_m), triton.cdiv(c, flat_c)), flat_m, flat_c, _FLAT_WARPS)
    return plan


def _tickets_for(x: Tensor) -> Tensor:
    if own_tickets is not None:  # a graph's capture: counters of its own (train/graphed.py)
        return own_tickets
    key = (x.device, torch.cuda.current_stream(x.device).stream_id if x.is_cuda else 0)
    t = _tickets.get(key)
    if t is None:
        t = _tickets[key] = torch.zeros(TICKETS, device=x.device, dtype=torch.int32)
    return t


def _forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor,
             momentum: float, eps: float, split: int | None) -> tuple[Tensor, ...]:
    """The statistics pass, then ``apply`` into y, or into its first ``split`` channels and the rest as two dense
    tensors."""
    from yolofeed.kernels import bn_silu_triton as k

    n, c, h, w = x.shape
    m = x.numel() // c
    p = _plan(m, c)
    work = torch.empty(p.groups * 2 * c + 6 * c, device=x.device, dtype=torch.float32)
    save = work[p.groups * 2 * c:]
    k.stats[p.grid](x, work, _tickets_for(x), save, weight, bias, running_mean, running_var, m, c, p.rows, p.groups,
                    momentum, eps, BLOCK_M=p.block_m, BLOCK_C=p.block_c, BLOCK_G=p.block_g, **p.launch)
    if split is None:
        ys = (torch.empty_like(x),)  # channels-last, as x
    else:
        ys = tuple(torch.empty((n, part, h, w), device=x.device, dtype=x.dtype, memory_format=torch.channels_last)
                   for part in (split, c - split))
    k.apply[p.flat_grid](x, ys[0], ys[-1], save, m, c, split or c, BLOCK_M=p.flat_m, BLOCK_C=p.flat_c,
                         SPLIT=split is not None, num_warps=p.flat_warps)
    ctx.save_for_backward(x, save)
    ctx.plan, ctx.dtypes, ctx.split = p, (weight.dtype, bias.dtype), split
    return ys


def _rows(dy: Tensor) -> tuple[Tensor, int]:
    """dy and its row stride (``row_stride``); a layout the next op's backward rarely gives is copied once."""
    stride = row_stride(dy)
    if stride is None:
        dy = dy.contiguous(memory_format=torch.channels_last)
        stride = dy.shape[1]
    return dy, stride


def _backward(ctx, *dys: Tensor) -> tuple[Tensor | None, ...]:
    """dx, dweight, dbias from dy, or from the gradients of the two halves (read in place: never joined)."""
    from yolofeed.kernels import bn_silu_triton as k

    x, save = ctx.saved_tensors
    p = ctx.plan
    dy, stride = _rows(dys[0])
    dy2, stride2 = _rows(dys[1]) if len(dys) > 1 else (dy, stride)
    c = x.shape[1]
    m = x.numel() // c
    c1, split = ctx.split or c, ctx.split is not None
    part = torch.empty(p.groups * 2 * c, device=x.device, dtype=torch.float32)
    dw = torch.empty(c, device=x.device, dtype=torch.float32)
    db = torch.empty(c, device=x.device, dtype=torch.float32)
    k.grad_stats[p.grid](x, dy, stride, dy2, stride2, c1, save, part, _tickets_for(x), dw, db, m, c, p.rows, p.groups,
                         BLOCK_M=p.block_m, BLOCK_C=p.block_c, BLOCK_G=p.block_g, SPLIT=split, **p.launch)
    dx = torch.empty_like(x)
    k.grad_apply[p.flat_grid](x, dy, stride, dy2, stride2, c1, dx, save, m, c, BLOCK_M=p.flat_m, BLOCK_C=p.flat_c,
                              SPLIT=split, num_warps=p.flat_warps)
    return dx, dw.to(ctx.dtypes[0]), db.to(ctx.dtypes[1])


class _TritonBNSiLU(torch.autograd.Function):
    """x, y and dx are passed as they are: a channels-last dense (N, C, H, W) tensor is the (M, C) rows in memory."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor,
                momentum: float, eps: float) -> Tensor:
        return _forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps, None)[0]

    @staticmethod
    def backward(ctx, dy: Tensor):
        return *_backward(ctx, dy), None, None, None, None


class _TritonBNSiLUHalves(torch.autograd.Function):
    """The same op with its output written as two dense tensors, the channels before ``split`` and after: a
    consumer of one half (a convolution) then reads it in place, where a channel slice of one output would be
    copied to dense rows first, and the backward reads the two gradients where it would read them joined."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor,
                momentum: float, eps: float, split: int) -> tuple[Tensor, Tensor]:
        return _forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps, split)

    @staticmethod
    def backward(ctx, dy1: Tensor, dy2: Tensor):
        return *_backward(ctx, dy1, dy2), None, None, None, None, None


def reference(x: Tensor, weight: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor, momentum: float,
              eps: float) -> Tensor:
    """The same arithmetic in torch ops (float32 statistics, the BN output recomputed in the backward by autograd's
    own formulas): the CPU path, and the yardstick the Triton path is tested against."""
    xf = x if x.dtype == torch.float64 else x.float()
    dims = (0, 2, 3)
    m = x.numel() // x.shape[1]
    with torch.no_grad():
        mean = xf.mean(dims)
        var = xf.var(dims, unbiased=False)
        running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
        running_var.mul_(1 - momentum).add_(var * (m / max(m - 1, 1)), alpha=momentum)
    mean = xf.mean(dims, keepdim=True)
    var = xf.var(dims, unbiased=False, keepdim=True)
    w, b = (t.to(xf.dtype)[None, :, None, None] for t in (weight, bias))
    z = (xf - mean) * torch.rsqrt(var + eps) * w + b
    return torch.nn.functional.silu(z).to(x.dtype)


def bn_silu(x: Tensor, weight: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor, momentum: float,
            eps: float) -> Tensor:
    """silu(batch_norm(x, training=True)) with the running statistics updated in place (not num_batches_tracked:
    the caller's module counts). Triton on CUDA, the torch reference elsewhere; ``x`` must be ``fusable``."""
    if x.is_cuda:
        return _TritonBNSiLU.apply(x, weight, bias, running_mean, running_var, float(momentum), float(eps))
    return reference(x, weight, bias, running_mean, running_var, momentum, eps)


def bn_silu_halves(x: Tensor, weight: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor,
                   momentum: float, eps: float, split: int) -> tuple[Tensor, Tensor]:
    """``bn_silu(...).split((split, C - split), 1)`` with each half a dense channels-last tensor: the same values,
    and the same gradients for x, the weight and the bias. ``x`` must be ``fusable``, 0 < split < C."""
    if not 0 < split < x.shape[1]:
        raise ValueError(f"bn_silu_halves: split {split} outside 1..{x.shape[1] - 1}")
    if x.is_cuda:
        return _TritonBNSiLUHalves.apply(x, weight, bias, running_mean, running_var, float(momentum), float(eps),
                                         int(split))
    y = reference(x, weight, bias, running_mean, running_var, momentum, eps)
    return tuple(t.contiguous(memory_format=torch.channels_last) for t in y.split((split, x.shape[1] - split), 1))

"""Training batch norm and SiLU as one pass, forward and backward, on an NHWC activation seen as (M, C) rows.

cuDNN's NHWC batch norm and the SiLU after it read and write the activation about 17 times a step between them
(forward and backward); these kernels read it 7 times and write it twice:

- forward: ``stats`` reads x once (per-channel shifted sums, one partial per row group; the last
  program of a channel block merges the partials and updates the running statistics), ``apply`` reads x and writes
  silu(x * scale + shift);
- backward: ``grad_stats`` reads x and dy (the BN output is recomputed, never stored; the last program gives the
  weight's and the bias's gradients), ``grad_apply`` reads x and dy again and writes dx.

Two launches a direction: on the small activations of a detector's later layers the launches, not the bytes, cost
the time. "The last program" is a ticket counter per channel block (``tickets``, int32 zeros, reset by the last
program): the partials are stored before a release-acquire atomic, and read after it from L2 (``.cg``).

Every sum is in float32; the activation stays in its own dtype. ``bn_silu.py`` is the torch reference of the same
arithmetic and the autograd Function that picks one.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _sum_partials(part_ptr, G, C, cols, cmask, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr):
    """The two rows of part (G, 2, C) summed over the G groups, for the channels ``cols`` (read from L2: other
    programs stored them)."""
    t1 = tl.zeros([BLOCK_G, BLOCK_C], tl.float32)
    t2 = tl.zeros([BLOCK_G, BLOCK_C], tl.float32)
    for g0 in range(0, G, BLOCK_G):
        gs = g0 + tl.arange(0, BLOCK_G)
        mask = (gs < G)[:, None] & cmask[None, :]
        at = part_ptr + gs[:, None] * 2 * C + cols[None, :]
        t1 += tl.load(at, mask=mask, other=0.0, cache_modifier=".cg")
        t2 += tl.load(at + C, mask=mask, other=0.0, cache_modifier=".cg")
    return tl.sum(t1, 0), tl.sum(t2, 0)


@triton.jit
def _last_of_block(part_ptr, tickets_ptr, g, cb, C, G, cols, cmask, a, b):
    """Store this program's partials (a, b) and take a ticket: whether it is the channel block's last program."""
    base = part_ptr + g * 2 * C + cols
    tl.store(base, a, mask=cmask)
    tl.store(base + C, b, mask=cmask)
    tl.debug_barrier()  # every warp's partial stored before the ticket is taken (the atomic's release covers them)
    return tl.atomic_add(tickets_ptr + cb, 1, sem="acq_rel") == G - 1


@triton.jit
def stats(x_ptr, part_ptr, tickets_ptr, save_ptr, w_ptr, b_ptr, rm_ptr, rv_ptr, M, C, rows_per_prog, G, momentum,
          eps, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr, UNROLL: tl.constexpr = 1):
    """Per row group g, per channel: sum(x - k) and sum((x - k)^2) of x[g's rows, c] into part (G, 2, C) float32, k
    the channel's value in row 0 (shifted sums: the variance loses nothing to cancellation where the mean is far from
    zero). Each lane of the tile accumulates on its own; one reduction a program. UNROLL tiles are read an
    iteration (the sums then run in another order). The last program of the channel
    block sums the G partials, updates running_mean and running_var (unbiased) in place and writes save (6, C)
    float32 rows mean, invstd, scale = w * invstd, shift = b - mean * scale."""
    g = tl.program_id(0)
    cb = tl.program_id(1)
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    k = tl.load(x_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    start = g * rows_per_prog
    end = tl.minimum(start + rows_per_prog, M)
    s1 = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)
    s2 = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)
    for r0 in range(start, end, BLOCK_M * UNROLL):
        for u in tl.static_range(UNROLL):  # UNROLL tiles' loads in flight at once: the pass is bound by latency
            rows = (r0 + u * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
            mask = (rows < end)[:, None] & cmask[None, :]
            x = tl.load(x_ptr + rows[:, None] * C + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            d = tl.where(mask, x - k, 0.0)
            s1 += d
            s2 += d * d
    if _last_of_block(part_ptr, tickets_ptr, g, cb, C, G, cols, cmask, tl.sum(s1, 0), tl.sum(s2, 0)):
        t1, t2 = _sum_partials(part_ptr, G, C, cols, cmask, BLOCK_G, BLOCK_C)
        d1 = t1 / M
        var = tl.maximum(t2 / M - d1 * d1, 0.0)
        mean = tl.sum(k, 0) + d1
        invstd = 1.0 / tl.sqrt(var + eps)
        scale = tl.load(w_ptr + cols, mask=cmask, other=1.0) * invstd
        rm = tl.load(rm_ptr + cols, mask=cmask, other=0.0)
        rv = tl.load(rv_ptr + cols, mask=cmask, other=0.0)
        tl.store(rm_ptr + cols, (1.0 - momentum) * rm + momentum * mean, mask=cmask)
        tl.store(rv_ptr + cols, (1.0 - momentum) * rv + momentum * (var * M / tl.maximum(M - 1, 1)), mask=cmask)
        tl.store(save_ptr + cols, mean, mask=cmask)
        tl.store(save_ptr + C + cols, invstd, mask=cmask)
        tl.store(save_ptr + 2 * C + cols, scale, mask=cmask)
        tl.store(save_ptr + 3 * C + cols, tl.load(b_ptr + cols, mask=cmask, other=0.0) - mean * scale, mask=cmask)
        tl.store(tickets_ptr + cb, 0)


@triton.jit
def apply(x_ptr, y_ptr, y2_ptr, save_ptr, M, C, C1, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
          SPLIT: tl.constexpr = False):
    """y = silu(x * scale + shift), over (BLOCK_M, BLOCK_C) tiles: the channels' constants loaded once a tile. With
    SPLIT, channels below C1 go to y (rows of C1) and the rest to y2 (rows of C - C1): the two halves dense."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    mask = (rows < M)[:, None] & cmask[None, :]
    at = rows.to(tl.int64)[:, None] * C + cols[None, :]
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    scale = tl.load(save_ptr + 2 * C + cols, mask=cmask, other=0.0)
    shift = tl.load(save_ptr + 3 * C + cols, mask=cmask, other=0.0)
    z = x * scale[None, :] + shift[None, :]
    y = (z * tl.sigmoid(z)).to(y_ptr.dtype.element_ty)
    if SPLIT:
        first = (cols < C1)[None, :]
        r = rows.to(tl.int64)[:, None]
        tl.store(y_ptr + r * C1 + cols[None, :], y, mask=mask & first)
        tl.store(y2_ptr + r * (C - C1) + (cols - C1)[None, :], y, mask=mask & ~first)
    else:
        tl.store(y_ptr + at, y, mask=mask)


@triton.jit
def _dz(x, dy, scale, shift):
    """d silu(z) / dz * dy at z = x * scale + shift (recomputed from x)."""
    z = x * scale + shift
    s = tl.sigmoid(z)
    return dy * s * (1.0 + z * (1.0 - s))


@triton.jit
def _load_dy(dy_ptr, dy_stride, dy2_ptr, dy2_stride, C1, rows, cols, mask, SPLIT: tl.constexpr):
    """dy's (rows, cols) tile in float32: rows ``dy_stride`` apart; with SPLIT, channels below C1 from dy and the rest
    from dy2 (its rows ``dy2_stride`` apart), the gradients of ``apply``'s two halves."""
    if SPLIT:
        first = (cols < C1)[None, :]
        a = tl.load(dy_ptr + rows[:, None] * dy_stride + cols[None, :], mask=mask & first, other=0.0)
        b = tl.load(dy2_ptr + rows[:, None] * dy2_stride + (cols - C1)[None, :], mask=mask & ~first, other=0.0)
        return tl.where(first, a, b).to(tl.float32)
    return tl.load(dy_ptr + rows[:, None] * dy_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def grad_stats(x_ptr, dy_ptr, dy_stride, dy2_ptr, dy2_stride, C1, save_ptr, part_ptr, tickets_ptr, dw_ptr, db_ptr, M,
               C, rows_per_prog, G, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr,
               UNROLL: tl.constexpr = 1, SPLIT: tl.constexpr = False):
    """Per row group g, per channel: sum(dz) and sum(dz * xhat) into part (G, 2, C) float32. The last program of the
    channel block sums the partials: db, dw (the bias's and the weight's gradients), and save's rows 4 and 5 become
    db / M and dw / M. dy's rows are ``dy_stride`` apart (a channel slice of a wider NHWC tensor); with SPLIT, dy
    is read from two tensors (``_load_dy``)."""
    g = tl.program_id(0)
    cb = tl.program_id(1)
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    mean = tl.load(save_ptr + cols, mask=cmask, other=0.0)[None, :]
    invstd = tl.load(save_ptr + C + cols, mask=cmask, other=0.0)[None, :]
    scale = tl.load(save_ptr + 2 * C + cols, mask=cmask, other=0.0)[None, :]
    shift = tl.load(save_ptr + 3 * C + cols, mask=cmask, other=0.0)[None, :]
    start = g * rows_per_prog
    end = tl.minimum(start + rows_per_prog, M)
    sdz = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)  # per lane: one reduction a program
    sdzx = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)
    for r0 in range(start, end, BLOCK_M * UNROLL):
        for u in tl.static_range(UNROLL):
            rows = (r0 + u * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
            mask = (rows < end)[:, None] & cmask[None, :]
            x = tl.load(x_ptr + rows[:, None] * C + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = _load_dy(dy_ptr, dy_stride, dy2_ptr, dy2_stride, C1, rows, cols, mask, SPLIT)
            dz = _dz(x, dy, scale, shift)
            sdz += dz
            sdzx += dz * (x - mean) * invstd
    if _last_of_block(part_ptr, tickets_ptr, g, cb, C, G, cols, cmask, tl.sum(sdz, 0), tl.sum(sdzx, 0)):
        db, dw = _sum_partials(part_ptr, G, C, cols, cmask, BLOCK_G, BLOCK_C)
        tl.store(dw_ptr + cols, dw, mask=cmask)
        tl.store(db_ptr + cols, db, mask=cmask)
        tl.store(save_ptr + 4 * C + cols, db / M, mask=cmask)
        tl.store(save_ptr + 5 * C + cols, dw / M, mask=cmask)
        tl.store(tickets_ptr + cb, 0)


@triton.jit
def grad_apply(x_ptr, dy_ptr, dy_stride, dy2_ptr, dy2_stride, C1, dx_ptr, save_ptr, M, C, BLOCK_M: tl.constexpr,
               BLOCK_C: tl.constexpr, SPLIT: tl.constexpr = False):
    """dx = scale * (dz - db / M - xhat * dw / M), over (BLOCK_M, BLOCK_C) tiles; dy as ``grad_stats`` reads it."""
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    mask = (rows < M)[:, None] & cmask[None, :]
    x = tl.load(x_ptr + rows[:, None] * C + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dy = _load_dy(dy_ptr, dy_stride, dy2_ptr, dy2_stride, C1, rows, cols, mask, SPLIT)
    mean = tl.load(save_ptr + cols, mask=cmask, other=0.0)[None, :]
    invstd = tl.load(save_ptr + C + cols, mask=cmask, other=0.0)[None, :]
    scale = tl.load(save_ptr + 2 * C + cols, mask=cmask, other=0.0)[None, :]
    dz = _dz(x, dy, scale, tl.load(save_ptr + 3 * C + cols, mask=cmask, other=0.0)[None, :])
    k1 = tl.load(save_ptr + 4 * C + cols, mask=cmask, other=0.0)[None, :]
    k2 = tl.load(save_ptr + 5 * C + cols, mask=cmask, other=0.0)[None, :]
    dx = scale * (dz - k1 - (x - mean) * invstd * k2)
    tl.store(dx_ptr + rows[:, None] * C + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)

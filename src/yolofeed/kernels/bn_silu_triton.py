"""Training batch norm and SiLU as one pass, forward and backward, on an NHWC activation seen as (M, C) rows.

cuDNN's NHWC batch norm and the SiLU after it read and write the activation about 17 times a step between them
(forward and backward); these kernels read it 7 times and write it twice:

- forward: ``stats`` reads x once (per-channel mean and M2 by Chan's merge, one partial per row group), ``finalize``
  merges the partials and updates the running statistics, ``apply`` reads x and writes silu(x * scale + shift);
- backward: ``grad_stats`` reads x and dy (the BN output is recomputed, never stored), ``grad_finalize`` gives the
  weight's and the bias's gradients, ``grad_apply`` reads x and dy again and writes dx.

Every sum is in float32; the activation stays in its own dtype. ``bn_silu.py`` is the torch reference of the same
arithmetic and the autograd Function that picks one.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def stats(x_ptr, part_ptr, M, C, rows_per_prog, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """Per row group g, per channel: mean and M2 of x[g's rows, c]. part: (G, 2, C) float32."""
    g = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    start = g * rows_per_prog
    end = tl.minimum(start + rows_per_prog, M)
    mean = tl.zeros([BLOCK_C], tl.float32)
    m2 = tl.zeros([BLOCK_C], tl.float32)
    for r0 in range(start, end, BLOCK_M):
        n = (r0 - start).to(tl.float32)  # rows merged so far
        rows = r0 + tl.arange(0, BLOCK_M)
        rmask = rows < end
        mask = rmask[:, None] & cmask[None, :]
        x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * C + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        nt = tl.minimum(end - r0, BLOCK_M).to(tl.float32)
        tmean = tl.sum(x, 0) / nt
        d = tl.where(mask, x - tmean[None, :], 0.0)
        tm2 = tl.sum(d * d, 0)
        tot = n + nt
        delta = tmean - mean
        mean += delta * (nt / tot)
        m2 += tm2 + delta * delta * (n * nt / tot)
    base = part_ptr + g * 2 * C + cols
    tl.store(base, mean, mask=cmask)
    tl.store(base + C, m2, mask=cmask)


@triton.jit
def finalize(part_ptr, G, M, C, rows_per_prog, w_ptr, b_ptr, rm_ptr, rv_ptr, save_ptr, momentum, eps,
             BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr):
    """Merge the G partials; update running_mean and running_var (unbiased) in place.

    save: (4, C) float32 rows mean, invstd, scale = w * invstd, shift = b - mean * scale."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    n = tl.zeros([BLOCK_C], tl.float32)
    mean = tl.zeros([BLOCK_C], tl.float32)
    m2 = tl.zeros([BLOCK_C], tl.float32)
    for g0 in range(0, G, BLOCK_G):
        gs = g0 + tl.arange(0, BLOCK_G)
        gmask = gs < G
        mask = gmask[:, None] & cmask[None, :]
        ng = tl.minimum(tl.maximum(M - gs * rows_per_prog, 0), rows_per_prog).to(tl.float32)
        ng = tl.where(gmask, ng, 0.0)
        at = part_ptr + gs[:, None] * 2 * C + cols[None, :]
        pmean = tl.load(at, mask=mask, other=0.0)
        pm2 = tl.load(at + C, mask=mask, other=0.0)
        nb = tl.sum(ng, 0)
        bmean = tl.sum(pmean * ng[:, None], 0) / nb
        d = tl.where(mask, pmean - bmean[None, :], 0.0)
        bm2 = tl.sum(pm2, 0) + tl.sum(d * d * ng[:, None], 0)
        tot = n + nb
        delta = bmean - mean
        mean += delta * (nb / tot)
        m2 += bm2 + delta * delta * (n * nb / tot)
        n = tot
    var = m2 / n
    invstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=cmask, other=1.0)
    b = tl.load(b_ptr + cols, mask=cmask, other=0.0)
    scale = w * invstd
    rm = tl.load(rm_ptr + cols, mask=cmask, other=0.0)
    rv = tl.load(rv_ptr + cols, mask=cmask, other=0.0)
    tl.store(rm_ptr + cols, (1.0 - momentum) * rm + momentum * mean, mask=cmask)
    tl.store(rv_ptr + cols, (1.0 - momentum) * rv + momentum * (m2 / tl.maximum(n - 1.0, 1.0)), mask=cmask)
    tl.store(save_ptr + cols, mean, mask=cmask)
    tl.store(save_ptr + C + cols, invstd, mask=cmask)
    tl.store(save_ptr + 2 * C + cols, scale, mask=cmask)
    tl.store(save_ptr + 3 * C + cols, b - mean * scale, mask=cmask)


@triton.jit
def apply(x_ptr, y_ptr, save_ptr, n_elements, C, BLOCK: tl.constexpr):
    """y = silu(x * scale + shift), elementwise over the flat (M, C) activation."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    c = offs % C
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    z = x * tl.load(save_ptr + 2 * C + c, mask=mask, other=0.0) + tl.load(save_ptr + 3 * C + c, mask=mask, other=0.0)
    y = z / (1.0 + tl.exp(-z))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dz(x, dy, scale, shift):
    """d silu(z) / dz * dy at z = x * scale + shift (recomputed from x)."""
    z = x * scale + shift
    s = 1.0 / (1.0 + tl.exp(-z))
    return dy * s * (1.0 + z * (1.0 - s))


@triton.jit
def grad_stats(x_ptr, dy_ptr, save_ptr, part_ptr, M, C, rows_per_prog, BLOCK_M: tl.constexpr,
               BLOCK_C: tl.constexpr):
    """Per row group g, per channel: sum(dz) and sum(dz * xhat). part: (G, 2, C) float32."""
    g = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    mean = tl.load(save_ptr + cols, mask=cmask, other=0.0)
    invstd = tl.load(save_ptr + C + cols, mask=cmask, other=0.0)
    scale = tl.load(save_ptr + 2 * C + cols, mask=cmask, other=0.0)
    shift = tl.load(save_ptr + 3 * C + cols, mask=cmask, other=0.0)
    start = g * rows_per_prog
    end = tl.minimum(start + rows_per_prog, M)
    sdz = tl.zeros([BLOCK_C], tl.float32)
    sdzx = tl.zeros([BLOCK_C], tl.float32)
    for r0 in range(start, end, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        mask = (rows < end)[:, None] & cmask[None, :]
        at = rows.to(tl.int64)[:, None] * C + cols[None, :]
        x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + at, mask=mask, other=0.0).to(tl.float32)
        dz = _dz(x, dy, scale[None, :], shift[None, :])
        sdz += tl.sum(dz, 0)
        sdzx += tl.sum(dz * (x - mean[None, :]) * invstd[None, :], 0)
    base = part_ptr + g * 2 * C + cols
    tl.store(base, sdz, mask=cmask)
    tl.store(base + C, sdzx, mask=cmask)


@triton.jit
def grad_finalize(part_ptr, G, M, C, save_ptr, dw_ptr, db_ptr, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr):
    """db = sum(dz), dw = sum(dz * xhat) over the partials; save's rows 4 and 5 become db / M and dw / M."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    db = tl.zeros([BLOCK_C], tl.float32)
    dw = tl.zeros([BLOCK_C], tl.float32)
    for g0 in range(0, G, BLOCK_G):
        gs = g0 + tl.arange(0, BLOCK_G)
        mask = (gs < G)[:, None] & cmask[None, :]
        at = part_ptr + gs[:, None] * 2 * C + cols[None, :]
        db += tl.sum(tl.load(at, mask=mask, other=0.0), 0)
        dw += tl.sum(tl.load(at + C, mask=mask, other=0.0), 0)
    tl.store(dw_ptr + cols, dw, mask=cmask)
    tl.store(db_ptr + cols, db, mask=cmask)
    tl.store(save_ptr + 4 * C + cols, db / M, mask=cmask)
    tl.store(save_ptr + 5 * C + cols, dw / M, mask=cmask)


@triton.jit
def grad_apply(x_ptr, dy_ptr, dx_ptr, save_ptr, n_elements, C, BLOCK: tl.constexpr):
    """dx = scale * (dz - db / M - xhat * dw / M), elementwise."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    c = offs % C
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.load(save_ptr + c, mask=mask, other=0.0)
    invstd = tl.load(save_ptr + C + c, mask=mask, other=0.0)
    scale = tl.load(save_ptr + 2 * C + c, mask=mask, other=0.0)
    dz = _dz(x, dy, scale, tl.load(save_ptr + 3 * C + c, mask=mask, other=0.0))
    k1 = tl.load(save_ptr + 4 * C + c, mask=mask, other=0.0)
    k2 = tl.load(save_ptr + 5 * C + c, mask=mask, other=0.0)
    dx = scale * (dz - k1 - (x - mean) * invstd * k2)
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)

"""``augment.geometry.polygons.polygon_boxes`` and the perspective's clip of the moved points, one Triton program per
polygon: the same float32 and float64 arithmetic, bit for bit, in two reads of its points instead of a few hundred
elementwise passes over every polygon of the batch.

Ultralytics' ``segment2box`` of a polygon is the bounds of its part inside the output: where its bounds lie inside,
those bounds; wholly beyond one side, zeros; else the bounds of its points inside, of where its edges (the closing one
too) cross the output's sides within them, and of the output's corners inside it (``inside_polygon``: OpenCV's
crossing count, float64 products). Each of those is a reduction over the polygon's points (a minimum, a maximum, a
count), which any order gives exactly; the elementwise steps round as torch's separate kernels do (IEEE division,
no fused multiply-add: ``enable_fp_fusion=False``). Then each point is clipped to its box and the box and points to
the output (``Instances.clip``), as ``augment.geometry.perspective`` does.

A polygon with a NaN point (a perspective's vanishing line: the divide makes both of its coordinates non-finite)
takes the part path as in torch, and its clipped points keep their NaN (``propagate_nan``). A point with one
coordinate infinite and the other finite, which the divide does not make, can give a crossing at NaN: torch's
bounds are NaN then, these reductions pass over it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 512  # points a chunk: two chunks for Ultralytics' 1,000


@triton.jit
def _bounds(x, y, ok, lo_x, lo_y, hi_x, hi_y, any_ok):
    """The running bounds of the candidates so far with this chunk's ``ok`` ones (x, y) taken."""
    inf = float("inf")
    lo_x = tl.minimum(lo_x, tl.min(tl.where(ok, x, inf), 0))
    lo_y = tl.minimum(lo_y, tl.min(tl.where(ok, y, inf), 0))
    hi_x = tl.maximum(hi_x, tl.max(tl.where(ok, x, -inf), 0))
    hi_y = tl.maximum(hi_y, tl.max(tl.where(ok, y, -inf), 0))
    return lo_x, lo_y, hi_x, hi_y, any_ok | (tl.sum(ok.to(tl.int32), 0) > 0)


@triton.jit
def _side(x, y, dx, dy, bound, lim, X_SIDE: tl.constexpr, m, lo_x, lo_y, hi_x, hi_y, any_ok):
    """Where each edge crosses the side x = bound (``X_SIDE``) or y = bound, within [0, lim] along it."""
    if X_SIDE:
        t = tl.div_rn(bound - x, dx)  # 0 / 0 and c / 0 fail the test below, as numpy's nan and inf
    else:
        t = tl.div_rn(bound - y, dy)
    ix = x + t * dx
    iy = y + t * dy
    if X_SIDE:
        on = iy
    else:
        on = ix
    ok = m & (t >= 0) & (t <= 1) & (on >= 0) & (on <= lim)
    return _bounds(ix, iy, ok, lo_x, lo_y, hi_x, hi_y, any_ok)


@triton.jit
def _corner(vx, vy, ux, uy, px, py, m):
    """``inside_polygon``'s terms at the point (px, py) for the edges u -> v of this chunk: whether one has the point
    on it, and how many cross the ray."""
    skip = ((uy <= py) & (vy <= py)) | ((uy > py) & (vy > py)) | ((ux < px) & (vx < px))
    on_point = skip & (vy == py) & ((vx == px) | ((uy == py) & (((ux <= px) & (px <= vx)) | ((vx <= px) & (px <= ux)))))
    dist = ((py - uy).to(tl.float64) * (vx - ux).to(tl.float64)
            - (px - ux).to(tl.float64) * (vy - uy).to(tl.float64))
    on_edge = ~skip & (dist == 0)
    crosses = ~skip & (tl.where(vy < uy, -dist, dist) > 0)
    on = tl.sum((m & (on_point | on_edge)).to(tl.int32), 0) > 0
    return on, tl.sum((m & crosses).to(tl.int32), 0)


@triton.jit
def _clip(x, lo, hi):
    """min(max(x, lo), hi), a NaN kept (torch's maximum, minimum and clamp)."""
    return tl.minimum(tl.maximum(x, lo, propagate_nan=tl.PropagateNan.ALL), hi, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def polygon_boxes_kernel(seg_ptr, box_ptr, out_ptr, W, w, h, BLOCK: tl.constexpr):
    """Polygon c = program_id(0) of seg (C, W, 2): its box (segment2box, then clipped to [0, w] x [0, h]) into
    box (C, 4), its points clipped to the box and then to the output into out (C, W, 2)."""
    c = tl.program_id(0).to(tl.int64)
    base = seg_ptr + c * W * 2
    inf = float("inf")
    fw = w.to(tl.float32)
    fh = h.to(tl.float32)
    lo_x = inf
    lo_y = inf
    hi_x = -inf
    hi_y = -inf
    nan = False
    p_lo_x = inf
    p_lo_y = inf
    p_hi_x = -inf
    p_hi_y = -inf
    any_ok = False
    on0 = False
    on1 = False
    on2 = False
    on3 = False
    n0 = 0
    n1 = 0
    n2 = 0
    n3 = 0
    for start in range(0, W, BLOCK):
        i = start + tl.arange(0, BLOCK)
        m = i < W
        nxt = tl.where(i + 1 < W, i + 1, 0)  # each point's edge to the next, the last to the first
        prv = tl.where(i == 0, W - 1, i - 1)  # and from the previous, the last for the first (inside_polygon)
        x = tl.load(base + 2 * i, mask=m, other=0.0)
        y = tl.load(base + 2 * i + 1, mask=m, other=0.0)
        xn = tl.load(base + 2 * nxt, mask=m, other=0.0)
        yn = tl.load(base + 2 * nxt + 1, mask=m, other=0.0)
        xp = tl.load(base + 2 * prv, mask=m, other=0.0)
        yp = tl.load(base + 2 * prv + 1, mask=m, other=0.0)
        nan = nan | (tl.sum((m & ((x != x) | (y != y))).to(tl.int32), 0) > 0)
        lo_x, lo_y, hi_x, hi_y, _ = _bounds(x, y, m, lo_x, lo_y, hi_x, hi_y, False)
        p_lo_x, p_lo_y, p_hi_x, p_hi_y, any_ok = _bounds(x, y, m & (x >= 0) & (y >= 0) & (x <= fw) & (y <= fh),
                                                         p_lo_x, p_lo_y, p_hi_x, p_hi_y, any_ok)  # its points inside
        dx = xn - x
        dy = yn - y
        p_lo_x, p_lo_y, p_hi_x, p_hi_y, any_ok = _side(x, y, dx, dy, 0.0, fh, True, m, p_lo_x, p_lo_y, p_hi_x, p_hi_y,
                                                       any_ok)
        p_lo_x, p_lo_y, p_hi_x, p_hi_y, any_ok = _side(x, y, dx, dy, fw, fh, True, m, p_lo_x, p_lo_y, p_hi_x, p_hi_y,
                                                       any_ok)
        p_lo_x, p_lo_y, p_hi_x, p_hi_y, any_ok = _side(x, y, dx, dy, 0.0, fw, False, m, p_lo_x, p_lo_y, p_hi_x,
                                                       p_hi_y, any_ok)
        p_lo_x, p_lo_y, p_hi_x, p_hi_y, any_ok = _side(x, y, dx, dy, fh, fw, False, m, p_lo_x, p_lo_y, p_hi_x,
                                                       p_hi_y, any_ok)
        a, k = _corner(x, y, xp, yp, 0.0, 0.0, m)
        on0, n0 = on0 | a, n0 + k
        a, k = _corner(x, y, xp, yp, fw, 0.0, m)
        on1, n1 = on1 | a, n1 + k
        a, k = _corner(x, y, xp, yp, 0.0, fh, m)
        on2, n2 = on2 | a, n2 + k
        a, k = _corner(x, y, xp, yp, fw, fh, m)
        on3, n3 = on3 | a, n3 + k
    # the output's corners inside the polygon, in inside_polygon's order: (0, 0), (w, 0), (0, h), (w, h)
    c0 = on0 | (n0 % 2 == 1)
    c1 = on1 | (n1 % 2 == 1)
    c2 = on2 | (n2 % 2 == 1)
    c3 = on3 | (n3 % 2 == 1)
    p_lo_x = tl.minimum(p_lo_x, tl.where(c0 | c2, 0.0, tl.where(c1 | c3, fw, inf)))
    p_hi_x = tl.maximum(p_hi_x, tl.where(c1 | c3, fw, tl.where(c0 | c2, 0.0, -inf)))
    p_lo_y = tl.minimum(p_lo_y, tl.where(c0 | c1, 0.0, tl.where(c2 | c3, fh, inf)))
    p_hi_y = tl.maximum(p_hi_y, tl.where(c2 | c3, fh, tl.where(c0 | c1, 0.0, -inf)))
    any_ok = any_ok | c0 | c1 | c2 | c3
    inside = ~nan & (lo_x >= 0) & (lo_y >= 0) & (hi_x <= fw) & (hi_y <= fh)
    outside = ~nan & ((hi_x < 0) | (hi_y < 0) | (lo_x > fw) | (lo_y > fh))
    b0 = tl.where(inside, lo_x, tl.where(outside | ~any_ok, 0.0, p_lo_x))
    b1 = tl.where(inside, lo_y, tl.where(outside | ~any_ok, 0.0, p_lo_y))
    b2 = tl.where(inside, hi_x, tl.where(outside | ~any_ok, 0.0, p_hi_x))
    b3 = tl.where(inside, hi_y, tl.where(outside | ~any_ok, 0.0, p_hi_y))
    out = out_ptr + c * W * 2
    for start in range(0, W, BLOCK):
        i = start + tl.arange(0, BLOCK)
        m = i < W
        x = tl.load(base + 2 * i, mask=m, other=0.0)
        y = tl.load(base + 2 * i + 1, mask=m, other=0.0)
        x = _clip(x, b0, b2)  # np.clip(x, x1, x2)
        y = _clip(y, b1, b3)
        tl.store(out + 2 * i, _clip(x, 0.0, fw), mask=m)  # Instances.clip
        tl.store(out + 2 * i + 1, _clip(y, 0.0, fh), mask=m)
    box = box_ptr + c * 4
    tl.store(box, tl.minimum(tl.maximum(b0, 0.0), fw))  # boxes.clamp(0, size); the reductions gave no NaN
    tl.store(box + 1, tl.minimum(tl.maximum(b1, 0.0), fh))
    tl.store(box + 2, tl.minimum(tl.maximum(b2, 0.0), fw))
    tl.store(box + 3, tl.minimum(tl.maximum(b3, 0.0), fh))


def boxes_and_clip(seg: Tensor, w: int, h: int) -> tuple[Tensor, Tensor]:
    """Each polygon's ``segment2box`` clipped to the output, and its points clipped to that box and the output.

    Shape: seg (..., W, 2) float32 pixels (CUDA, or CPU under TRITON_INTERPRET=1). Returns (..., 4), (..., W, 2).
    """
    lead, points = seg.shape[:-2], seg.shape[-2]
    flat = seg.reshape(-1, points, 2).contiguous()
    n = flat.shape[0]
    boxes = torch.empty((n, 4), dtype=seg.dtype, device=seg.device)
    out = torch.empty_like(flat)
    if n:
        polygon_boxes_kernel[(n,)](flat, boxes, out, points, w, h, BLOCK=BLOCK, num_warps=4, enable_fp_fusion=False)
    return boxes.view(*lead, 4), out.view(*lead, points, 2)

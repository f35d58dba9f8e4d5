"""OpenCV's ``fillPoly`` of one polygon per mask, then ``cv2.resize`` down by an integer ratio, batched: the torch
reference of the segment task's masks (Ultralytics' ``polygon2mask``).

What OpenCV does (``imgproc/src/drawing.cpp``, ``fillPoly`` with ``LINE_8`` and ``shift=0``, points as int32):

* ``CollectPolyEdges`` draws every edge, vertex i-1 to vertex i, as an 8-connected Bresenham line (``Line``):
  ``clipLine`` first where an end lies outside the image (integer divisions, the first end moved before the second
  is), then from the left end, ``count = max(|dx|, |dy|) + 1`` pixels, the minor step after pixel k taken where
  ``err = a - 2b(k + 1) + 2a m < 0``: pixel k sits ``m_k = floor((2bk + a - 1) / 2a)`` minor steps away.
* ``FillEdgeCollection`` fills by scanlines: each non-horizontal edge is active on rows [y0, y1) (its upper end
  inclusive, its lower end not); its x at row y is ``X0 + (y - y0) * dx`` in 16.16 fixed point, ``X0`` the upper
  end's x and ``dx = trunc((x1 - x0) << 16 / (y1 - y0))``; the active edges, sorted by x, pair up (even-odd) and
  each pair (xa, xb) paints the pixels ``ceil(xa) .. floor(xb)``.

Pixel by pixel that fill is: px is painted where an odd number of the row's crossings lie left of px << 16, or one
lies exactly on it. So each crossing adds one to a parity histogram at the first column right of it, each line's run
of pixels on a row (and each crossing exactly on a pixel) adds a covered span, and one prefix sum along the row
gives both: painted = odd parity or covered.

``cv2.resize`` (INTER_LINEAR, uint8) by an integer ratio r reads few of those pixels: source x = r (dx + 0.5) - 0.5
lands half-way between pixels r dx + r/2 - 1 and r dx + r/2 for an even r (a 0/1 mask becomes 1 where 2 or more of
those 2 x 2 pixels are set: the fixed-point mean of 0.5 rounds up), on pixel r dx + (r - 1) / 2 for an odd r (r = 1
is the mask itself). So only those rows and columns are rasterised (``sampled``): a quarter of the pixels at r = 4.

The work is one event per (edge, sampled row it covers), for its line and for its fill crossing, laid out flat by a
prefix sum of the per-edge counts (``searchsorted`` maps each event slot to its edge: no loop over polygons, no host
sync). The slots are a fixed number, ``events`` per polygon pooled over a chunk of polygons: a chunk whose polygons
need more drops the rest and counts them in ``overflow`` (a device tensor the caller checks when it reads it).
What costs time: the prefix sum along each sampled row of each polygon of the chunk and the passes around it
(``chunk * rows * (cols + 1)`` int32, ~0.4 MB a polygon at 640 px and r = 4, the same for a tiny polygon as for a
large one: 80 % of the CPU time), then the scatter of the events into it; the events themselves are few (about
the polygon's sampled height twice, plus one per edge touching a sampled row).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

XY_SHIFT = 16  # OpenCV's fixed point for the fill's x
COVER_SHIFT = 16  # the histogram holds parity counts below this bit and covered-span counts above it
PAINTED_BITS = ~((1 << COVER_SHIFT) - 2)  # the parity bit and the cover count's bits


def sampled(size: int, ratio: int, device: torch.device | None = None) -> Tensor:
    """The full-resolution rows (or columns) ``cv2.resize`` reads going from ``size`` to ``size // ratio``,
    ascending: 2 per output pixel for an even ratio, 1 for an odd one. (``size`` a multiple of ``ratio``.)"""
    base = torch.arange(size // ratio, device=device, dtype=torch.int64)[:, None] * ratio
    # made on the device (no copy from host memory, which a CUDA graph cannot capture)
    offsets = torch.arange(2, device=device) + ratio // 2 - 1 if ratio % 2 == 0 else torch.arange(1, device=device) + (
        ratio - 1) // 2
    return (base + offsets).flatten()


def downsample(painted: Tensor, ratio: int) -> Tensor:
    """``cv2.resize`` of 0/1 masks from their sampled pixels (``sampled`` rows and columns) to ``size // ratio``.

    Shape: painted (..., R, C) bool -> (..., R // 2, C // 2) for an even ratio, the same for an odd one; uint8.
    """
    if ratio % 2:
        return painted.to(torch.uint8)
    a, b = painted[..., 0::2, 0::2], painted[..., 0::2, 1::2]
    c, d = painted[..., 1::2, 0::2], painted[..., 1::2, 1::2]
    # 2 or more of 4: boolean ops on quarter-size views (a reduction over a reshape was the slower pass)
    return ((a & b) | (c & d) | ((a | b) & (c | d))).to(torch.uint8)


def _cdiv_trunc(a: Tensor, b: Tensor) -> Tensor:
    """C's integer division (toward zero); b = 0 (in lanes whose result is not used) gives 0."""
    return torch.div(a, torch.where(b == 0, torch.ones_like(b), b), rounding_mode="trunc")


def clip_line(x1: Tensor, y1: Tensor, x2: Tensor, y2: Tensor, width: int, height: int):
    """OpenCV's ``clipLine(Size, pt1, pt2)`` elementwise (int64): whether any of the segment is inside, and its ends
    clipped as OpenCV clips them (y first, then x; the second end's slope from the first end already moved)."""
    right, bottom = width - 1, height - 1

    def code(x, y, with_y=True):
        c = (x < 0).long() + (x > right).long() * 2
        return c + (y < 0).long() * 4 + (y > bottom).long() * 8 if with_y else c

    c1, c2 = code(x1, y1), code(x2, y2)
    go = ((c1 & c2) == 0) & ((c1 | c2) != 0)
    clip1 = go & ((c1 & 12) != 0)
    a = torch.where(c1 < 8, 0, bottom)
    x1 = torch.where(clip1, x1 + _cdiv_trunc((a - y1) * (x2 - x1), y2 - y1), x1)
    y1 = torch.where(clip1, a, y1)
    c1 = torch.where(clip1, code(x1, y1, False), c1)
    clip2 = go & ((c2 & 12) != 0)
    a = torch.where(c2 < 8, 0, bottom)
    x2 = torch.where(clip2, x2 + _cdiv_trunc((a - y2) * (x2 - x1), y2 - y1), x2)
    y2 = torch.where(clip2, a, y2)
    c2 = torch.where(clip2, code(x2, y2, False), c2)
    go = go & ((c1 & c2) == 0) & ((c1 | c2) != 0)
    clip1 = go & (c1 != 0)
    a = torch.where(c1 == 1, 0, right)
    y1 = torch.where(clip1, y1 + _cdiv_trunc((a - x1) * (y2 - y1), x2 - x1), y1)
    x1 = torch.where(clip1, a, x1)
    c1 = torch.where(clip1, 0, c1)
    clip2 = go & (c2 != 0)
    a = torch.where(c2 == 1, 0, right)
    y2 = torch.where(clip2, y2 + _cdiv_trunc((a - x2) * (y2 - y1), x2 - x1), y2)
    x2 = torch.where(clip2, a, x2)
    c2 = torch.where(clip2, 0, c2)
    return (c1 | c2) == 0, x1, y1, x2, y2


def _clipped(x1: Tensor, y1: Tensor, x2: Tensor, y2: Tensor, width: int, height: int):
    """Each edge's ends as ``Line`` and ``CollectPolyEdges`` use them: clipped by ``clip_line`` where an end lies
    outside the image (kept as clipped even where nothing is inside). Returns (outside, drawn, (x1, y1, x2, y2))."""
    outside = (x1 < 0) | (x1 >= width) | (y1 < 0) | (y1 >= height) | (x2 < 0) | (x2 >= width) | (y2 < 0) | (
        y2 >= height)
    inside, cx1, cy1, cx2, cy2 = clip_line(x1, y1, x2, y2, width, height)
    ends = tuple(torch.where(outside, c, v) for c, v in ((cx1, x1), (cy1, y1), (cx2, x2), (cy2, y2)))
    return outside, ~outside | inside, ends


def _ceil_div(p: Tensor, q: Tensor) -> Tensor:
    """ceil(p / q) for q > 0 (q = 0 in unused lanes gives a value never read)."""
    return -torch.div(-p, q.clamp(min=1), rounding_mode="floor")


def _line_run(j: Tensor, xs: Tensor, dx: Tensor, ady: Tensor) -> tuple[Tensor, Tensor]:
    """The x run (first, last) a Bresenham line paints on its row j steps from its left end's row (0 <= j <= |dy|)."""
    steep = ady > dx
    a, b = torch.maximum(dx, ady), torch.minimum(dx, ady)
    # steep: one pixel, m_j = floor((2bj + a - 1) / 2a) right of the left end
    x_steep = xs + torch.div(2 * b * j + a - 1, (2 * a).clamp(min=1), rounding_mode="floor")
    # shallow: pixels k with m_k = j, k from ceil((2aj - a + 1) / 2b) to the next row's first - 1, within 0 .. a
    lo = _ceil_div(2 * a * j - a + 1, 2 * b).clamp(min=0)
    hi = torch.minimum(_ceil_div(2 * a * (j + 1) - a + 1, 2 * b) - 1, a)
    lo, hi = torch.where(b == 0, 0, lo), torch.where(b == 0, a, hi)
    return torch.where(steep, x_steep, xs + lo), torch.where(steep, x_steep, xs + hi)


def default_events(points: int, height: int, ratio: int) -> int:
    """``fill_polygons``' event slots per polygon by default: ``points + 4 * sampled rows``."""
    return points + 4 * len(sampled(height, ratio))


def fill_polygons(points: Tensor, valid: Tensor, height: int, width: int, ratio: int = 1, chunk: int = 128,
                  events: int | None = None) -> tuple[Tensor, Tensor]:
    """``cv2.resize(cv2.fillPoly(zeros, [points.astype(int32)], 1), (width // ratio, height // ratio))`` for each
    polygon.

    Args:
        points: (P, n, 2) float pixel x, y; truncated toward zero as NumPy's int32 cast does.
        valid: (P,) bool; an invalid polygon gives an empty mask.
        height, width: the image's size, multiples of ``ratio``.
        ratio: the downsampling ratio (Ultralytics' ``mask_ratio``), 1 or more.
        chunk: polygons rasterised at once; memory grows with it (the module docstring says how much).
        events: event slots per polygon, pooled over the chunk (default ``n + 4 * sampled rows``, about twice what
            a polygon as tall as the image with a wavy outline needs).

    Returns:
        masks (P, height // ratio, width // ratio) uint8 0/1, and overflow: () int64, the events dropped for want of
        slots (0: every mask exact).
    """
    p, n, _ = points.shape
    dev = points.device
    rows, cols = sampled(height, ratio, dev), sampled(width, ratio, dev)
    per = events if events is not None else default_events(n, height, ratio)
    out = torch.zeros((p, height // ratio, width // ratio), dtype=torch.uint8, device=dev)
    overflow = torch.zeros((), dtype=torch.int64, device=dev)
    for s in range(0, p, chunk):
        pts = points[s:s + chunk].to(torch.int32).long()  # NumPy's float -> int32: toward zero
        c = len(pts)
        masks, dropped = _fill_chunk(pts, valid[s:s + chunk], rows, cols, height, width, c * per)
        out[s:s + c] = downsample(masks, ratio)
        overflow += dropped
    return out, overflow


def _fill_chunk(pts: Tensor, valid: Tensor, rows: Tensor, cols: Tensor, height: int, width: int,
                capacity: int) -> tuple[Tensor, Tensor]:
    """The painted sampled pixels (C, rows, cols) bool of a chunk of polygons (C, n, 2) int64, and the events
    dropped."""
    c = pts.shape[0]
    nr, nc = len(rows), len(cols)
    ev = _events(pts, valid, rows, height, width, capacity)
    base = (ev.poly * nr + ev.row) * (nc + 1)
    cover_lo = base + torch.searchsorted(cols, ev.lo)
    cover_hi = base + torch.searchsorted(cols, ev.hi, right=True)
    parity = base + torch.searchsorted(cols, ev.xpix + 1)
    one = torch.ones_like(ev.slot, dtype=torch.int32)
    size = c * nr * (nc + 1)
    # the unused slots (most of them where few polygons are real) add their zeros across the histogram, one cell
    # each: sent to one cell, their atomic adds would serialise on a GPU
    spread = ev.slot % size
    ok = ev.ok
    index = torch.cat([torch.where(ok, parity, spread), torch.where(ok, cover_lo, spread),
                       torch.where(ok, cover_hi, spread)])
    value = torch.cat([ev.flips * one, (ev.covers * one) << COVER_SHIFT, -((ev.covers * one) << COVER_SHIFT)])
    hist = torch.zeros(size, dtype=torch.int32, device=pts.device)
    hist.scatter_add_(0, index, value)
    acc = hist.view(c, nr, nc + 1).cumsum(-1, dtype=torch.int32)[..., :nc]
    # odd parity or any cover: every bit but the parity count's upper ones (one pass, not four)
    painted = (acc & PAINTED_BITS) != 0
    return painted, ev.dropped


@dataclass
class _Events:
    """A chunk's rasterisation events, one per slot (``ok``: a real one): on sampled row ``row`` of polygon ``poly``,
    a fill crossing (``flips``) at 16.16 x ``xf`` (``xpix`` its pixel), or a covered span of pixels ``lo .. hi`` (a
    line's run, or a crossing exactly on a pixel: ``covers``)."""

    slot: Tensor
    ok: Tensor
    poly: Tensor
    row: Tensor
    xf: Tensor
    xpix: Tensor
    lo: Tensor
    hi: Tensor
    flips: Tensor
    covers: Tensor
    dropped: Tensor


def _events(pts: Tensor, valid: Tensor, rows: Tensor, height: int | Tensor, width: int | Tensor,
            capacity: int) -> _Events:
    """The events of a chunk of polygons (C, n, 2) int64 in ``capacity`` slots (the module's doc). ``height`` and
    ``width``: the image's, or (C, 1) tensors, each polygon's own (its clip)."""
    c, n, _ = pts.shape
    dev = pts.device
    nr = len(rows)
    x1, y1 = pts.roll(1, 1).unbind(-1)  # edge i runs from vertex i - 1 ...
    x2, y2 = pts.unbind(-1)  # ... to vertex i
    live = valid[:, None].expand(c, n)

    # the lines: rows min(y) .. max(y) of the clipped ends, every edge (horizontal ones too)
    outside, drawn, (cx1, cy1, cx2, cy2) = _clipped(x1, y1, x2, y2, width, height)
    swap = cx2 < cx1  # Line draws from the left end
    xs, ys = torch.where(swap, cx2, cx1), torch.where(swap, cy2, cy1)
    dx, dy = (cx2 - cx1).abs(), torch.where(swap, cy1 - cy2, cy2 - cy1)
    ly0, ly1 = torch.minimum(ys, ys + dy), torch.maximum(ys, ys + dy)
    l_first = torch.searchsorted(rows, ly0)
    l_count = torch.where(live & drawn, torch.searchsorted(rows, ly1, right=True) - l_first, 0)

    # the fill's edges: rows [y0, y1) of the non-horizontal ones, x in 16.16 along the clipped line (where an end
    # was clipped, its clipped y too unless the clipped line is horizontal), from the upper end's clipped point
    keep_y = outside & (cy1 != cy2)
    ay1, ay2 = torch.where(keep_y, cy1, y1), torch.where(keep_y, cy2, y2)
    fdx = _cdiv_trunc((cx2 - cx1) << XY_SHIFT, ay2 - ay1)
    down = y1 < y2
    fy0, fy1 = torch.minimum(y1, y2), torch.maximum(y1, y2)
    anchor_x = torch.where(down, cx1, cx2) << XY_SHIFT
    anchor_y = torch.where(down, ay1, ay2)
    f_first = torch.searchsorted(rows, fy0)  # first sampled row at or below y0
    f_count = torch.where(live & (y1 != y2), torch.searchsorted(rows, fy1) - f_first, 0)

    # one slot per event: generator g = (polygon, edge, kind) in order, its events consecutive
    counts = torch.stack([f_count, l_count], -1).flatten()  # (C * n * 2,)
    ends = counts.cumsum(0)
    total = ends[-1]
    slot = torch.arange(capacity, device=dev)
    gen = torch.searchsorted(ends, slot, right=True).clamp(max=len(counts) - 1)
    ok = slot < total
    t = slot - (ends[gen] - counts[gen])  # the event's index among its generator's
    poly, is_line = gen // (2 * n), (gen % 2) == 1

    def at(x: Tensor) -> Tensor:  # a per-edge value at each event
        return x.flatten()[gen // 2]

    row = (torch.where(is_line, at(l_first), at(f_first)) + t).clamp(max=nr - 1)
    y = rows[row]
    # fill crossing: parity at the first column right of it; exactly on a pixel, that pixel is covered too
    xf = at(anchor_x) + (y - at(anchor_y)) * at(fdx)
    xpix = xf >> XY_SHIFT
    exact = (xf & ((1 << XY_SHIFT) - 1)) == 0
    # line run on this row
    ady = at(dy).abs()
    j = torch.where(at(dy) < 0, at(ys) - y, y - at(ys))
    run_lo, run_hi = _line_run(j, at(xs), at(dx), ady)
    lo = torch.where(is_line, run_lo, xpix)
    hi = torch.where(is_line, run_hi, xpix)
    return _Events(slot, ok, poly, row, xf, xpix, lo, hi, flips=ok & ~is_line, covers=ok & (is_line | exact),
                   dropped=(total - capacity).clamp(min=0))


UNION_CHUNK = 512  # fill_union's polygons at once: ~0.4 GB of events at 1,000 points on a 1280-pixel canvas


def fill_union(points: Tensor, valid: Tensor, owner: Tensor, images: int, height: int, width: int,
               clip: Tensor | None = None, events: int | None = None,
               chunk: int = UNION_CHUNK) -> tuple[Tensor, Tensor]:
    """The union of ``cv2.fillPoly`` (``drawContours(..., FILLED)``) of each polygon, per image: Ultralytics'
    copy-paste mask, the polygons ``owner`` says, filled one by one into one 0/1 image each.

    Each polygon's fill is the module's, made of the same events, but its parity is turned into spans: the crossings
    of one polygon on one row, sorted by x, pair up left to right (even-odd), each pair a span of pixels; spans and
    covered runs of every polygon of an image add +1 where they start and -1 past where they end in one histogram a
    row, whose prefix sum is how many cover each pixel. So the working set is the images' (``images x height x
    (width + 1)`` int32, twice: the histogram and its prefix sum), not a histogram per polygon, plus a chunk of
    polygons' events and their two stable sorts. Nothing is painted past a polygon's own image (``clip``), rows
    included.

    Args:
        points: (P, n, 2) float pixel x, y, truncated toward zero as NumPy's int32 cast does.
        valid: (P,) bool; an invalid polygon paints nothing.
        owner: (P,) int64, the image each polygon paints, in [0, images).
        height, width: the images' size (the largest, where they differ).
        clip: (P, 2) int64 height and width each polygon is clipped to (its image's own size), or None: the size.
        events: event slots per polygon, pooled over a chunk (``default_events`` by default).
        chunk: polygons whose events are made at once; their working set grows with it (about 0.8 MB a polygon of
            1,000 points on a 1280-pixel canvas).

    Returns:
        masks (images, height, width) bool, and overflow: () int64, the events dropped for want of slots.
    """
    p, n, _ = points.shape
    dev = points.device
    size = images * height * (width + 1)
    hist = torch.zeros(size, dtype=torch.int32, device=dev)
    dropped = torch.zeros((), dtype=torch.int64, device=dev)
    per = events if events is not None else default_events(n, height, 1)
    for s in range(0, p, chunk):  # a fixed loop: the events' working set is a chunk's, the histogram is shared
        e = min(p, s + chunk)
        dropped += _union_chunk(hist, points[s:e], valid[s:e], owner[s:e], height, width,
                                None if clip is None else clip[s:e], max(1, (e - s) * per))
    masks = hist.view(images, height, width + 1).cumsum(-1, dtype=torch.int32)[..., :width] > 0
    return masks, dropped


def _union_chunk(hist: Tensor, points: Tensor, valid: Tensor, owner: Tensor, height: int, width: int,
                 clip: Tensor | None, capacity: int) -> Tensor:
    """Add a chunk of polygons' spans to ``fill_union``'s histogram; returns the events dropped."""
    p, dev = len(points), points.device
    rows = torch.arange(height, device=dev)
    hc, wc = (height, width) if clip is None else (clip[:, 0:1].long(), clip[:, 1:2].long())
    ev = _events(points.to(torch.int32).long(), valid, rows, hc, wc, capacity)
    # an event on a row past its own image's height paints nothing (cv2 fills within the image); a row's crossings
    # go together, so the pairs below stay whole
    inside = ev.row < (height if clip is None else clip[:, 0].long()[ev.poly])
    flips, covers = ev.flips & inside, ev.covers & inside
    base = (owner[ev.poly] * height + ev.row) * (width + 1)
    # each crossing's rank among its polygon's on its row, by x: +1 for the left of a pair, -1 for the right. Two
    # stable sorts, x then (polygon, row), order them without a combined key (which would overflow int64 at
    # P x height >= 2**28); the slots that are not crossings sort last
    group = torch.where(flips, ev.poly * height + ev.row, torch.full_like(ev.poly, p * height))
    by_x = torch.sort(ev.xf, stable=True).indices
    order = by_x[torch.sort(group[by_x], stable=True).indices]
    sorted_group = group[order]
    first = torch.searchsorted(sorted_group, sorted_group)
    rank = torch.arange(len(order), device=dev) - first
    sign = torch.empty_like(rank)
    sign[order] = 1 - 2 * (rank % 2)
    spread = ev.slot % len(hist)  # unused slots add zeros across the histogram (see _fill_chunk)
    right = width if clip is None else clip[:, 1].long()[ev.poly]  # spans end at the polygon's own image's edge

    def at(x: Tensor) -> Tensor:  # a histogram cell of this row, 0 .. the edge (no host-to-device copy)
        return base + (x.clamp(0, right) if isinstance(right, int) else torch.minimum(x.clamp(min=0), right))

    index = torch.cat([torch.where(flips, at(ev.xpix + 1), spread), torch.where(covers, at(ev.lo), spread),
                       torch.where(covers, at(ev.hi + 1), spread)])
    one = torch.ones_like(ev.slot, dtype=torch.int32)
    value = torch.cat([flips * sign.to(torch.int32), covers * one, -(covers * one)])
    hist.scatter_add_(0, index, value)
    return ev.dropped

"""Segmentation polygons as Ultralytics resamples them before any op: each to the same number of points.

``YOLODataset.update_labels_info`` resamples every polygon of an image to ``n`` points (``resample_segments``):
1,000, or one more than the image's longest polygon where that is longer. A polygon of L points is closed (its first
point again, m = L + 1 points); where m < n, ``np.linspace(0, L, n - m)`` positions along it with the m vertex
positions 0 .. L inserted before equal values (so every vertex is kept); else ``np.linspace(0, L, n)``. Each position
x is then ``np.interp``'d between vertices floor(x) and floor(x) + 1: ``(b - a) * (x - j) + a`` in float64, two
roundings (numpy fuses nothing), the last position exactly the closing point; float32 at the end. A polygon of n points
is left as it is.

Here every polygon of a batch at once, padded: the positions of each row are its linspace values and vertex positions
sorted together (a stable sort, the vertices first among equals), as the insertion orders them. No loop over
polygons and no host sync; the per-row lengths stay on the device.
"""

from __future__ import annotations

import torch
from torch import Tensor

POINTS = 1000  # Ultralytics' segment_resamples for segmentation (update_labels_info)


def resample_polygons(points: Tensor, lengths: Tensor, n: int | Tensor = POINTS, width: int | None = None) -> Tensor:
    """Ultralytics' ``resample_segments(segments, n)`` of padded polygons, bit for bit.

    Args:
        points: (R, P, 2) float32 x, y, row r's first ``lengths[r]`` points its polygon, the rest padding (ignored).
        lengths: (R,) int64 points of each polygon, 1 to P (Ultralytics' labels have 3 or more).
        n: the points each polygon is resampled to (``POINTS``, or more where the image's longest polygon is longer):
            one number, or (R,) int64 a row (images of a batch may differ, ``image_points``).
        width: the points a row of the result holds, at least every ``n``; default ``n`` (a number).

    Returns:
        (R, width, 2) float32: row r's n[r] points, then its last point again up to ``width`` (the same closed
        polygon, so the same mask). A row of exactly n points is returned as it is.
    """
    r, p, _ = points.shape
    dev = points.device
    width = n if width is None else width
    if r == 0:
        return points.new_zeros((0, width, 2))
    length = lengths.to(dev, torch.int64)
    m = length + 1  # the closed polygon's points
    closed = torch.cat([points, points.new_zeros((r, 1, 2))], 1).double()
    closed.scatter_(1, length[:, None, None].expand(r, 1, 2), points[:, :1].double())  # the first point again, at L
    inserts = m < n  # rows whose vertex positions are inserted among fewer linspace positions
    count = torch.where(inserts, n - m, torch.full_like(m, n) if isinstance(n, int) else n)  # linspace's num
    k = torch.arange(width, dtype=torch.float64, device=dev)[None]  # (1, width)
    last = (count - 1).double()[:, None]
    span = length.double()[:, None]
    # np.linspace(0, L, num): k * (L / (num - 1)), the end set to L exactly (num = 1: just 0, a polygon of n - 2
    # points); positions past num are padding
    lin = torch.where((k == last) & (last > 0), span, k * (span / last.clamp(min=1)))
    lin = torch.where(k < count[:, None], lin, torch.full_like(lin, torch.inf))
    j = torch.arange(p + 1, dtype=torch.float64, device=dev)[None].expand(r, -1)  # vertex positions 0 .. P
    vertex = torch.where((j <= span) & inserts[:, None], j, torch.full_like(j, torch.inf))
    x = torch.cat([vertex, lin], 1).sort(dim=1, stable=True).values[:, :width]  # vertices first among equal values
    lo = x.floor().clamp(max=(span - 1).clamp(min=0)).long()  # the vertex at or before x; the last edge for x = L
    a = closed.gather(1, lo[..., None].expand(-1, -1, 2))
    b = closed.gather(1, (lo + 1).clamp(max=p)[..., None].expand(-1, -1, 2))
    t = (x - lo.double())[..., None]
    out = (b - a) * t + a  # two kernels, as numpy rounds: no fused multiply-add
    end = closed.gather(1, length[:, None, None].expand(r, 1, 2))  # np.interp gives fp[-1] itself at x = xp[-1]
    out = torch.where((x == span)[..., None], end, out).float()
    if isinstance(n, int) and width == n:
        if p >= n:  # a polygon of exactly n points is kept as it is
            out = torch.where((length == n)[:, None, None], points[:, :n], out)
        return out
    kept = points[:, :width] if p >= width else torch.cat([points, points.new_zeros((r, width - p, 2))], 1)
    out = torch.where((length == n)[:, None, None], kept, out)
    real = n.expand(r) if isinstance(n, Tensor) else torch.full((r,), n, device=dev)  # past them, its last point
    tail = out.gather(1, (real - 1)[:, None, None].expand(r, 1, 2))
    return torch.where((k[..., None] < real[:, None, None]), out, tail)


def image_points(lengths: Tensor, valid: Tensor) -> Tensor:
    """``update_labels_info``'s n of each image: ``POINTS``, or one more than its longest polygon where that is longer.

    Shape: lengths (N, L) int64, valid (N, L) bool. Returns (N,) int64.
    """
    longest = torch.nn.functional.pad(torch.where(valid, lengths, 0), (0, 1)).amax(1)  # no label slot: 0
    return torch.where(longest > POINTS, longest + 1, POINTS)


def source_polygons(polygons: Tensor, lengths: Tensor, valid: Tensor) -> tuple[Tensor, Tensor | None]:
    """Each image's polygons as ``YOLODataset.update_labels_info`` gives them: resampled to the image's n points
    (``image_points``), still normalised.

    Where no stored polygon has more than ``POINTS`` points (P <= 1000: known from the shape, no sync) every image's
    n is 1000: (N, L, 1000, 2) and no per-image count. Else each image's own n, the rows padded to P + 1 points (the
    most any n can be) by their last point (``resample_polygons``), and the counts (N,).

    Cost: a sort of 1000 + P float64 positions per slot, every slot of every row given: a batch's, once (a partner
    pool resamples each batch as it enters its ring, ``PartnerPool.push``).

    Shape: polygons (N, L, P, 2), lengths (N, L) int64, valid (N, L) bool. Returns (N, L, W, 2) float32 (zero in the
    slots without a label), and (N,) int64 or None.
    """
    rows, slots, p, _ = polygons.shape
    flat, length = polygons.reshape(-1, p, 2), lengths.reshape(-1).clamp(min=1)  # an empty slot: any one point
    if p <= POINTS:
        out, points = resample_polygons(flat, length, POINTS), None
    else:
        points = image_points(lengths, valid)
        out = resample_polygons(flat, length, points[:, None].expand(-1, slots).reshape(-1), width=p + 1)
    out = out.reshape(rows, slots, out.shape[1], 2)
    return torch.where(valid[..., None, None], out, 0.0), points


def to_longest(polygons: Tensor, points: Tensor, n: Tensor) -> Tensor:
    """``Instances.concatenate`` where the parts differ in points: each polygon resampled to its row's longest, ``n``
    (one already that long is kept as it is).

    Shape: polygons (R, K, W, 2), each slot's first ``points`` (R, K) int64 its own; n (R,) int64. Returns
    (R, K, W, 2).
    """
    rows, slots, w, _ = polygons.shape
    out = resample_polygons(polygons.reshape(-1, w, 2), points.reshape(-1),
                            n[:, None].expand(-1, slots).reshape(-1), width=w)
    return out.reshape(rows, slots, w, 2)


def inside_polygon(polygons: Tensor, px: float, py: float) -> Tensor:
    """``cv2.pointPolygonTest(polygon, (px, py), False) >= 0`` of each polygon: OpenCV's crossing count (float32
    differences, their products and difference in float64), the point on an edge or vertex counting as inside.

    Shape: polygons (..., W, 2) float32, closed from the last point to the first. Returns (...) bool.
    """
    vx, vy = polygons.unbind(-1)
    ux, uy = polygons.roll(1, -2).unbind(-1)  # each edge's start v0: the previous point, the last for the first
    skip = ((uy <= py) & (vy <= py)) | ((uy > py) & (vy > py)) | ((ux < px) & (vx < px))
    on_point = skip & (vy == py) & ((vx == px) | ((uy == py) & (((ux <= px) & (px <= vx)) | ((vx <= px) & (px <= ux)))))
    dist = (py - uy).double() * (vx - ux).double() - (px - ux).double() * (vy - uy).double()
    on_edge = ~skip & (dist == 0)
    crosses = ~skip & (torch.where(vy < uy, -dist, dist) > 0)
    return (on_point | on_edge).any(-1) | (crosses.sum(-1) % 2 == 1)


def polygon_boxes(polygons: Tensor, w: int, h: int) -> Tensor:
    """Ultralytics' ``segment2box(polygon, w, h)`` of each polygon: the bounds of its part inside [0, w] x [0, h].

    Inside: its bounds; wholly beyond one side (by its bounds): zeros. Else the bounds of its points inside, of where
    its edges (the closing one too) cross the image's sides within them, and of the image's corners inside it
    (``inside_polygon``), in segment2box's float32 arithmetic; zeros where there are none.

    Cost: per polygon point a few elementwise float32 passes for each of the 4 sides and 4 corners; no (W, W) product.
    Each set of candidate points is reduced as it is made, so nothing of 9 x W points a polygon is held at once (a
    mosaic batch holds 128 x 4 x the most labels an image has of them, 1,000 points each).

    Shape: polygons (..., W, 2) float32 pixels. Returns (..., 4) xyxy.
    """
    x, y = polygons.unbind(-1)
    lo_x, lo_y, hi_x, hi_y = x.amin(-1), y.amin(-1), x.amax(-1), y.amax(-1)
    bounds = torch.stack([lo_x, lo_y, hi_x, hi_y], -1)
    inside = (lo_x >= 0) & (lo_y >= 0) & (hi_x <= w) & (hi_y <= h)
    outside = (hi_x < 0) | (hi_y < 0) | (lo_x > w) | (lo_y > h)
    inf = torch.full((), torch.inf, dtype=x.dtype, device=x.device)
    part, any_ok = None, None  # the running bounds of the candidates so far (xyxy), and whether there is one

    def take(px: Tensor, py: Tensor, ok: Tensor) -> None:  # one set of candidate points (..., n) and which count
        nonlocal part, any_ok
        got = torch.stack([torch.where(ok, px, inf).amin(-1), torch.where(ok, py, inf).amin(-1),
                           torch.where(ok, px, -inf).amax(-1), torch.where(ok, py, -inf).amax(-1)], -1)
        if part is None:
            part, any_ok = got, ok.any(-1)
            return
        part = torch.cat([torch.minimum(part[..., :2], got[..., :2]), torch.maximum(part[..., 2:], got[..., 2:])], -1)
        any_ok = any_ok | ok.any(-1)

    take(x, y, (x >= 0) & (y >= 0) & (x <= w) & (y <= h))  # its points inside
    dx, dy = (polygons.roll(-1, -2) - polygons).unbind(-1)  # each point's edge to the next, the last to the first
    for axis, bound, lim in ((0, 0, h), (0, w, h), (1, 0, w), (1, h, w)):  # the sides x = 0, x = w, y = 0, y = h
        t = (bound - (x, y)[axis]) / (dx, dy)[axis]  # 0 / 0 and c / 0 fail the test below, as numpy's nan and inf
        ix, iy = x + t * dx, y + t * dy
        on = iy if axis == 0 else ix
        take(ix, iy, (t >= 0) & (t <= 1) & (on >= 0) & (on <= lim))
    for cx, cy in ((0, 0), (w, 0), (0, h), (w, h)):  # the image's corners inside the polygon
        ok = inside_polygon(polygons, cx, cy)[..., None]
        take(x.new_full(ok.shape, cx), y.new_full(ok.shape, cy), ok)
    part = torch.where(any_ok[..., None], part, 0.0)  # no point: zeros
    return torch.where(inside[..., None], bounds, torch.where(outside[..., None], 0.0, part))


def boxes_and_clip(polygons: Tensor, w: int, h: int) -> tuple[Tensor, Tensor]:
    """``apply_segments``' boxes and clip, then ``Instances.clip``: each polygon's ``polygon_boxes`` (segment2box), its
    points clipped to that box (``np.clip(x, x1, x2)``), then box and points clipped to [0, w] x [0, h].

    Shape: polygons (..., W, 2) float32 pixels. Returns (..., 4) xyxy and (..., W, 2). The torch reference of
    ``kernels.polygon_boxes_triton``.
    """
    boxes = polygon_boxes(polygons, w, h)
    x = polygons[..., 0].maximum(boxes[..., 0, None]).minimum(boxes[..., 2, None])  # np.clip(x, x1, x2)
    y = polygons[..., 1].maximum(boxes[..., 1, None]).minimum(boxes[..., 3, None])
    clipped = torch.stack([x.clamp(0, w), y.clamp(0, h)], -1)  # Instances.clip
    return torch.stack([boxes[..., 0].clamp(0, w), boxes[..., 1].clamp(0, h), boxes[..., 2].clamp(0, w),
                        boxes[..., 3].clamp(0, h)], -1), clipped

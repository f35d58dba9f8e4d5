"""Oriented boxes as Ultralytics moves them: each OBB's 4 corners as a segment of 100 points, and its clip.

``YOLODataset.update_labels_info`` resamples every OBB's 4 corners to 100 points before any op
(``resample_segments``: ``linspace(0, 4, 95)`` along the closed 4-gon with the 5 vertex positions inserted, so the
corners are points 0, 25, 49 and 74, and 0, 49 and the closing point come twice). The ops move those points as they
move keypoints; ``Format`` makes the box ``xyxyxyxy2xywhr`` of them (``obb_rboxes``).

Where a segment leaves the image, Ultralytics 8.4.190 clips it with ``Instances.clip(preserve_obb=True)`` (the
mosaic's canvas, the perspective's output, CutMix's area; ``clip_obb``): the segment's convex hull is intersected
with the image (``cv2.intersectConvexConvex``), its box becomes the bounds of that visible part, and the segment the
rectangle that bounds the visible part in the frame of the whole segment's ``cv2.minAreaRect`` (``clip_frame``, which
breaks that rectangle's frequent near ties by a stable rule where OpenCV's rounding breaks them), resampled to 100
points again; a segment with no visible area gets a zero box and zero points, which the op then drops. A segment
inside the image keeps its points and its box, unclipped.

Every segment here is the resample of 4 vertices (the stored corners, moved point by point, or a clip's rectangle),
and all that the clip and ``Format`` read of it is its convex hull, the quadrilateral of those 4 vertices: the other
96 points lie on its edges (up to float32 rounding). So the hull geometry runs on the 4 vertices (``vertices``):
their hull is a sort of 4 angles (``hull4``), ``visible_part`` a fixed 4 x 4 clip of each edge against each side, no
loop, and the minimum-area rectangles cost (N, 4, 4) temporaries where the 100 points would cost (N, 100, 100).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from yolofeed.augment.geometry.rboxes import xyxyxyxy2xywhr

POINTS = 100  # Ultralytics' segment_resamples for OBB (update_labels_info)
VERTICES = (0, 25, 49, 74)  # where resample_segments puts the 4 corners among the 100 points
TIE = 1e-5  # minimum-area rectangles within this fraction of each other's area are tied (clip_frame)


def _resample_table(device: torch.device) -> tuple[Tensor, Tensor]:
    """Where ``resample_segments(n=100)`` samples a closed 4-gon: (100,) int64 edge j and (100,) float64 t along it.

    Built on the device each call (a handful of 100-element kernels): a table copied from the host would wait for
    the copy (pageable memory) and could not be captured in a CUDA graph.
    """
    k = torch.arange(POINTS - 5, dtype=torch.float64, device=device)
    x = torch.where(k == POINTS - 6, 4.0, k * (4 / (POINTS - 6)))  # np.linspace(0, 4, 95): k * step, the end exact
    # np.insert at searchsorted(x, arange(5)): the vertex positions before the equal values; a sort gives the same
    # sequence (equal values are interchangeable)
    x = torch.cat([x, torch.arange(5, dtype=torch.float64, device=device)]).sort().values
    j = x.floor().clamp(max=3).long()
    return j, x - j


def resample_corners(corners: Tensor) -> Tensor:
    """Ultralytics' ``resample_segments(segments, n=100)`` of 4-point segments, bit for bit: ``np.interp`` in float64
    (``(b - a) * t + a`` along the closed polygon), then float32.

    Shape: corners (..., 4, 2). Returns (..., 100, 2) float32.
    """
    j, t = _resample_table(corners.device)
    closed = torch.cat([corners, corners[..., :1, :]], -2).double()  # (..., 5, 2): the first point again
    lo, hi = closed.index_select(-2, j), closed.index_select(-2, j + 1)
    return ((hi - lo) * t[:, None] + lo).float()  # two kernels, as numpy rounds: no fused multiply-add


def vertices(segments: Tensor) -> Tensor:
    """The 4 corners of 100-point OBB segments (``VERTICES``): a stack of views, one copy kernel (an index list would
    be copied from the host). Shape: (..., 100, 2) -> (..., 4, 2)."""
    return torch.stack([segments[..., i, :] for i in VERTICES], -2)


def _on(v: Tensor | float, like: Tensor) -> Tensor:
    """``v`` as a tensor of ``like``'s dtype and device: a number by a fill kernel (a tensor made from a Python number
    on the GPU is a copy from pageable host memory, which waits)."""
    return v.to(like.dtype) if isinstance(v, Tensor) else torch.full((), float(v), dtype=like.dtype, device=like.device)


def _cross(ax: Tensor, ay: Tensor, bx: Tensor, by: Tensor) -> Tensor:
    return ax * by - ay * bx


def hull4(quad: Tensor) -> Tensor:
    """The convex hull of 4 points (``cv2.convexHull``) as 4 vertices in counter-clockwise order: sorted by angle
    about their centroid (a simple polygon, which crossed or misordered corners are not), then the one vertex that may
    lie inside the triangle of the others replaced by its predecessor (the hull is then that triangle).

    Shape: (..., 4, 2) -> (..., 4, 2).
    """
    d = quad - quad.mean(-2, keepdim=True)
    order = torch.atan2(d[..., 1], d[..., 0]).argsort(-1)  # a 4-wide sort per row: no sync
    q = quad.gather(-2, order[..., None].expand(quad.shape))
    prev, nxt = q.roll(1, -2), q.roll(-1, -2)
    turn = _cross(q[..., 0] - prev[..., 0], q[..., 1] - prev[..., 1], nxt[..., 0] - q[..., 0], nxt[..., 1] - q[..., 1])
    return torch.where((turn < 0)[..., None], prev, q)  # a simple quadrilateral has at most one reflex vertex


def clip_frame(quad: Tensor) -> Tensor:
    """The direction the OBB clip fits a segment's visible part along: a side of the segment's minimum-area rectangle
    (Ultralytics: ``cv2.minAreaRect``'s angle, +90 degrees where its width is the shorter side).

    That rectangle has a side along a hull edge, so each of the 4 edges is scored by the area of the rectangle along
    it. Near-ties are the rule, not the exception: the rectangles along two edges that meet at an almost right angle
    (any annotated or perspective-warped rectangle has four) differ in area by 1e-7 to 1e-5 of it, and in angle by
    the corner's deviation from 90 degrees, so which one OpenCV returns is its rounding's choice (all 100 points,
    float32). Here the choice is stable under rounding: the longest edge among those within ``TIE`` of the least area
    (1e-5 of it, above the rounding that decides OpenCV's pick); elsewhere the least, as OpenCV's.

    Shape: quad (..., 4, 2). Returns (...) radians, the direction of that rectangle's longer side.
    """
    h = hull4(quad)
    h = h - h.mean(-2, keepdim=True)  # small coordinates: the projections lose less
    d = h.roll(-1, -2) - h  # (..., 4) edges; 0 where hull4 repeated a vertex
    length = torch.hypot(d[..., 0], d[..., 1])
    ux, uy = (d / length.clamp_min(torch.finfo(d.dtype).tiny)[..., None]).unbind(-1)
    x, y = h[..., None, :, 0], h[..., None, :, 1]  # (..., 1, 4 points) against (..., 4 edges, 1)
    along = x * ux[..., None] + y * uy[..., None]
    across = y * ux[..., None] - x * uy[..., None]
    area = (along.amax(-1) - along.amin(-1)) * (across.amax(-1) - across.amin(-1))
    area = torch.where(length > 0, area, math.inf)
    near = area <= area.amin(-1, keepdim=True) * (1 + TIE)
    pick = torch.where(near, length, -1.0).argmax(-1, keepdim=True)
    theta = torch.atan2(uy.gather(-1, pick), ux.gather(-1, pick)).squeeze(-1)
    wide = (along.amax(-1) - along.amin(-1)).gather(-1, pick) >= (across.amax(-1) - across.amin(-1)).gather(-1, pick)
    return torch.where(wide.squeeze(-1), theta, theta + math.pi / 2)  # the longer side's, as Ultralytics turns it


def visible_part(quad: Tensor, w: Tensor | float, h: Tensor | float) -> tuple[Tensor, Tensor, Tensor]:
    """The part of each convex quadrilateral inside [0, w] x [0, h] (``cv2.intersectConvexConvex``), as the ends of
    its boundary pieces: each edge of the quadrilateral clipped to the rectangle (Liang-Barsky) and each side of the
    rectangle clipped to the quadrilateral (Cyrus-Beck). Those ends are the vertices of the intersection, so its
    bounds along any direction are theirs, and its area their boundary integral (Green's theorem).

    Args:
        quad: (..., 4, 2) the vertices of convex quadrilaterals in order, either orientation (``hull4``).
        w, h: the rectangle, broadcastable to quad[..., 0, 0].

    Returns:
        points (..., 16, 2), ok (..., 16) bool (which points exist), area (...) float64: 0 where nothing is visible.
    """
    w, h = (_on(v, quad).expand(quad.shape[:-2]) for v in (w, h))
    a, b = quad, quad.roll(-1, -2)
    ax, ay = a.unbind(-1)
    dx, dy = (b - a).unbind(-1)
    W, H = w[..., None], h[..., None]
    inf = math.inf

    # the quadrilateral's edges a + t d, t in [0, 1], against x >= 0, x <= w, y >= 0, y <= h: (..., 4 edges, 4 sides)
    p = torch.stack([-dx, dx, -dy, dy], -1)
    q = torch.stack([ax, W - ax, ay, H - ay], -1)
    r = q / torch.where(p == 0, 1.0, p)
    t0 = torch.where(p < 0, r, -inf).amax(-1).clamp(min=0)
    t1 = torch.where(p > 0, r, inf).amin(-1).clamp(max=1)
    ok_edge = ~((p == 0) & (q < 0)).any(-1) & (t0 <= t1)
    lo_x, lo_y = torch.zeros_like(W), torch.zeros_like(H)

    def on_edge(t: Tensor) -> Tensor:  # a vertex itself where t is 0 or 1, exact; clamped where rounding left the side
        pt = torch.where((t == 0)[..., None], a, torch.where((t == 1)[..., None], b, a + t[..., None] * (b - a)))
        return torch.stack([pt[..., 0].clamp(min=0).minimum(W), pt[..., 1].clamp(min=0).minimum(H)], -1)

    e0, e1 = on_edge(t0), on_edge(t1)

    # the rectangle's sides c + t (c' - c), counter-clockwise, against each edge's inner half-plane s cross(d, . - a)
    area2 = _cross(ax, ay, b[..., 0], b[..., 1]).sum(-1)  # twice the signed area: its sign is the orientation
    s = torch.sign(area2)
    cx = torch.stack([lo_x[..., 0], w, w, lo_x[..., 0]], -1)  # (..., 4 sides) start corners (0,0) (w,0) (w,h) (0,h)
    cy = torch.stack([lo_y[..., 0], lo_y[..., 0], h, h], -1)
    ux, uy = cx.roll(-1, -1) - cx, cy.roll(-1, -1) - cy  # the sides' directions
    S = s[..., None, None]
    num = S * _cross(dx[..., None, :], dy[..., None, :], cx[..., :, None] - ax[..., None, :],
                     cy[..., :, None] - ay[..., None, :])  # (..., 4 sides, 4 edges)
    den = S * _cross(dx[..., None, :], dy[..., None, :], ux[..., :, None], uy[..., :, None])
    r = -num / torch.where(den == 0, 1.0, den)
    u0 = torch.where(den > 0, r, -inf).amax(-1).clamp(min=0)
    u1 = torch.where(den < 0, r, inf).amin(-1).clamp(max=1)
    ok_side = ~((den == 0) & (num < 0)).any(-1) & (u0 <= u1) & (s != 0)[..., None]

    def on_side(u: Tensor) -> Tensor:  # axis-aligned sides: the moving coordinate alone is interpolated
        return torch.stack([torch.where(ux == 0, cx, cx + u * ux), torch.where(uy == 0, cy, cy + u * uy)], -1)

    f0, f1 = on_side(u0), on_side(u1)

    points = torch.cat([e0, e1, f0, f1], -2)
    ok = torch.cat([ok_edge, ok_edge, ok_side, ok_side], -1)

    # area = (s * sum over clipped edges + sum over clipped sides of cross(start, end)) / 2, about one of the points
    # and in float64, so that a sliver's area keeps its sign (about the origin the sums cancel from canvas-sized
    # products)
    ref = points.gather(-2, ok.int().argmax(-1)[..., None, None].expand(*ok.shape[:-1], 1, 2)).double()

    def pieces(p0: Tensor, p1: Tensor, ok: Tensor) -> Tensor:
        p0, p1 = p0.double() - ref, p1.double() - ref
        return torch.where(ok, _cross(p0[..., 0], p0[..., 1], p1[..., 0], p1[..., 1]), 0.0).sum(-1)

    area = (s.double() * pieces(e0, e1, ok_edge) + pieces(f0, f1, ok_side)) / 2
    return points, ok, torch.where(s != 0, area, 0.0)


def clip_obb(segments: Tensor, boxes: Tensor, w: Tensor | float, h: Tensor | float,
             rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Ultralytics' ``Instances.clip(w, h, preserve_obb=True)`` on OBB segments and their boxes.

    A segment inside [0, w] x [0, h] keeps its points and box as they are. Any other takes the box of its visible
    part (``visible_part``) and the rectangle around that part in the frame of its own minimum-area rectangle (the
    frame from its corners, ``clip_frame``),
    resampled to 100 points; with no visible area, a zero box and zero points.

    Args:
        segments: (R, K, 100, 2) pixels; boxes: (R, K, 4) xyxy. w, h: numbers, or tensors broadcastable to (R, K).
        rows: (R,) bool, the rows the clip applies to (the mosaic's samples); None: all.

    Returns:
        boxes (R, K, 4), segments (R, K, 100, 2).
    """
    x, y = segments.unbind(-1)
    inside = (x.amin(-1) >= 0) & (y.amin(-1) >= 0) & (x.amax(-1) <= w) & (y.amax(-1) <= h)
    if rows is not None:
        inside = inside | ~rows[:, None]
    quad = vertices(segments)
    points, ok, area = visible_part(hull4(quad), _on(w, segments), _on(h, segments))
    visible = (area > 0) & ~inside
    m = ok[..., None]
    lo = torch.where(m, points, math.inf).amin(-2)
    hi = torch.where(m, points, -math.inf).amax(-2)
    bounds = torch.where(visible[..., None], torch.cat([lo, hi], -1), 0.0)

    # the frame of the whole segment (clip_frame), in cv2's range [-pi/2, pi/2): its sign and a quarter turn only
    # change which corner the rectangle starts from
    theta = torch.remainder(clip_frame(quad) + math.pi / 2, math.pi) - math.pi / 2
    c, s = torch.cos(theta)[..., None], torch.sin(theta)[..., None]
    u = points[..., 0] * c + points[..., 1] * s  # visible @ [[cos, -sin], [sin, cos]]
    v = points[..., 1] * c - points[..., 0] * s
    u1, u2 = torch.where(ok, u, math.inf).amin(-1), torch.where(ok, u, -math.inf).amax(-1)
    v1, v2 = torch.where(ok, v, math.inf).amin(-1), torch.where(ok, v, -math.inf).amax(-1)
    uv = torch.stack([torch.stack([u2, v2], -1), torch.stack([u2, v1], -1), torch.stack([u1, v1], -1),
                      torch.stack([u1, v2], -1)], -2)  # Ultralytics' corner order
    uv = torch.where(visible[..., None, None], uv, 0.0)  # no infinities into the rows that keep nothing
    rect = torch.stack([uv[..., 0] * c - uv[..., 1] * s, uv[..., 0] * s + uv[..., 1] * c], -1)  # @ basis.T
    rect = torch.where(visible[..., None, None], resample_corners(rect), 0.0)
    return (torch.where(inside[..., None], boxes, bounds),
            torch.where(inside[..., None, None], segments, rect))


def segment_bounds(segments: Tensor) -> Tensor:
    """Each segment's xyxy bounds (``segment2box`` of a segment inside the image). Shape: (..., P, 2) -> (..., 4)."""
    x, y = segments.unbind(-1)
    return torch.stack([x.amin(-1), y.amin(-1), x.amax(-1), y.amax(-1)], -1)


def box_area(boxes: Tensor) -> Tensor:
    """xyxy areas (``Instances.bbox_areas``). Shape: (..., 4) -> (...)."""
    return (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])


def obb_rboxes(segments: Tensor) -> Tensor:
    """``Format(return_obb=True)``'s boxes: ``xyxyxyxy2xywhr`` of each segment, in pixels (cx, cy, w, h, theta), from
    its 4 corners (its hull: see the module's docstring). Shape: (B, K, 100, 2) -> (B, K, 5) float32."""
    b, k = segments.shape[:2]
    return xyxyxyxy2xywhr(vertices(segments).reshape(b * k, 4, 2)).reshape(b, k, 5)


__all__ = ["POINTS", "TIE", "VERTICES", "box_area", "clip_frame", "clip_obb", "hull4", "obb_rboxes",
           "resample_corners", "segment_bounds", "vertices", "visible_part"]

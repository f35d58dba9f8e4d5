"""Oriented boxes from point sets, batched: Ultralytics' ``xyxyxyxy2xywhr`` without its per-box ``cv2.minAreaRect``.

An OBB leaves the warp as 100 points (its 4 corners resampled, moved, clamped to the image), and becomes
``cx, cy, w, h, theta`` through the minimum-area rectangle of those points. That rectangle has a side along an
edge of the points' convex hull, so the hull edges are the only directions to try. After clamping, a hull edge
need not join consecutive points (a clamped point can be a reflex vertex that the hull skips), so the edges come
from the points' geometry, not their order:

- seen from a hull vertex ``p_i``, every other point lies in a cone narrower than pi, and each edge of the
  cone is a hull edge. The centroid lies inside that cone, so angles measured from the direction
  ``centroid - p_i`` do not wrap, and one edge is the point ``p_j`` of largest such angle;
- every point proposes its ``p_j - p_i`` this way, hull vertex or not: a direction that is no hull edge only
  gives a rectangle at least as large, never a smaller one, so it cannot change the minimum and needs no test;
- each of the P directions is scored by the area of the points' extents along it and its normal, and the
  smallest wins.

All of it is O(N·P²) elementwise work and reductions in fixed shapes: no hull construction, no sort, no loop
over boxes, no host sync.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def xyxyxyxy2xywhr(points: Tensor) -> Tensor:
    """The minimum-area rectangle of each point set, canonical as Ultralytics' ``ops.xyxyxyxy2xywhr`` makes it.

    ``w`` is the longer side and ``theta`` (radians) lies in [-pi/4, 3pi/4). On a tie (w == h) ``theta`` is the
    side that OpenCV 5's ``minAreaRect`` reports as width (its angle in [-90, 0) degrees); a near-square whose
    sides differ by rounding may take the other side, the same rectangle with ``theta`` pi/2 away. All points
    equal give w = h = 0, theta = pi/2, as OpenCV does; collinear points give h = 0 (up to rounding).

    Where two different rectangles have the same minimum area, the one returned is decided by rounding, here as
    in OpenCV, and the two may differ. Such ties are common: the rectangles along two edges that meet at an
    acute corner both have area 2·(triangle area) when the same three vertices fix both, as in a right or acute
    triangle (a clipped corner) and in many quadrilaterals. Either answer is a minimum-area rectangle.

    Args:
        points: the point sets, any real dtype; computed in float32, or float64 for float64 input.

    Returns:
        ``cx, cy, w, h, theta`` in the dtype and on the device of ``points``.

    Shape:
        points (N, P, 2) or (N, 2P), P >= 1. Returns (N, 5). About four (rows, P, P) temporaries live at once,
        rows in chunks of at most ``CHUNK`` / P² (64 MB in float32).
    """
    if points.ndim == 2 and points.shape[-1] % 2 == 0:
        points = points.reshape(points.shape[0], -1, 2)
    if points.ndim != 3 or points.shape[-1] != 2 or points.shape[1] == 0:
        raise ValueError(f"xyxyxyxy2xywhr: expected points of shape (N, P, 2) or (N, 2P) with P >= 1, "
                         f"got {tuple(points.shape)}")
    p = points.to(torch.float64 if points.dtype == torch.float64 else torch.float32)
    rows = max(1, CHUNK // points.shape[1] ** 2)
    if len(p) <= rows:
        return _rects(p).to(points.dtype)
    # Chunks of rows bound the (rows, P, P) temporaries (an image of DOTA's holds hundreds of boxes): one more
    # set of launches a chunk, the chunks' count known from the shape on the host.
    return torch.cat([_rects(c) for c in p.split(rows)]).to(points.dtype)


CHUNK = 1 << 22  # rows x P x P elements a chunk: about 64 MB of float32 temporaries (four live at once)


def _rects(p: Tensor) -> Tensor:
    """``xyxyxyxy2xywhr`` of (N, P, 2) float32 or float64 points, in their dtype."""
    centroid = p.mean(1, keepdim=True)  # inside the hull, so inside every vertex's cone
    q = p - centroid  # small coordinates: the projections below lose less to rounding

    # Each point's counter-clockwise hull edge, from (N, P, P) differences p_j - p_i: exact for nearby float
    # points, so the directions are those of the points as given (an expansion through centroid-relative
    # products would lose them for close points). Angles are measured from centroid - p_i = -q_i.
    x, y = p.unbind(-1)
    vx = x[:, None, :] - x[:, :, None]
    vy = y[:, None, :] - y[:, :, None]
    rx, ry = -q[..., 0, None], -q[..., 1, None]
    angle = (rx * vy).addcmul_(ry, vx, value=-1).atan2_((rx * vx).addcmul_(ry, vy))  # atan2: the main CPU cost
    angle.masked_fill_((vx == 0) & (vy == 0), -math.inf)  # a point's copies (itself included) give no direction
    del vx, vy
    j = angle.argmax(-1)  # (N, P)
    del angle
    dx, dy = x.gather(1, j) - x, y.gather(1, j) - y
    norm = torch.hypot(dx, dy)
    none = norm == 0  # every point on p_i: all points equal
    dx = torch.where(none, 1.0, dx / norm.clamp_min(torch.finfo(p.dtype).tiny))
    dy = torch.where(none, 0.0, dy / norm.clamp_min(torch.finfo(p.dtype).tiny))

    # The rectangle along each candidate direction over all points: (N, P points, P candidates) projections,
    # elementwise rather than bmm, which may run in TF32 on CUDA and lose a pixel.
    qx, qy = q[..., 0, None], q[..., 1, None]
    dx_, dy_ = dx[:, None, :], dy[:, None, :]
    a_lo, a_hi = (qx * dx_).addcmul_(qy, dy_).aminmax(dim=1)
    b_lo, b_hi = (qy * dx_).addcmul_(qx, dy_, value=-1).aminmax(dim=1)
    wa, wb = a_hi - a_lo, b_hi - b_lo
    k = (wa * wb).argmin(-1, keepdim=True)  # first of equal areas, as any of them is a minimum

    def pick(t: Tensor) -> Tensor:
        return t.gather(-1, k).squeeze(-1)

    dx, dy, wa, wb = pick(dx), pick(dy), pick(wa), pick(wb)
    ma, mb = (pick(a_lo) + pick(a_hi)) / 2, (pick(b_lo) + pick(b_hi)) / 2
    cx = centroid[:, 0, 0] + ma * dx - mb * dy  # normal (-dy, dx)
    cy = centroid[:, 0, 1] + ma * dy + mb * dx

    # theta of the longer side, mod pi. On a tie, OpenCV's width is the side whose angle mod pi is in [pi/2, pi).
    phi = torch.atan2(dy, dx)
    side = torch.remainder(phi, math.pi)  # the side along d, [0, pi)
    normal = torch.remainder(phi + math.pi / 2, math.pi)
    theta = torch.where(wa > wb, side, torch.where(wa < wb, normal, torch.where(side >= math.pi / 2, side, normal)))
    theta = torch.where(theta >= 3 * math.pi / 4, theta - math.pi, theta)  # [0, pi) -> [-pi/4, 3pi/4)
    theta = theta.clamp_min(-math.pi / 4)  # the subtraction may round an ulp below
    w, h = torch.maximum(wa, wb), torch.minimum(wa, wb)
    return torch.stack([cx, cy, w, h, theta], -1)

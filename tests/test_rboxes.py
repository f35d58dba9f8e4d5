"""``rboxes.xyxyxyxy2xywhr`` against Ultralytics' own ``ops.xyxyxyxy2xywhr`` (``cv2.minAreaRect`` per box).

The point sets are those a warp makes of OBBs: 4 corners resampled to 100 points, moved by a perspective or
affine matrix, clamped to the image. Rows are compared as rectangles: centre and sides within float32
tolerance, theta too where the sides differ (a square's theta is ambiguous by pi/2: its corners are compared).
Where the minimum-area rectangle is not unique (two different rectangles of equal area: common for triangles
and many quadrilaterals), OpenCV's pick is decided by its rounding; there ours must be a minimum too: no larger
than OpenCV's, and holding every point.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch
from ultralytics.utils import ops

from yolofeed.augment.geometry import rboxes
from yolofeed.augment.geometry.rboxes import xyxyxyxy2xywhr

W = H = 640
P = 100  # Ultralytics resamples each OBB's 4 corners to 100 points


def tolerance(w: np.ndarray) -> np.ndarray:
    """Per-row tolerance in px for a rectangle of longer side w: cv2 works in float32. Shape: (N,) -> (N,)."""
    return 1e-3 + 1e-4 * w


def resampled(corners: np.ndarray) -> np.ndarray:
    """Corners to 100 points, corners included, as Ultralytics does. Shape: (N, 4, 2) -> (N, 100, 2) float32."""
    return np.stack(ops.resample_segments([c.astype(np.float32) for c in corners], P))


def rotated_rects(rng: np.random.Generator, n: int) -> np.ndarray:
    xywhr = np.column_stack([rng.uniform(50, 590, (n, 2)), rng.uniform(2, 300, (n, 2)), rng.uniform(-4, 4, n)])
    return resampled(ops.xywhr2xyxyxyxy(xywhr))


def convex_quads(rng: np.random.Generator, n: int) -> np.ndarray:
    """Convex quadrilaterals, 4 points at sorted angles on an ellipse, resampled. Shape: (n, 100, 2)."""
    a = np.sort(rng.uniform(0, 2 * math.pi, (n, 4)), 1)
    ellipse = rng.uniform(10, 200, (n, 1, 2)) * np.stack([np.cos(a), np.sin(a)], -1)
    return resampled(rng.uniform(100, 540, (n, 1, 2)) + ellipse)


def warped(rng: np.random.Generator, pts: np.ndarray, spread: float) -> np.ndarray:
    """Each row through its own matrix T @ S @ R @ P @ C (RandomPerspective's order): perspective up to 1e-3,
    any rotation, scale 0.5-1.5, shear up to 20 degrees, centred anywhere in [-spread, W + spread]."""
    n = len(pts)
    eye = np.broadcast_to(np.eye(3), (n, 3, 3))
    C, Pm, R, S, T = (eye.copy() for _ in range(5))
    C[:, :2, 2] = -pts.mean(1)
    Pm[:, 2, :2] = rng.uniform(-1e-3, 1e-3, (n, 2))
    a, s = rng.uniform(-math.pi, math.pi, n), rng.uniform(0.5, 1.5, n)
    R[:, 0, 0], R[:, 0, 1], R[:, 1, 0], R[:, 1, 1] = s * np.cos(a), -s * np.sin(a), s * np.sin(a), s * np.cos(a)
    S[:, 0, 1], S[:, 1, 0] = np.tan(np.radians(rng.uniform(-20, 20, (2, n))))
    T[:, :2, 2] = rng.uniform(-spread, W + spread, (n, 2))
    M = T @ S @ R @ Pm @ C
    xy = np.einsum("nij,npj->npi", M, np.concatenate([pts, np.ones_like(pts[..., :1])], -1))
    return (xy[..., :2] / xy[..., 2:]).astype(np.float32)


def clamped(pts: np.ndarray) -> np.ndarray:
    out = pts.copy()
    out[..., 0] = out[..., 0].clip(0, W)
    out[..., 1] = out[..., 1].clip(0, H)
    return out


def clipped_to_visible(pts: np.ndarray) -> np.ndarray:
    """Ultralytics' own clip (``RandomPerspective.apply_segments``): each row to the box of its visible part."""
    box = np.stack([ops.segment2box(s, W, H) for s in pts])
    out = pts.copy()
    out[..., 0] = out[..., 0].clip(box[:, 0:1], box[:, 2:3])
    out[..., 1] = out[..., 1].clip(box[:, 1:2], box[:, 3:4])
    return out


def degenerate() -> np.ndarray:
    rows = [
        np.full((P, 2), 7.25),  # all points equal
        np.zeros((P, 2)),
        np.linspace([10, 20], [300, 400], P),  # collinear: diagonal, horizontal, vertical
        np.linspace([10, 20], [300, 20], P),
        np.linspace([10, 20], [10, 400], P),
        np.array([[3, 4], [50, 60]] * (P // 2)),  # two distinct points
        np.array([[3, 4], [50, 60], [80, 10]] * 33 + [[3, 4]]),  # a triangle, each corner repeated
        np.array([[W, H]] * 60 + [[W, 600]] * 40),  # mostly outside: clamped onto the border
        np.array([[0, 0]] * 97 + [[0, 5], [5, 0], [5, 5]]),  # a corner's many copies
        np.array([[W, 0]] * P),  # wholly outside, clamped to a corner
    ]
    return np.stack(rows).astype(np.float32)


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    quads = convex_quads(rng, 700)
    wide = warped(rng, quads[300:], 200)  # many leave the image
    x0 = rng.integers(0, 500, (100, 2)).astype(np.float64)
    wh = rng.integers(1, 140, (100, 2)).astype(np.float64)
    wh[:50, 1] = wh[:50, 0]  # half of them squares
    axis_aligned = np.stack([x0, x0 + [1, 0] * wh, x0 + wh, x0 + [0, 1] * wh], 1)
    squares = np.column_stack([rng.uniform(50, 590, (100, 2)), rng.uniform(2, 300, (100, 1)).repeat(2, 1),
                               rng.uniform(-4, 4, 100)])
    return {
        "rotated rectangles": rotated_rects(rng, 300),
        "warped quadrilaterals": warped(rng, quads[:300], 0),
        "clamped": clamped(wide),
        "clipped to the visible box": clipped_to_visible(wide[:200]),
        "clamped, whole pixels": np.round(clamped(wide[200:])),  # exact 45-degree edges, exact ties
        "axis-aligned rectangles and squares": resampled(axis_aligned),
        "rotated squares": resampled(ops.xywhr2xyxyxyxy(squares)),
        "degenerate": degenerate(),
        "wide": wide,
    }


def corners(r: np.ndarray) -> np.ndarray:
    return ops.xywhr2xyxyxyxy(r.astype(np.float64))


def corner_gap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How far two rectangles' corners are, as sets: the largest distance from a corner of a to b's nearest.

    Shape: a, b (N, 5) xywhr. Returns (N,).
    """
    ca, cb = corners(a), corners(b)
    return np.linalg.norm(ca[:, :, None] - cb[:, None], axis=-1).min(2).max(1)


def wrap(theta: np.ndarray) -> np.ndarray:
    """Angles mod pi into [-pi/2, pi/2): -pi/4 and 3pi/4 are the same box."""
    return (theta + math.pi / 2) % math.pi - math.pi / 2


def hull_minimum(points: np.ndarray, rel: float = 1e-5) -> tuple[np.ndarray, np.ndarray]:
    """The minimum area over the directions of each row's convex hull edges (cv2.convexHull), in float64, and
    whether it is tied: another edge direction, far enough (mod pi/2) to move the corners by more than the
    tolerance, gives an area within ``rel`` of it.

    Shape: points (N, P, 2). Returns area (N,), tied (N,) bool.
    """
    area, tied = np.zeros(len(points)), np.zeros(len(points), bool)
    for r, s in enumerate(points):
        hull = cv2.convexHull(s.astype(np.float32))[:, 0].astype(np.float64)
        d = np.roll(hull, -1, 0) - hull
        d = d[np.linalg.norm(d, axis=1) > 0]
        if not len(d):
            continue
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        a, b = s @ d.T, s @ np.stack([-d[:, 1], d[:, 0]], 1).T
        areas = np.ptp(a, 0) * np.ptp(b, 0)
        area[r] = areas.min()
        phi = np.arctan2(d[:, 1], d[:, 0])[areas <= area[r] * (1 + rel) + 1e-9]
        spread = np.abs((phi[:, None] - phi[None] + math.pi / 4) % (math.pi / 2) - math.pi / 4).max()
        size = np.ptp(s, 0).max()
        tied[r] = spread * size > tolerance(size)
    return area, tied


def consecutive_pairs(points: np.ndarray) -> np.ndarray:
    """The smallest rectangle along the directions p_{i+1} - p_i only (a hull taken from the points' order),
    in float64. Shape: points (N, P, 2). Returns area (N,)."""
    p = points.astype(np.float64)
    d = np.roll(p, -1, 1) - p
    norm = np.linalg.norm(d, axis=-1, keepdims=True)
    d = np.where(norm > 0, d / np.where(norm > 0, norm, 1), [1.0, 0.0])
    a = np.einsum("npc,nkc->nkp", p, d)
    b = np.einsum("npc,nkc->nkp", p, np.stack([-d[..., 1], d[..., 0]], -1))
    return (np.ptp(a, -1) * np.ptp(b, -1)).min(-1)


def assert_matches(points: np.ndarray, ours: torch.Tensor | None = None) -> np.ndarray:
    """Ours equals Ultralytics' on every row, as a rectangle, or is another minimum where the minimum is tied.

    Shape: points (N, P, 2). Returns (N,) bool: the rows where the two are the same rectangle.
    """
    ref = ops.xyxyxyxy2xywhr(points)  # float64, from cv2's float32
    ours = xyxyxyxy2xywhr(torch.from_numpy(points)) if ours is None else ours
    lo, hi = torch.tensor([-math.pi / 4, 3 * math.pi / 4], dtype=ours.dtype).tolist()  # the bounds as rounded
    ours = ours.double().numpy()
    tol = tolerance(ref[:, 2])
    cx, cy, w, h, theta = ours.T
    assert (w >= h).all() and (h >= 0).all()
    assert ((theta >= lo) & (theta < hi)).all()

    # Every point inside our rectangle.
    u = np.stack([np.cos(theta), np.sin(theta)], -1)
    rel = points - ours[:, None, :2]
    along, across = (rel * u[:, None]).sum(-1), rel[..., 1] * u[:, None, 0] - rel[..., 0] * u[:, None, 1]
    assert (np.abs(along).max(1) <= w / 2 + tol).all() and (np.abs(across).max(1) <= h / 2 + tol).all()

    same = corner_gap(ref, ours) <= tol
    err = np.abs(ours - ref)[same, :4]
    assert (err <= tol[same, None]).all(), f"cx, cy, w, h off by up to {err.max(0)}"
    sides = same & (ref[:, 2] - ref[:, 3] > tol)  # theta is the longer side's; a square's is ambiguous
    turn = np.abs(wrap(theta - ref[:, 4]))[sides] * ref[sides, 2] / 2  # how far it moves the corners
    assert (turn <= tol[sides]).all(), f"theta moves the corners by up to {turn.max()} px"

    if (~same).any():
        area, tied = hull_minimum(points[~same])
        assert tied.all(), f"rows {np.flatnonzero(~same)[~tied]} differ from cv2 but have one minimum"
        assert ((w * h)[~same] <= area * (1 + 1e-5) + tol[~same] ** 2).all()
    return same


@pytest.mark.parametrize("family", ["rotated rectangles", "warped quadrilaterals", "clamped",
                                    "clipped to the visible box", "clamped, whole pixels",
                                    "axis-aligned rectangles and squares", "rotated squares", "degenerate"])
def test_matches_ultralytics(data, family):
    same = assert_matches(data[family])
    assert same.mean() > 0.8  # ties are the exception: most rows are compared number for number


def test_exact_ties_take_opencvs_side(data):
    """An axis-aligned square has w == h exactly, and all points equal w == h == 0: theta is the side OpenCV
    calls width, pi/2, whichever corner the points start from and whichever way they turn."""
    square = np.array([[0, 0], [10, 0], [10, 10], [0, 10]], np.float32) + 100
    orders = resampled(np.stack([np.roll(square, k, 0)[::turn] for k in range(4) for turn in (1, -1)]))
    pts = np.concatenate([orders, data["axis-aligned rectangles and squares"], data["degenerate"]])
    np.testing.assert_allclose(xyxyxyxy2xywhr(torch.from_numpy(pts))[:, 4].numpy(), ops.xyxyxyxy2xywhr(pts)[:, 4],
                               rtol=0, atol=1e-6)  # float32 rounding of pi/2, not the other side


def test_clamped_data_is_clipped(data):
    """The clamped family clips most rows, cuts image corners off and leaves some rows mostly outside."""
    moved = data["clamped"] != data["wide"]
    assert moved.any((1, 2)).mean() > 0.4
    assert (moved[..., 0].any(1) & moved[..., 1].any(1)).mean() > 0.1  # clipped on both axes: corners cut
    assert (moved.any(-1).mean(1) > 0.5).mean() > 0.05  # most points outside


def test_clamped_hull_edges_need_not_join_consecutive_points(data):
    """On clamped rows a hull edge may skip points, so directions of consecutive pairs miss cv2's minimum,
    while ours finds it; on unclipped rows consecutive pairs are enough (the check itself is sound)."""
    def misses(family: str) -> np.ndarray:
        ref = ops.xyxyxyxy2xywhr(data[family])
        return consecutive_pairs(data[family]) > ref[:, 2] * ref[:, 3] * (1 + 1e-4) + tolerance(ref[:, 2]) ** 2

    assert not misses("rotated rectangles").any() and not misses("warped quadrilaterals").any()
    worse = misses("clamped")
    assert worse.sum() >= 10
    assert assert_matches(data["clamped"][worse]).mean() > 0.8


def test_float64(data):
    pts = data["clamped"].astype(np.float64)  # float32 values: cv2's cast loses nothing
    ours = xyxyxyxy2xywhr(torch.from_numpy(pts))
    assert ours.dtype == torch.float64
    assert_matches(pts, ours)


def test_layouts_and_shapes(data):
    corners8 = ops.xywhr2xyxyxyxy(np.array([[100.0, 200.0, 80.0, 30.0, 0.3], [50.0, 60.0, 10.0, 40.0, -1.0]]))
    flat = torch.from_numpy(corners8.reshape(2, 8).astype(np.float32))
    np.testing.assert_allclose(xyxyxyxy2xywhr(flat).numpy(), ops.xyxyxyxy2xywhr(flat).numpy(), rtol=1e-5, atol=1e-4)
    assert xyxyxyxy2xywhr(torch.zeros(0, P, 2)).shape == (0, 5)
    assert xyxyxyxy2xywhr(torch.from_numpy(data["clamped"][:4]).half()).dtype == torch.float16
    with pytest.raises(ValueError, match=r"\(N, P, 2\)"):
        xyxyxyxy2xywhr(torch.zeros(3, 100, 3))


def test_fixed_shapes_without_host_syncs():
    """On the meta device every data-dependent shape or host read (nonzero, masks as indices, .item()) raises."""
    assert xyxyxyxy2xywhr(torch.empty(7, P, 2, device="meta")).shape == (7, 5)


@pytest.mark.gpu
def test_cuda_matches_ultralytics(data):
    pts = np.concatenate([data["clamped"], data["degenerate"]])
    x = torch.from_numpy(pts).cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ours = xyxyxyxy2xywhr(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert ours.device == x.device
    assert_matches(pts, ours.cpu())


def test_rows_in_chunks_give_the_rows_at_once(monkeypatch):
    g = torch.Generator().manual_seed(5)
    pts = torch.rand(37, 9, 2, generator=g) * 100
    whole = rboxes.xyxyxyxy2xywhr(pts)
    monkeypatch.setattr(rboxes, "CHUNK", 5 * 81)  # 5 rows a chunk: 8 chunks, the last of 2 rows
    torch.testing.assert_close(rboxes.xyxyxyxy2xywhr(pts), whole, rtol=1e-6, atol=1e-5)  # SIMD tails round apart

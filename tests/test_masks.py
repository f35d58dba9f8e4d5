"""Segment masks on the device (``kernels.polyfill``) against Ultralytics' own ``polygon2mask`` (cv2.fillPoly,
cv2.resize): pixel for pixel, on random and adversarial polygons, mask ratios 1, 2 and 4."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ultralytics.data.utils import polygon2mask
from ultralytics.utils.ops import resample_segments

from yolofeed.kernels.polyfill import downsample, fill_polygons, sampled

cv2 = pytest.importorskip("cv2")

H, W = 96, 128  # not square, both multiples of 4
RATIOS = (1, 2, 4)


def _star(rng, centre, radii, m):
    ang = np.sort(rng.uniform(0, 2 * np.pi, m))
    return (centre + np.stack([np.cos(ang), np.sin(ang)], -1) * np.asarray(radii)[..., None]).astype(np.float32)


def zoo(seed: int = 0) -> dict[str, list[np.ndarray]]:
    """Polygons by kind, float32 (m, 2) pixel x, y; every kind that has bitten a rasteriser."""
    rng = np.random.default_rng(seed)
    tri = np.array([[20.3, 10.7], [100.9, 40.2], [35.5, 90.1]], np.float32)
    kinds = {
        "convex": [_star(rng, rng.uniform(0, [W, H]), rng.uniform(3, 50), int(rng.integers(3, 40))) for _ in range(30)],
        "concave": [_star(rng, rng.uniform(0, [W, H]), rng.uniform(1, 50, m), m)
                    for m in rng.integers(5, 60, 30)],
        "self-intersecting": [rng.uniform(-5, [W + 5, H + 5], (int(m), 2)).astype(np.float32)
                              for m in rng.integers(4, 30, 30)],
        "self-touching": [np.array([[10, 10], [40, 40], [70, 10], [70, 70], [40, 40], [10, 70]], np.float32),
                          np.array([[5, 5], [60, 5], [60, 60], [30, 5.5], [5, 60]], np.float32),
                          np.array([[20, 20], [80, 20], [50, 50], [80, 80], [20, 80], [50, 50]], np.float32)],
        "tiny": [rng.uniform(0, [W, H]) + rng.uniform(0, 2.5, (int(m), 2)).astype(np.float32)
                 for m in rng.integers(3, 8, 40)],
        "leaving the image": [rng.uniform(-80, [W + 80, H + 80], (int(m), 2)).astype(np.float32)
                              for m in rng.integers(3, 12, 30)]
        + [_star(rng, rng.uniform(-20, [W + 20, H + 20]), rng.uniform(20, 90), 50) for _ in range(20)],
        "on pixel boundaries": [rng.integers(-3, [W + 3, H + 3], (int(m), 2)).astype(np.float32)
                                for m in rng.integers(3, 10, 30)]
        + [(rng.integers(0, [W, H], (6, 2)) + rng.choice([-1e-3, 0, 0.999, -0.999], (6, 2))).astype(np.float32)
           for _ in range(30)],
        "whole image": [np.array([[0, 0], [W, 0], [W, H], [0, H]], np.float32),
                        np.array([[-1, -1], [W - 1, 0], [W - 1, H - 1], [0, H - 1]], np.float32)],
        "degenerate": [np.full((5, 2), 7.5, np.float32), np.array([[3, 9], [50, 9], [90, 9]], np.float32),
                       np.array([[30, 2], [30, 90], [30, 40]], np.float32),
                       np.array([[1, 1], [90, 70], [45.5, 35.5]], np.float32)],
        "a triangle resampled to 1000 points": [resample_segments([tri], 1000)[0]],
        "resampled to 1000 points": [resample_segments([p], 1000)[0] for p in
                                     [_star(rng, rng.uniform(0, [W, H]), rng.uniform(2, 50) * rng.uniform(0.5, 1, m), m)
                                      for m in rng.integers(3, 80, 30)]],
    }
    return kinds


def _padded(polys: list[np.ndarray]) -> torch.Tensor:
    """Polygons of different lengths as one (P, n, 2) tensor: each padded with its last point, which adds only
    zero-length edges (a pixel its neighbours already drew, no fill edge)."""
    n = max(len(p) for p in polys)
    return torch.from_numpy(np.stack([np.concatenate([p, np.repeat(p[-1:], n - len(p), 0)]) for p in polys]))


@pytest.mark.parametrize("ratio", (1, 2, 3, 4, 8))
def test_resize_rule_is_cv2_resize_for_every_block(ratio):
    """cv2.resize (INTER_LINEAR, uint8) of a 0/1 mask by an integer ratio reads the ``sampled`` pixels only: every
    pattern of a ratio x ratio block (all 65,536 at ratio 4; 2^16 random ones at 8), each block its own output pixel."""
    rng = np.random.default_rng(ratio)
    bits = ratio * ratio
    codes = np.arange(2 ** bits) if bits <= 16 else rng.integers(0, 2 ** 62, 2 ** 16)
    side = int(np.ceil(np.sqrt(len(codes))))
    codes = np.resize(codes, side * side)
    blocks = ((codes[:, None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(side, side, ratio, ratio)
    mask = blocks.transpose(0, 2, 1, 3).reshape(side * ratio, side * ratio)
    ref = cv2.resize(mask, (side, side))
    rows = sampled(side * ratio, ratio)
    ours = downsample(torch.from_numpy(mask)[rows][:, rows].bool(), ratio)
    np.testing.assert_array_equal(ours.numpy(), ref)


@pytest.mark.parametrize("ratio", RATIOS)
def test_fill_equals_polygon2mask(ratio):
    """Each polygon's mask equals Ultralytics' ``polygon2mask`` exactly, for every kind of the zoo."""
    wrong = {}
    for kind, polys in zoo().items():
        pts = _padded(polys)
        # a polygon of few points may cross the image in every edge: each edge's events are at most twice the
        # image's rows; the resampled ones (n = 1000, edges of a pixel or two) fit the default
        events = None if pts.shape[1] >= 1000 else 2 * H * pts.shape[1]
        ours, overflow = fill_polygons(pts, torch.ones(len(polys), dtype=torch.bool), H, W, ratio, events=events)
        assert int(overflow) == 0, kind
        for mask, p in zip(ours, polys):
            diff = int((mask.numpy() != polygon2mask((H, W), [p.reshape(-1)], color=1, downsample_ratio=ratio)).sum())
            if diff:
                wrong.setdefault(kind, []).append(diff)
    assert not wrong, f"ratio {ratio}: polygons whose mask differs (pixels differing) by kind: {wrong}"


def test_invalid_slots_and_overflow():
    """An invalid slot gives an empty mask; too few event slots are counted in ``overflow``, never silent."""
    polys = zoo()["resampled to 1000 points"][:8]
    pts, valid = _padded(polys), torch.tensor([True, False] * 4)
    ours, overflow = fill_polygons(pts, valid, H, W, 4)
    assert int(overflow) == 0 and not ours[~valid].any() and ours[valid].any()
    short, overflow = fill_polygons(pts, valid, H, W, 4, events=50)
    assert int(overflow) > 0 and not torch.equal(short, ours)

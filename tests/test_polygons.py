"""Segmentation polygons resampled on the device as Ultralytics resamples them (``resample_segments``), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from yolofeed.augment.geometry.polygons import resample_polygons


def _padded(polygons: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in polygons)
    points = torch.full((len(polygons), width, 2), 7.0)  # padding that must not leak into any result
    for k, p in enumerate(polygons):
        points[k, :len(p)] = torch.from_numpy(p)
    return points, torch.tensor([len(p) for p in polygons])


@pytest.mark.parametrize("n", [1000, 60, 12])
def test_resample_equals_ultralytics_bit_for_bit(n):
    """Polygons of 3 to 70 points (fewer than n, n - 2: one linspace position, n itself, more: each of
    resample_segments' branches), with points in [0, 1] as label files hold them and repeated points; every point
    equal to Ultralytics' float32."""
    from ultralytics.utils.ops import resample_segments

    rng = np.random.default_rng(n)
    polygons = [rng.random((k, 2), dtype=np.float32) for k in [3, 4, 5, 17, 33, 59, 60, 61, 70, 11, 12, 13, 58, 10]]
    polygons.append(np.repeat(rng.random((1, 2), dtype=np.float32), 5, 0))  # one point five times
    polygons.append(np.array([[0, 0], [1, 0], [1, 1], [0, 1]], np.float32))  # exact binary fractions
    theirs = resample_segments([p.copy() for p in polygons], n=n)
    ours = resample_polygons(*_padded(polygons), n=n)
    assert ours.shape == (len(polygons), n, 2) and ours.dtype == torch.float32
    for k, (p, want) in enumerate(zip(polygons, theirs)):
        np.testing.assert_array_equal(ours[k].numpy(), want, err_msg=f"a polygon of {len(p)} points")


def test_every_vertex_is_kept_in_order_and_an_empty_batch_is_empty():
    square = np.array([[0.1, 0.1], [0.9, 0.1], [0.9, 0.9], [0.1, 0.9]], np.float32)
    out = resample_polygons(*_padded([square]))[0].numpy()
    found = [int(np.flatnonzero((out == v).all(1))[0]) for v in square]
    assert found == sorted(found) and found[0] == 0 and (out[-1] == square[0]).all()  # closed: ends where it began
    assert resample_polygons(torch.zeros((0, 5, 2)), torch.zeros(0, dtype=torch.long)).shape == (0, 1000, 2)

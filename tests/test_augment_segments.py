"""Segmentation polygons through every op: equal to Ultralytics' own transforms given the same draws.

As ``test_augment_obb.py`` does for oriented boxes: yolofeed draws, and the draws are replayed through Ultralytics'
``Mosaic``, ``RandomPerspective``, ``MixUp``, ``CutMix`` and ``RandomFlip``, built as ``v8_transforms`` builds them
for a segment dataset, on ``Instances`` whose segments are ``YOLODataset.update_labels_info``'s resample of the same
polygons (1,000 points, or one more than an image's longest where that is longer). Points and boxes agree within
1e-3 px, classes exactly, row for row; a row of fewer points than the batch's width repeats its last point.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from unittest import mock

import cv2
import numpy as np
import torch
from ultralytics.data.augment import Format, Mosaic, RandomFlip, RandomPerspective
from ultralytics.data.dataset import YOLODataset
from ultralytics.utils import ops

from yolofeed.augment import AugmentHyp, geometry
from yolofeed.augment.geometry import polygons as gp
from yolofeed.schema import SourceBatch

S, B = 160, 6
TOL = 1e-3  # px: float32 matrix products summed in another order (numpy's BLAS)
SEGMENT_DATASET = SimpleNamespace(use_obb=False, use_segments=True, format_class=Format)  # update_labels_info reads


def star(rng: np.random.Generator, k: int, side: float) -> np.ndarray:
    """A polygon of k points around a centre in [0.1, 0.9]^2, up to ``side`` across, clipped to [0, 1] (some lie on
    the image's edge, as annotations do). Shape (k, 2) float32 normalised."""
    a = np.sort(rng.uniform(0, 2 * np.pi, k))
    r = rng.uniform(0.3, 1.0, k) * rng.uniform(0.05, side / 2)
    c = rng.uniform(0.1, 0.9, 2)
    return np.clip(c + np.stack([r * np.cos(a), r * np.sin(a)], -1), 0, 1).astype(np.float32)


def segment_batch(n: int, seed: int, width: int = 4, side: float = 0.6, long: dict[tuple[int, int], int] | None = None,
                  empty: tuple[int, ...] = (1,)) -> SourceBatch:
    """n random images of assorted sizes with ``width`` label slots of polygons of 3 to 40 points, as the loader gives
    them: normalised, padded to the longest, each box the polygon's enclosing box (``segments2boxes``). ``long`` puts a
    polygon of that many points in slot (image, k); the images ``empty`` have no labels."""
    rng = np.random.default_rng(seed)
    hw = rng.integers(S // 2, S + 1, (n, 2))
    polys = [[star(rng, int(rng.choice([3, 4, 5, 8, 17, 40])), side) for _ in range(width)] for _ in range(n)]
    for (i, k), points in (long or {}).items():
        polys[i][k] = star(rng, points, side)
    p = max(len(q) for row in polys for q in row)
    points = np.zeros((n, width, p, 2), np.float32)
    lengths = np.array([[len(q) for q in row] for row in polys])
    for i, row in enumerate(polys):
        for k, q in enumerate(row):
            points[i, k, :len(q)] = q
    boxes = np.stack([ops.segments2boxes(row) for row in polys]).astype(np.float32)
    valid = rng.random((n, width)) < 0.85
    for (i, k) in long or {}:
        valid[i, k] = True
    valid[list(empty)] = False
    return SourceBatch(torch.from_numpy(rng.integers(0, 256, (n, S, S, 3), dtype=np.uint8)), torch.from_numpy(hw),
                       torch.from_numpy(rng.integers(0, 4, (n, width)).astype(np.float32)), torch.from_numpy(boxes),
                       torch.from_numpy(valid), polygons=torch.from_numpy(points),
                       polygon_lengths=torch.from_numpy(lengths))


class Reference:
    """Ultralytics' view of a ``segment_batch``: ``get_image_and_label`` as ``YOLODataset`` gives it (task=segment)."""

    cache, buffer, use_obb = None, [], False

    def __init__(self, batch: SourceBatch):
        self.batch = batch

    def get_image_and_label(self, i: int) -> dict:
        b = self.batch
        h, w = b.hw[i].tolist()
        v = b.valid[i]
        segments = [b.polygons[i, k, :int(b.polygon_lengths[i, k])].numpy().copy() for k in np.flatnonzero(v)]
        label = {"im_file": f"{i}.jpg", "img": np.ascontiguousarray(b.images[i, :h, :w].numpy()[..., ::-1]),
                 "ori_shape": (h, w), "resized_shape": (h, w), "cls": b.cls[i][v].numpy()[:, None].copy(),
                 "bboxes": b.boxes[i][v].numpy().copy(), "segments": segments, "keypoints": None,
                 "bbox_format": "xywh", "normalized": True}
        return YOLODataset.update_labels_info(SEGMENT_DATASET, label)


def ultralytics_mosaic(ref: Reference, hyp: AugmentHyp, params, row: int) -> dict:
    """Ultralytics' Mosaic for augmented row ``row`` with our draws (its own image alone where it does not mosaic)."""
    mp = params.mosaic
    labels = ref.get_image_and_label(int(mp.sources[row, 0]))
    if bool(mp.apply[row]):
        mosaic = Mosaic(ref, imgsz=S, p=1.0, n=hyp.mosaic_grid)
        xc, yc = mp.center[row].tolist()
        with mock.patch.object(mosaic, "get_indexes", return_value=mp.sources[row, 1:].tolist()), \
                mock.patch.object(random, "uniform", side_effect=[float(yc), float(xc)]):  # yc is drawn first
            p = mosaic.get_params(labels)
        labels = mosaic.apply_instances(mosaic.apply_image(labels, p), p)
        labels.pop("mix_labels", None)
    return labels


def ultralytics_geometry(ref: Reference, hyp: AugmentHyp, params, row: int) -> dict:
    """Ultralytics' Mosaic -> RandomPerspective (as v8_transforms builds it for segment), our draws."""
    labels = ultralytics_mosaic(ref, hyp, params, row)
    canvas = torch.tensor([labels["img"].shape[:2]])
    one = geometry.PerspectiveParams(*(getattr(params.perspective, f)[row:row + 1] for f in
                                       geometry.PerspectiveParams.__dataclass_fields__))
    M, scale = geometry.perspective_matrix(one, canvas, S)
    rp = RandomPerspective(degrees=hyp.degrees, translate=hyp.translate, scale=hyp.scale, shear=hyp.shear,
                           perspective=hyp.perspective, size=(S, S), preserve_obb=False)
    rparams = {"M": M[0].numpy(), "scale": float(scale[0]), "orig_shape": labels["img"].shape[:2], "size": (S, S)}
    return rp.apply_instances(rp.apply_image(labels, rparams), rparams)


def ultralytics_flips(labels: dict, ud: bool, lr: bool) -> dict:
    """``RandomFlip`` vertical, then horizontal, as ``v8_transforms`` builds them without keypoints (flip_idx [])."""
    for direction, on in (("vertical", ud), ("horizontal", lr)):
        f = RandomFlip(p=1.0, direction=direction, flip_idx=[])
        p = {"flip": on, "h": S, "w": S, "direction": direction, "flip_idx": f.flip_idx}
        labels = f.apply_instances(f.apply_image(labels, p), p)
    return labels


def assert_polygons(ours: torch.Tensor, theirs: np.ndarray, what: str = "") -> None:
    """Row for row Ultralytics' n points within TOL, then (where ours are wider) the last point again.
    Shape: ours (k, W, 2), theirs (k, n, 2)."""
    n = theirs.shape[1]
    assert len(ours) == len(theirs) and ours.shape[1] >= n, (what, tuple(ours.shape), theirs.shape)
    np.testing.assert_allclose(ours[:, :n].numpy(), theirs, atol=TOL, rtol=0, err_msg=what)
    assert torch.equal(ours[:, n:], ours[:, n - 1:n].expand_as(ours[:, n:])), f"{what}: padding past {n} points"


def assert_row(out, b: int, labels: dict, polygons: torch.Tensor | None = None) -> int:
    """Sample b of our labels (boxes, valid, classes, polygons) against Ultralytics': the same rows kept, in order."""
    inst = labels["instances"]
    inst.convert_bbox("xyxy")
    v = out.valid[b]
    assert int(v.sum()) == len(inst), f"sample {b}: {int(v.sum())} boxes kept, Ultralytics kept {len(inst)}"
    np.testing.assert_allclose(out.boxes[b][v].numpy(), inst.bboxes, atol=TOL, rtol=0, err_msg=f"sample {b}")
    np.testing.assert_array_equal(out.cls[b][v].numpy(), labels["cls"][:, 0])
    ours = (out.polygons if polygons is None else polygons)[b][v]
    assert_polygons(ours, inst.segments, f"sample {b}")
    points = getattr(out, "polygon_points", None)
    if points is not None and len(inst):
        assert int(points[b]) == inst.segments.shape[1], f"sample {b}: {int(points[b])} points a polygon"
    return len(inst)


def _hyp(**kw) -> AugmentHyp:
    return AugmentHyp(**({"imgsz": S, "hsv_h": 0, "hsv_s": 0, "hsv_v": 0, "fliplr": 0} | kw))


LONG = {(0, 1): 1200, (3, 0): 1001}  # two images of a longer n: 1201 and 1002 points a polygon


def test_the_source_polygons_are_update_labels_infos():
    """Each image's polygons resampled to its n, bit for bit: 1,000 (3-point polygons included), or its longest + 1;
    an image without labels has none, and counts 1,000."""
    for batch in (segment_batch(B, seed=0), segment_batch(B, seed=0, long=LONG)):
        out, points = gp.source_polygons(batch.polygons, batch.polygon_lengths, batch.valid)
        ref = Reference(batch)
        assert (points is None) == (batch.polygons.shape[2] <= gp.POINTS)
        for i in range(B):
            theirs = ref.get_image_and_label(i)["instances"].segments
            n = theirs.shape[1]
            assert n == (gp.POINTS if points is None else int(points[i]))
            ours = out[i][batch.valid[i]]
            assert np.array_equal(ours[:, :n].numpy(), theirs), i
            assert torch.equal(ours[:, n:], ours[:, n - 1:n].expand_as(ours[:, n:]))
        assert (batch.polygon_lengths[batch.valid] == 3).any() and not batch.valid[1].any()
    assert points.tolist() == [1201, 1000, 1000, 1002, 1000, 1000]


def _random_polygons(rng: np.random.Generator, n: int, k: int = 30) -> np.ndarray:
    """n polygons of k points, resampled to 1,000, anywhere around a 160 px image: many cross its sides, some are
    outside it, some hold its corners; every seventh self-intersecting, some with points exactly on a side."""
    c = rng.uniform(-60, 220, (n, 1, 2))
    a = np.sort(rng.uniform(0, 2 * np.pi, (n, k)), 1)
    r = rng.uniform(5, 150, (n, 1)) * rng.uniform(0.3, 1.0, (n, k))
    p = (c + np.stack([r * np.cos(a), r * np.sin(a)], -1)).astype(np.float32)
    p[::7] = p[::7][:, rng.permutation(k)]
    p[::11, :, 0] = np.round(p[::11, :, 0] / 20) * 20  # on x = 0 and x = 160 exactly, among others
    p[::13, :, 1] = np.clip(p[::13, :, 1], 0, S)
    return np.stack(ops.resample_segments(list(p), gp.POINTS))


def test_polygon_boxes_are_segment2box():
    """``segment2box(polygon, w, h)`` of 8.4.190 (the bounds of the part inside the image: points inside, crossings of
    the sides, corners inside by ``cv2.pointPolygonTest``), for polygons inside, outside and across, exactly."""
    seg = _random_polygons(np.random.default_rng(1), 600)
    ours = gp.polygon_boxes(torch.from_numpy(seg), S, S).numpy()
    theirs = np.stack([ops.segment2box(s, S, S) for s in seg])
    assert np.array_equal(ours, theirs)
    x, y = seg[..., 0], seg[..., 1]
    inside = (x.min(1) >= 0) & (y.min(1) >= 0) & (x.max(1) <= S) & (y.max(1) <= S)
    assert inside.sum() > 20 and (~theirs.any(1)).sum() > 20 and (theirs.any(1) & ~inside).sum() > 200
    corners = [(0, 0), (S, 0), (0, S), (S, S)]
    held = [gp.inside_polygon(torch.from_numpy(seg), cx, cy).numpy() for cx, cy in corners]
    want = [[cv2.pointPolygonTest(s, (float(cx), float(cy)), False) >= 0 for s in seg] for cx, cy in corners]
    assert np.array_equal(np.stack(held), np.array(want)) and np.stack(held).sum() > 20

"""Segmentation polygons through every op: equal to Ultralytics' own transforms given the same draws.

As ``test_augment_obb.py`` does for oriented boxes: yolofeed draws, and the draws are replayed through Ultralytics'
``Mosaic``, ``RandomPerspective``, ``MixUp``, ``CutMix`` and ``RandomFlip``, built as ``v8_transforms`` builds them
for a segment dataset, on ``Instances`` whose segments are ``YOLODataset.update_labels_info``'s resample of the same
polygons (1,000 points, or one more than an image's longest where that is longer). Points and boxes agree within
1e-3 px, classes exactly, row for row; a row of fewer points than the batch's width repeats its last point.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace
from unittest import mock

import cv2
import numpy as np
import pytest
import replay
import torch
from ultralytics.data.augment import CutMix, Format, MixUp
from ultralytics.data.dataset import YOLODataset
from ultralytics.utils import ops
from ultralytics.utils.instance import Instances
from ultralytics.utils.metrics import bbox_ioa

from helpers import no_host_sync, to_device
from yolofeed.augment import AugmentHyp, GpuAugment, geometry, mix
from yolofeed.augment.geometry import polygons as gp
from yolofeed.augment.op import Labels
from yolofeed.augment.pipeline import CARRIED, COMPOSE
from yolofeed.augment.pool import PartnerPool
from yolofeed.errors import ConfigError
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
    return replay.mosaic(ref, hyp, params, row, S)


def ultralytics_geometry(ref: Reference, hyp: AugmentHyp, params, row: int) -> dict:
    return replay.geometry(ref, hyp, params, row, S)


def ultralytics_flips(labels: dict, ud: bool, lr: bool) -> dict:
    return replay.flips(labels, ud, lr, S)


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


def _box_cases(n: int) -> torch.Tensor:
    """``_random_polygons`` and the cases a kernel can miss: points on the corners, an edge along a side, integer
    points (many on a side exactly), a polygon around the whole image, one outside, one with a NaN point."""
    seg = torch.from_numpy(_random_polygons(np.random.default_rng(4), n))
    seg[0, :3] = torch.tensor([[0.0, 0.0], [float(S), 0.0], [0.0, float(S)]])
    seg[1, :4] = torch.tensor([[0.0, -5.0], [0.0, 30.0], [-10.0, 30.0], [-10.0, -5.0]])
    seg[2] = seg[2].round()
    seg[3, :4] = torch.tensor([[-50.0, -50.0], [S + 50.0, -50.0], [S + 50.0, S + 50.0], [-50.0, S + 50.0]])
    seg[3, 4:] = seg[3, 3]  # as a resampled polygon ends: its last point again
    seg[4] = -30.0
    seg[5, 2] = float("nan")
    return seg


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, NaN where the other is NaN."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.slow
def test_the_triton_polygon_boxes_equal_the_torch_ops_in_the_interpreter():
    """``kernels.polygon_boxes_triton`` against ``boxes_and_clip`` (segment2box, the clip to each box and to the
    image), bit for bit: Triton's interpreter (numpy) in a subprocess, on 60 polygons of 1,000 points and 20 of 1,201
    (three chunks, the last part full)."""
    pytest.importorskip("triton")
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})
        import torch, test_augment_segments as t
        from yolofeed.augment.geometry.polygons import boxes_and_clip, resample_polygons
        from yolofeed.kernels.polygon_boxes_triton import boxes_and_clip as kernel
        seg = t._box_cases(60)
        long = resample_polygons(seg[:20, :1000:7], torch.full((20,), 143), 1201)
        for case in (seg, long):
            want, got = boxes_and_clip(case, t.S, t.S), kernel(case, t.S, t.S)
            print(all(t._same(a, b) for a, b in zip(want, got)))
    """)
    env = os.environ | {"TRITON_INTERPRET": "1", "YOLO_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["True", "True"], r.stdout


def _ours_after_mosaic(batch: SourceBatch, hyp: AugmentHyp, params) -> Labels:
    from yolofeed.augment.op import WarpPlan
    from yolofeed.augment.pipeline import WARP

    op = WARP[0]
    plan = op.warp_step(WarpPlan(S, batch.hw), params.mosaic, hyp)
    polygons, points = gp.source_polygons(batch.polygons, batch.polygon_lengths, batch.valid)
    labels = Labels(batch.cls, batch.boxes, batch.valid, polygons=polygons, polygon_points=points)
    return op.apply_polygons(labels, op.apply_boxes(labels, plan, params.mosaic, hyp), plan, params.mosaic, hyp)


@pytest.mark.parametrize("grid, long", [(4, None), (9, None), (4, LONG)], ids=["4", "9", "4-longer"])
def test_the_mosaic_moves_and_clips_polygons_as_ultralytics(grid, long):
    """``Mosaic`` alone: each tile's polygons denormalised and offset onto the canvas, resampled to the longest where
    the tiles differ (``Instances.concatenate``), clipped to it point by point; the stored boxes clipped and
    filtered; a sample without mosaic keeps its own."""
    batch = segment_batch(B, seed=grid, side=0.9, long=long)
    hyp = _hyp(mosaic=0.7, mosaic_grid=grid)
    params = GpuAugment(hyp).sample(B, torch.Generator().manual_seed(1))
    ours = _ours_after_mosaic(batch, hyp, params)
    ref = Reference(batch)
    kept = 0
    for b in range(B):
        labels = ultralytics_mosaic(ref, hyp, params, b)
        labels["instances"].denormalize(*labels["img"].shape[1::-1])  # a sample without mosaic: still normalised
        kept += assert_row(ours, b, labels)
    assert not params.mosaic.apply.all() and kept >= 3 * B
    seg = ours.polygons[ours.valid]
    assert (seg == 0).any()  # some points clipped to the canvas' edge
    if long:
        assert (ours.polygon_points == 1000).any() and (ours.polygon_points > 1000).any()


@pytest.mark.parametrize("kw, long", [
    ({}, None),  # Ultralytics' defaults: mosaic 1.0, translate 0.1, scale 0.5, affine
    ({"mosaic": 0.0, "degrees": 30.0, "shear": 5.0}, None),
    ({"degrees": 10.0, "perspective": 0.0008}, None),  # warpPerspective: the perspective divide
    ({"mosaic_grid": 9, "scale": 0.3}, None),
    ({"mosaic": 0.5, "translate": 0.3, "scale": 0.9, "degrees": 180.0}, None),  # many polygons across the edge
    ({"mosaic": 0.5, "degrees": 20.0}, LONG),
], ids=["default", "no-mosaic", "perspective", "mosaic9", "mixed", "longer"])
def test_mosaic_and_perspective_move_polygons_as_ultralytics(kw, long):
    """Mosaic then ``RandomPerspective``: the polygons through M, each box ``segment2box`` of its moved points, the
    points clipped to it, ``Instances.clip``, then ``box_candidates`` with area_thr 0.01."""
    batch = segment_batch(B, seed=len(kw), long=long)
    hyp = _hyp(**kw)
    aug = GpuAugment(hyp)
    params = aug.sample(B, torch.Generator().manual_seed(len(kw)))
    out = aug.geometry(batch, params)
    ref = Reference(batch)
    kept = sum(assert_row(out, b, ultralytics_geometry(ref, hyp, params, b)) for b in range(B))
    assert kept >= B


def test_a_bound_on_the_polygons_moved_keeps_the_first_valid_slots_as_every_slot_moves_them():
    """``warp_polygons`` with a capacity moves the valid slots first, in row order: at least as many as are valid,
    every valid slot's box, points and filter are those of the unbounded path bit for bit, and nothing is past it;
    fewer, the last valid slots (row-major) are dropped and counted."""
    from yolofeed.augment.geometry.perspective import warp_polygons

    g = torch.Generator().manual_seed(7)
    b, k, w = 8, 6, 50
    centre = torch.rand(b, k, 1, 2, generator=g) * 1.4 * S
    poly = centre + (torch.rand(b, k, w, 2, generator=g) - 0.5) * 60  # some across the output's edges, some beyond
    valid = torch.rand(b, k, generator=g) < 0.5
    valid[1] = False  # a row without labels
    boxes = torch.cat([poly.amin(2), poly.amax(2)], -1)
    M = torch.eye(3).repeat(b, 1, 1)
    M[:, :2, :2] += (torch.rand(b, 2, 2, generator=g) - 0.5) * 0.4  # scale, shear and rotation
    M[:, :2, 2] = -torch.rand(b, 2, generator=g) * 0.3 * S
    scale = torch.rand(b, generator=g) + 0.5
    labels = Labels(torch.zeros(b, k), boxes, valid, polygons=poly)
    every = warp_polygons(labels, M, scale, S)
    n = int(valid.sum())
    assert every.polygons_past is None and 6 < int(every.valid.sum()) < n  # some filtered, some kept
    for capacity in (n, n + 4):
        got = warp_polygons(labels, M, scale, S, capacity)
        v = got.valid
        assert torch.equal(v, every.valid) and int(got.polygons_past) == 0
        assert torch.equal(got.boxes[v], every.boxes[v]) and torch.equal(got.polygons[v], every.polygons[v])
    short = warp_polygons(labels, M, scale, S, n - 3)
    dropped = valid.flatten().nonzero()[-3:, 0]  # the last 3 valid slots, row-major
    kept = every.valid.flatten().clone()
    kept[dropped] = False
    assert torch.equal(short.valid.flatten(), kept) and int(short.polygons_past) == 3
    v = short.valid
    assert torch.equal(short.boxes[v], every.boxes[v]) and torch.equal(short.polygons[v], every.polygons[v])


@pytest.mark.parametrize("long", (None, LONG), ids=("1000", "longer"))
def test_the_pipeline_with_a_bound_on_the_polygons_gives_every_slots_labels(long):
    """``GpuAugment(polygon_capacity=)`` over every augmented row, MixUp's partners included: a bound above the valid
    slots entering the perspective (below every slot) gives the unbounded labels and polygons, nothing past it; a bound
    of one polygon leaves the rest out and says how many. (A tight bound: the test above.)"""
    batch = segment_batch(B, seed=3, long=long)
    hyp = _hyp(mixup=0.5, degrees=20.0, fliplr=0.5, flipud=0.5)
    params = GpuAugment(hyp).sample(B, torch.Generator().manual_seed(3))
    every = GpuAugment(hyp).apply(batch, params)
    slots = 2 * B * 4 * batch.valid.shape[1]  # 2 B rows (MixUp's partners) of a 4-tile mosaic; image 1 has none
    bounded = GpuAugment(hyp, polygon_capacity=slots - 1).apply(batch, params)
    assert bounded.polygons_past is not None and int(bounded.polygons_past) == 0 and every.polygons_past is None
    v = every.valid
    assert torch.equal(bounded.valid, v) and int(v.sum()) > B
    for name in ("cls", "boxes", "segments"):
        assert torch.equal(getattr(bounded, name)[v], getattr(every, name)[v]), name
    one = GpuAugment(hyp, polygon_capacity=1).apply(batch, params)
    assert int(one.valid.sum()) <= 2 and int(one.polygons_past) > B  # the first polygon and perhaps its mix


def test_perspective_keeps_a_polygon_with_more_than_1_percent_of_its_area():
    """Where the labels have segments Ultralytics keeps a box that keeps more than 1 % of its (scaled) area, where
    detection needs 10 %: a triangle pushed all but 5 % out of the output stays, its box the part left."""
    tri = torch.tensor([[0.0, 40.0], [100.0, 40.0], [0.0, 80.0]]) / S  # a right triangle, 100 x 40 px
    boxes = torch.tensor([[[50.0, 60.0, 100.0, 40.0]]]) / S
    batch = SourceBatch(torch.zeros((1, S, S, 3), dtype=torch.uint8), torch.tensor([[S, S]]), torch.zeros(1, 1), boxes,
                        torch.ones(1, 1, dtype=torch.bool), polygons=tri[None, None],
                        polygon_lengths=torch.tensor([[3]]))
    aug = GpuAugment(_hyp(mosaic=0.0))
    params = aug.sample(1, torch.Generator().manual_seed(0))
    one = torch.ones(1, dtype=torch.float64)
    params.perspective = dataclasses.replace(params.perspective, scale=one, translate_x=one * (0.5 + 155 / S),
                                             translate_y=one * 0.5)  # 155 px to the right: x in [155, 255]
    out = aug.apply(batch, params)
    assert out.valid[0, 0] and not out.valid[0, 1:].any()
    torch.testing.assert_close(out.boxes[0, 0], torch.tensor([155.0, 40.0, 160.0, 80.0]))  # the visible part
    assert_row(aug.geometry(batch, params), 0, ultralytics_geometry(Reference(batch), aug.hyp, params, 0))
    assert not aug.apply(dataclasses.replace(batch, polygons=None, polygon_lengths=None), params).valid.any()


def test_flips_move_the_polygons_as_ultralytics():
    seg = torch.from_numpy(_random_polygons(np.random.default_rng(2), 3)).clamp(0, S)[None]
    boxes = gp.polygon_boxes(seg, S, S)
    for ud, lr in ((True, False), (False, True), (True, True), (False, False)):
        labels = {"img": np.zeros((S, S, 3), np.uint8), "instances": Instances(
            boxes[0].numpy().copy(), seg[0].numpy().copy(), bbox_format="xyxy", normalized=False)}
        theirs = ultralytics_flips(labels, ud, lr)["instances"]
        flip = geometry.RandomFlip("flipud"), geometry.RandomFlip("fliplr")
        ours = Labels(torch.zeros(1, 3), boxes, torch.ones(1, 3, dtype=torch.bool), polygons=seg)
        for op, on in zip(flip, (ud, lr)):
            on = torch.tensor([on])
            ours = op.apply_polygons(ours, op.apply_boxes(ours, None, on, _hyp()), None, on, _hyp())
        assert np.array_equal(ours.polygons[0].numpy(), theirs.segments)  # S - x: exact
        theirs.convert_bbox("xyxy")
        np.testing.assert_allclose(ours.boxes[0].numpy(), theirs.bboxes, atol=1e-4)


def _labels_of(rows, k: int) -> dict:
    """Row ``k`` of our augmented rows as Ultralytics' labels dict (HWC image, xyxy pixel boxes, its n-point
    segments)."""
    v = rows.valid[k]
    n = gp.POINTS if rows.polygon_points is None else int(rows.polygon_points[k])
    return {"img": np.ascontiguousarray(rows.img[k].permute(1, 2, 0).numpy()), "cls": rows.cls[k][v].numpy()[:, None],
            "instances": Instances(rows.boxes[k][v].numpy().copy(), rows.polygons[k][v][:, :n].numpy().copy(),
                                   bbox_format="xyxy", normalized=False)}


def _compose_labels(aug: GpuAugment, batch: SourceBatch, params) -> Labels:
    """The samples' labels after the pixel ops, polygon_points included."""
    rows = aug.geometry(batch, params)
    b = params.size
    points = None if rows.polygon_points is None else rows.polygon_points[:b]
    labels = Labels(rows.cls[:b], rows.boxes[:b], rows.valid[:b], polygons=rows.polygons[:b], polygon_points=points)
    for op in COMPOSE:
        term = op.compose_term(getattr(params, op.name), labels, rows, aug.hyp)
        labels = op.apply_polygons(labels, op.apply_boxes(labels, rows, term), rows, term)
    return labels


@pytest.mark.parametrize("long", [None, LONG], ids=["1000", "longer"])
def test_mixup_keeps_both_images_polygons_as_ultralytics(long):
    batch = segment_batch(B, seed=7, long=long)
    aug = GpuAugment(_hyp(mixup=0.6))
    params = aug.sample(B, torch.Generator().manual_seed(7))
    base = aug.geometry(batch, params)
    ours = _compose_labels(aug, batch, params)
    assert params.mixup.apply.any() and not params.mixup.apply.all()
    for b in range(B):
        labels = _labels_of(base, b)
        if bool(params.mixup.apply[b]):
            labels["mix_labels"] = [_labels_of(base, int(params.mixup.partner[b]))]
            labels = MixUp(Reference(batch), p=1.0).apply_instances(labels, {})
        assert_row(ours, b, labels)
    out = aug.apply(batch, params)
    assert torch.equal(out.segments, ours.polygons) and torch.equal(out.valid, ours.valid)


def _ultralytics_cutmix(labels: dict, partner: dict, params, b: int) -> dict:
    """Ultralytics' CutMix (segment: no preserve_obb) on sample b's labels with our draws."""
    cm = CutMix(SimpleNamespace(get_image_and_label=lambda i: partner, use_obb=False), p=1.0)
    c = (params.cutmix.centre[b] * S).floor().long().tolist()
    areas = mix.cutmix_areas(params.cutmix, S)[b].numpy()
    inst = labels["instances"]
    inst.convert_bbox("xyxy")
    free = [k for k in range(3) if bbox_ioa(areas[k:k + 1], inst.bboxes).sum() <= 0]
    chosen = max(free, key=lambda k: float(params.cutmix.pick[b, k])) if free else None
    with mock.patch.object(cm, "get_indexes", return_value=0), \
            mock.patch.object(np.random, "beta", side_effect=params.cutmix.lam[b].tolist()), \
            mock.patch.object(np.random, "randint", side_effect=[v for k in range(3) for v in c[k]]), \
            mock.patch.object(np.random, "choice", return_value=chosen):
        cp = cm.get_params(labels)
    labels = cm.apply_instances(cm.apply_image(labels, cp), cp)
    labels.pop("mix_labels", None)
    return labels


@pytest.mark.parametrize("long", [None, {(2, 0): 1100, (5, 1): 1300}], ids=["1000", "longer"])
def test_cutmix_takes_the_partner_polygons_as_ultralytics(long):
    """The partner's polygons with at least 1 % of their box in the area (10 % where the sample has none), their
    points clipped to the area; the sample's and the partner's resampled to the longer where they differ."""
    checked = taken = 0
    for seed in range(3):
        batch = segment_batch(B, seed=10 + seed, width=3, side=0.5, long=long)
        aug = GpuAugment(_hyp(cutmix=1.0, mosaic=0.0, scale=0.9))
        params = aug.sample(B, torch.Generator().manual_seed(seed))
        base = aug.geometry(batch, params)
        ours = _compose_labels(aug, batch, params)
        k = base.valid.shape[1]
        for b in range(B):
            partner = _labels_of(base, int(params.cutmix.partner[b]))
            checked += assert_row(ours, b, _ultralytics_cutmix(_labels_of(base, b), partner, params, b)) > 0
        taken += int(ours.valid[:, k:].sum())
    assert checked >= 10 and taken >= 3


@pytest.mark.parametrize("kw, n, labels", [
    ({"mixup": 0.5, "flipud": 0.5, "fliplr": 0.5, "degrees": 30.0, "translate": 0.2}, B, {}),
    ({"mixup": 0.5, "cutmix": 1.0, "mosaic": 0.0, "scale": 0.9}, 12, {"width": 2, "side": 0.3}),  # room to paste
    ({"mixup": 0.5, "fliplr": 0.5}, B, {"long": LONG}),
], ids=["mixup-flips", "mixup-cutmix", "longer"])
def test_the_pipeline_gives_ultralytics_segment_labels(kw, n, labels):
    """v8_transforms' ops in its order for task=segment (Mosaic, RandomPerspective, MixUp, CutMix, RandomFlip up-down
    and left-right), our draws replayed, against ``AugmentedBatch.segments``, boxes, classes and ``valid``: what
    ``Format`` makes its masks and boxes of.

    As for OBB (test_augment_obb.py): our flips run per row before mixing, so the partners' flip draws are set to
    their sample's; with CutMix on the flips are off.
    """
    batch = segment_batch(n, seed=21, **labels)
    hyp = _hyp(**({"hsv_h": 0.015} | kw))  # HSV leaves the labels alone
    aug = GpuAugment(hyp)
    params = aug.sample(n, torch.Generator().manual_seed(21))
    for f in ("flipud", "fliplr"):
        flips = getattr(params, f)
        setattr(params, f, flips[:n].repeat(len(flips) // n))  # each partner row flips as its sample
    out = aug.apply(batch, params)
    ref = Reference(batch)
    kept = pasted = 0
    for b in range(n):
        labels = ultralytics_geometry(ref, hyp, params, b)
        if hyp.mixup and bool(params.mixup.apply[b]):
            labels["mix_labels"] = [ultralytics_geometry(ref, hyp, params, int(params.mixup.partner[b]))]
            labels = MixUp(ref, p=1.0).apply_instances(labels, {})
            labels.pop("mix_labels")
        if hyp.cutmix and bool(params.cutmix.apply[b]):
            partner = ultralytics_geometry(ref, hyp, params, int(params.cutmix.partner[b]))
            before = len(labels["instances"])
            labels = _ultralytics_cutmix(labels, partner, params, b)
            pasted += len(labels["instances"]) > before
        labels = ultralytics_flips(labels, bool(params.flipud[b]), bool(params.fliplr[b]))
        kept += assert_row(out, b, labels, out.segments)
    assert kept > 2 * n and out.kinds() == ("segments",)
    if hyp.cutmix:
        assert pasted >= 2


def test_probability_zero_is_the_identity_for_polygons():
    """Nothing on: an S x S image's polygons come out as their resample in pixels, each box their bounds (the
    stored box, up to float32 rounding)."""
    batch = segment_batch(B, seed=3)
    batch.hw[:] = S
    hyp = AugmentHyp(imgsz=S, mosaic=0.0, translate=0.0, scale=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, fliplr=0.0)
    out = GpuAugment(hyp)(batch, torch.Generator().manual_seed(0))
    n = batch.valid.shape[1]
    v = out.valid[:, :n]
    assert v.sum() > B and torch.equal(v, batch.valid) and not out.valid[:, n:].any()
    resampled, _ = gp.source_polygons(batch.polygons, batch.polygon_lengths, batch.valid)
    assert torch.equal(out.segments[:, :n][v], (resampled * S)[v])
    torch.testing.assert_close(out.boxes[:, :n][v], geometry.xywhn_to_xyxy(batch.boxes, batch.hw[:, None])[v])


def test_a_detection_batch_draws_as_before():
    """The same batch with and without polygons: the same draws (polygons add none), the same pixels."""
    batch = segment_batch(B, seed=4)
    detection = dataclasses.replace(batch, polygons=None, polygon_lengths=None)
    hyp = AugmentHyp(imgsz=S, mixup=0.5, cutmix=0.5, degrees=5.0, flipud=0.3)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    plain, segmented = GpuAugment(hyp)(detection, g1), GpuAugment(hyp)(batch, g2)
    assert torch.equal(g1.get_state(), g2.get_state())
    assert plain.segments is None and plain.kinds() == () and segmented.kinds() == ("segments",)
    p = GpuAugment(hyp).sample(B, torch.Generator().manual_seed(1))
    p.cutmix.apply[:] = False  # CutMix takes partner boxes from 1 % with segments: the pasted pixels may differ
    assert torch.equal(GpuAugment(hyp).apply(detection, p).img, GpuAugment(hyp).apply(batch, p).img)


def test_what_the_augmentation_cannot_do_is_refused():
    """Every op carries polygons; a batch without their lengths, or of the wrong shape, is refused in one line, and
    so is ``to_ultralytics`` of polygons whose masks are not made."""
    assert CARRIED == ("keypoints", "corners", "polygons")
    batch = segment_batch(2, seed=5)
    aug = GpuAugment(_hyp())
    with pytest.raises(ConfigError, match="no polygon_lengths"):
        aug(dataclasses.replace(batch, polygon_lengths=None))
    with pytest.raises(ConfigError, match=r"polygons of shape \(2, 4, 80\)"):
        aug(dataclasses.replace(batch, polygons=batch.polygons.reshape(2, 4, -1)))
    out = aug(batch, torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match="no masks.*polygons2masks"):
        out.to_ultralytics()


def test_the_pool_keeps_polygons_and_gives_the_gathered_batch():
    """Partners from a PartnerPool's ring: the same polygons as the images gathered as a batch."""
    batch = segment_batch(B, seed=6, width=3)
    aug, pool = GpuAugment(_hyp(mixup=0.5, degrees=5.0)), PartnerPool(12, B)
    first = pool.push(batch)
    params = aug.sample(B, torch.Generator().manual_seed(6), partners=pool.partners(first, B))
    pooled = aug.apply(pool.sources, params)
    assert pool.sources.resampled_polygons.dtype == torch.float32 and pool.sources.polygons is None
    pad = pool.sources.valid.shape[1] - 3
    gathered = SourceBatch(batch.images, batch.hw, torch.nn.functional.pad(batch.cls, (0, pad)),
                           torch.nn.functional.pad(batch.boxes, (0, 0, 0, pad)),
                           torch.nn.functional.pad(batch.valid, (0, pad)),
                           polygons=torch.nn.functional.pad(batch.polygons, (0, 0, 0, 0, 0, pad)),
                           polygon_lengths=torch.nn.functional.pad(batch.polygon_lengths, (0, pad)))
    plain = aug.apply(gathered, params)
    assert torch.equal(pooled.valid, plain.valid) and pooled.valid.any()
    assert torch.equal(pooled.segments[pooled.valid], plain.segments[plain.valid])
    with pytest.raises(ValueError, match="polygons"):
        pool.push(dataclasses.replace(batch, polygons=None, polygon_lengths=None))  # one pool, one dataset


@pytest.mark.parametrize("long", [False, True], ids=["1000", "longer"])
def test_the_pool_keeps_each_row_resampled_as_it_was_pushed(long):
    """The ring resamples each batch's polygons once, as it enters: after pushes of several label widths that wrap
    around, every row holds ``source_polygons`` of the row pushed there (its zeros past the labels included), and
    the ring keeps no polygons as stored."""
    pool, pushed = PartnerPool(7, 4), []  # 10 rows: the fourth batch wraps
    for seed, width in ((40, 3), (41, 2), (42, 4), (43, 1)):
        batch = segment_batch(4, seed=seed, width=width, long=long and {(0, 0): 1200})
        pad = (1200 if long else 40) - batch.polygons.shape[2]  # the loader pads to the dataset's longest
        pushed.append(dataclasses.replace(batch, polygons=torch.nn.functional.pad(batch.polygons, (0, 0, 0, pad))))
        pool.push(pushed[-1])
    ring = pool.sources
    assert ring.polygons is None and ring.polygon_lengths is None  # kept resampled only
    rows = [8, 9, 0, 1] + [2, 3, 4, 5] + [6, 7]  # the third batch's, the fourth's, the second's last two
    slots = ring.valid.shape[1]
    stored = [(b, i) for b in pushed[2:] for i in range(4)] + [(pushed[1], 2), (pushed[1], 3)]
    polygons = torch.stack([torch.nn.functional.pad(b.polygons[i], (0, 0, 0, 0, 0, slots - b.valid.shape[1]))
                            for b, i in stored])
    lengths = torch.stack([torch.nn.functional.pad(b.polygon_lengths[i], (0, slots - b.valid.shape[1]))
                           for b, i in stored])
    assert torch.equal(torch.stack([torch.nn.functional.pad(b.valid[i], (0, slots - b.valid.shape[1]))
                                    for b, i in stored]), ring.valid[rows])
    ours, points = gp.source_polygons(polygons, lengths, ring.valid[rows])
    assert torch.equal(ring.resampled_polygons[rows], ours) and ring.valid.any()
    assert (points is None) == (not long) and (ring.resampled_points is None) == (not long)
    if points is not None:
        assert torch.equal(ring.resampled_points[rows], points) and points.tolist().count(1201) == 2  # rows 8, 2


@pytest.mark.parametrize("long", [False, True], ids=["1000", "longer"])
def test_the_pools_memory_line_counts_its_resampled_polygons(long):
    """``PartnerPool.nbytes`` with the most labels an image has and points a polygon has: the ring's images and its
    resampled polygons as allocated (the per-row counts aside)."""
    batch = segment_batch(4, seed=45, width=3, long=long and {(0, 0): 1200})
    pool = PartnerPool(8, 4)
    pool.push(batch)
    ring = pool.sources
    assert pool.nbytes(S, 3, batch.polygons.shape[2]) == ring.images.nbytes + ring.resampled_polygons.nbytes
    assert pool.nbytes(S, 3, 0) == ring.images.nbytes  # without polygons: the images alone


@pytest.mark.parametrize("long", [False, True], ids=["1000", "longer"])
def test_a_batch_without_label_slots_enters_a_pool_of_polygons(long):
    """A batch of no label slots (L = 0) pushed into a pool that holds polygons: its rows have none, and the ops run."""
    pool, aug = PartnerPool(8, 4), GpuAugment(_hyp(degrees=5.0))
    full = segment_batch(4, seed=44, long=long and {(0, 0): 1200})
    empty = SourceBatch(full.images, full.hw, full.cls[:, :0], full.boxes[:, :0], full.valid[:, :0],
                        polygons=full.polygons[:, :0], polygon_lengths=full.polygon_lengths[:, :0])
    pool.push(full)
    first = pool.push(empty)
    out = aug.apply(pool.sources, aug.sample(4, torch.Generator().manual_seed(44), partners=pool.partners(first, 4)))
    assert not pool.sources.valid[4:].any() and out.segments.shape[:2] == out.valid.shape
    resampled, _ = gp.source_polygons(empty.polygons, empty.polygon_lengths, empty.valid)
    assert resampled.shape[:2] == (4, 0)


def test_a_copy_to_another_device_keeps_the_polygon_lengths():
    from yolofeed.loader.prefetch import to_device_source

    batch = segment_batch(2, seed=8)
    copy = to_device_source(batch, "cpu")
    assert torch.equal(copy.polygons, batch.polygons) and torch.equal(copy.polygon_lengths, batch.polygon_lengths)
    pool = PartnerPool(4, 2)
    pool.push(batch)
    ring = to_device_source(pool.sources, "cpu")  # a ring keeps its polygons resampled only
    assert torch.equal(ring.resampled_polygons, pool.sources.resampled_polygons) and ring.polygons is None


def _on_cuda(batch: SourceBatch) -> SourceBatch:
    return SourceBatch(*(t.cuda() for t in (batch.images, batch.hw, batch.cls, batch.boxes, batch.valid)),
                       polygons=batch.polygons.cuda(), polygon_lengths=batch.polygon_lengths.cuda())


@pytest.mark.gpu
@pytest.mark.parametrize("long", [None, LONG], ids=["1000", "longer"])
@pytest.mark.parametrize("bound", [None, 200], ids=["every-slot", "bounded"])
def test_cuda_polygons_equal_the_cpu_path_and_make_no_host_sync(long, bound):
    batch = segment_batch(16, seed=30, long=long)
    aug = GpuAugment(_hyp(mixup=0.5, cutmix=0.5, degrees=20.0, translate=0.2, fliplr=0.5, flipud=0.2),
                     polygon_capacity=bound)  # 200 of 768 slots: 48 rows (the partners too) of 4 tiles of 4 slots
    params = aug.sample(16, torch.Generator().manual_seed(30))
    ref, got = aug.apply(batch, params), aug.apply(_on_cuda(batch), to_device(params, "cuda"))
    assert torch.equal(got.valid.cpu(), ref.valid)
    if bound is not None:  # and on the device, every slot it kept as every slot moved: the same bits
        assert int(got.polygons_past) == int(ref.polygons_past)
        every = GpuAugment(aug.hyp).apply(_on_cuda(batch), to_device(params, "cuda"))
        k = got.valid
        assert bool((k <= every.valid).all()) and int(k.sum()) > 16
        assert torch.equal(got.boxes[k], every.boxes[k]) and torch.equal(got.segments[k], every.segments[k])
    v = ref.valid
    torch.testing.assert_close(got.boxes.cpu()[v], ref.boxes[v], atol=TOL, rtol=0)
    torch.testing.assert_close(got.segments.cpu()[v], ref.segments[v], atol=TOL, rtol=0)
    cuda, g = _on_cuda(batch), torch.Generator(device="cuda").manual_seed(0)
    pool = PartnerPool(40, 16)
    for run in (lambda: aug(cuda, g), lambda: aug(cuda, g, pool)):
        run()  # warm up: Triton compiles on first use
        with no_host_sync():
            out = run()
        assert out.segments.shape[:2] == out.valid.shape


@pytest.mark.gpu
def test_cuda_polygon_boxes_kernel_equals_the_torch_ops():
    """On CUDA the perspective's boxes and clip are one Triton program a polygon: bit for bit the torch ops on the
    same device and on the CPU, for 600 polygons inside, outside and across the image and the edge cases."""
    from yolofeed.augment.geometry.polygons import boxes_and_clip
    from yolofeed.kernels.polygon_boxes_triton import boxes_and_clip as kernel

    seg = _box_cases(600)
    cpu, cuda, got = boxes_and_clip(seg, S, S), boxes_and_clip(seg.cuda(), S, S), kernel(seg.cuda(), S, S)
    for a, b, c in zip(cpu, cuda, got):
        assert _same(b, c) and _same(a, c.cpu())
    assert (got[0].cpu() > 0).any(1).sum() > 300 and torch.equal(got[0][3].cpu(), torch.tensor([0.0, 0, S, S]))


@pytest.mark.gpu
def test_graphed_augment_carries_polygons():
    from yolofeed.augment.graphs import GraphedAugment

    cuda = _on_cuda(segment_batch(16, seed=31))
    aug = GpuAugment(_hyp(mixup=0.3, degrees=5.0, fliplr=0.5))
    for pool in (None, PartnerPool(40, 16)):
        a, b = GraphedAugment(aug, seed=7, pool=pool), GraphedAugment(aug, seed=7, pool=pool and PartnerPool(40, 16))
        first = [x.segments.clone() for x in (a(cuda), b(cuda))]
        assert torch.equal(first[0], first[1])  # same seed, same draws
        with no_host_sync():
            out = a(cuda)
        assert a.captured == 1 and not torch.equal(out.segments, first[0])  # each replay draws anew
        assert out.segments.shape == (*out.valid.shape, gp.POINTS, 2)

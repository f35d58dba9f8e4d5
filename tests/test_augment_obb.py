"""Oriented boxes (OBB) through every op: equal to Ultralytics' own transforms given the same draws.

As ``test_augment_keypoints.py`` does for pose: yolofeed draws, and the draws are replayed through Ultralytics'
``Mosaic``, ``RandomPerspective``, ``MixUp``, ``CutMix``, ``RandomFlip`` and ``Format(return_obb=True)``, built as
``v8_transforms`` builds them for an OBB dataset (``preserve_obb``), on ``Instances`` whose segments are
``YOLODataset.update_labels_info``'s 100-point resample of the same corners. Points and boxes agree within 1e-3 px,
classes exactly, row for row. A segment that the OBB clip replaced is a rectangle whose corners may start from
another corner than Ultralytics' (the frame's direction is taken mod pi): such rows are compared as corner sequences.
The oriented boxes are compared as rectangles (``xyxyxyxy2xywhr`` from the 4 corners here, from all 100 points
there), theta where the sides differ.

Where a segment's minimum-area rectangle is not unique, which one comes out is decided by rounding, here as in
OpenCV (whose ``minAreaRect`` sees all 100 points, each a float32 rounding off its edge). Exact ties are rare (a
rhombus: ``test_a_tied_frame_gives_one_of_ultralytics_rectangles``); near ties are not: the rectangles along two
edges that meet at an almost right angle, as an annotator's quadrilateral has 4 of, differ in area by about 1e-5 of
it and in angle by the corner's deviation from 90 degrees. So the replay answers the clip's ``cv2.minAreaRect`` with
our frame where ours is as small within ``TIED`` (``TiesAsOurs``: Ultralytics' own clip, in the frame rounding gave
us), and ``Format``'s boxes are compared as ``test_rboxes.py`` compares them: the same rectangle, or, where the
minimum is so tied, a rectangle as small that holds every point.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace
from unittest import mock

import cv2
import numpy as np
import pytest
import replay
import torch
from ultralytics.data.augment import CutMix, Format, MixUp
from ultralytics.data.dataset import YOLODataset
from ultralytics.utils import instance as ul_instance
from ultralytics.utils import ops
from ultralytics.utils.instance import Instances
from ultralytics.utils.metrics import bbox_ioa

from helpers import no_host_sync, to_device
from yolofeed.augment import AugmentHyp, GpuAugment, geometry, mix
from yolofeed.augment.geometry import obb
from yolofeed.augment.op import Labels, WarpPlan
from yolofeed.augment.pipeline import WARP
from yolofeed.augment.pool import PartnerPool
from yolofeed.schema import SourceBatch

S, B = 160, 6
V = list(obb.VERTICES)
TOL = 1e-3  # px: float32 products summed in another order (cv2, numpy's BLAS)
FRAME_TOL = 3e-3  # px, a clip rectangle's corners: cv2 measures its frame on short hull edges between float32 points
TIED = 1e-4  # two minimum-area rectangles whose areas differ by less than this fraction are tied
OBB_DATASET = SimpleNamespace(use_obb=True, use_segments=False, format_class=Format)  # what update_labels_info reads


def rectangles(rng: np.random.Generator, n: int, hw: tuple[int, int], side: float, jitter: float) -> np.ndarray:
    """n turned rectangles inside an image of ``hw``, 1.25 to 5 times as long as wide, their corners moved by up to
    ``jitter`` of their length (quadrilaterals as annotators click them); one in five touches the left edge.
    Shape: (n, 4, 2) float32 normalised."""
    h, w = hw
    length = rng.uniform(0.08, side, n) * min(h, w)
    width = length * rng.uniform(0.2, 0.8, n)
    a = rng.uniform(0, math.pi, n)
    local = np.array([[1, 1], [-1, 1], [-1, -1], [1, -1]]) / 2 * np.stack([length, width], -1)[:, None]
    rot = np.stack([np.stack([np.cos(a), -np.sin(a)], -1), np.stack([np.sin(a), np.cos(a)], -1)], -2)
    centre = rng.uniform(0.15, 0.85, (n, 1, 2)) * [w, h]
    pts = centre + np.einsum("nij,npj->npi", rot, local)
    pts += rng.uniform(-jitter, jitter, (n, 4, 2)) * length[:, None, None]
    half = np.abs(pts - centre).max(1)  # shrink about the centre to fit the image
    room = np.minimum(centre[:, 0], [w, h] - centre[:, 0])
    pts = centre + (pts - centre) * np.minimum(1, (room / half).min(1))[:, None, None]
    edge = rng.random(n) < 0.2
    pts[edge, :, 0] -= pts[edge, :, 0].min(1, keepdims=True)
    return np.clip(pts / [w, h], 0, 1).astype(np.float32)


def obb_batch(n: int, seed: int, width: int = 5, side: float = 0.5, jitter: float = 0.04) -> SourceBatch:
    """n random images of assorted sizes with ``width`` label slots of oriented boxes, as the loader gives them:
    corners normalised, each box their enclosing box (``segments2boxes``)."""
    rng = np.random.default_rng(seed)
    hw = rng.integers(S // 2, S + 1, (n, 2))
    corners = np.stack([rectangles(rng, width, tuple(hw[i]), side, jitter) for i in range(n)])
    boxes = np.stack([ops.segments2boxes(list(c)) for c in corners]).astype(np.float32)
    return SourceBatch(torch.from_numpy(rng.integers(0, 256, (n, S, S, 3), dtype=np.uint8)), torch.from_numpy(hw),
                       torch.from_numpy(rng.integers(0, 4, (n, width)).astype(np.float32)), torch.from_numpy(boxes),
                       torch.from_numpy(rng.random((n, width)) < 0.85), corners=torch.from_numpy(corners))


def frame_area(points: np.ndarray, theta: float) -> float:
    """The area of the rectangle around ``points`` along direction ``theta`` (radians), in float64."""
    u = np.array([math.cos(theta), math.sin(theta)])
    p = points.astype(np.float64)
    return float(np.ptp(p @ u) * np.ptp(p @ np.array([-u[1], u[0]])))


class TiesAsOurs:
    """``cv2`` as ``ultralytics.utils.instance`` sees it, where ``minAreaRect`` of a segment (the OBB clip's frame)
    answers with our frame if ours is tied with OpenCV's: as small within ``TIED``, yet another direction.

    Attributes:
        ties: for each answer so changed, how much larger our frame's area is than OpenCV's (a fraction; < 0: smaller).
    """

    def __init__(self):
        self.ties: list[float] = []

    def __getattr__(self, name: str):
        return getattr(cv2, name)

    def minAreaRect(self, points):  # noqa: N802 (cv2's name)
        r = cv2.minAreaRect(points)
        pts = np.asarray(points, np.float32).reshape(-1, 2)
        if len(pts) != obb.POINTS:
            return r
        ours = float(obb.clip_frame(torch.from_numpy(pts[V])))
        theirs = math.radians(r[2] + (90 if r[1][0] < r[1][1] else 0))
        if abs((ours - theirs + math.pi / 4) % (math.pi / 2) - math.pi / 4) < 1e-4:  # the same frame
            return r
        gap = frame_area(pts, ours) / max(frame_area(pts, theirs), 1e-12) - 1
        if gap > TIED:
            return r  # not tied: the replay keeps OpenCV's frame, and a test comparing with it fails
        self.ties.append(gap)
        return r[0], (1.0, 0.0), math.degrees(ours)  # width along our frame: the clip turns nothing


@pytest.fixture
def ties():
    """Ultralytics' OBB clip with tied frames broken as ours are (``TiesAsOurs``), for the test's replay."""
    proxy = TiesAsOurs()
    with mock.patch.object(ul_instance, "cv2", proxy):
        yield proxy


class Reference:
    """Ultralytics' view of an ``obb_batch``: ``get_image_and_label`` as ``YOLODataset`` gives it for task=obb."""

    cache, buffer, use_obb = None, [], True  # use_obb: the mix transforms' preserve_obb

    def __init__(self, batch: SourceBatch):
        self.batch = batch

    def get_image_and_label(self, i: int) -> dict:
        b = self.batch
        h, w = b.hw[i].tolist()
        v = b.valid[i]
        label = {"im_file": f"{i}.jpg", "img": np.ascontiguousarray(b.images[i, :h, :w].numpy()[..., ::-1]),
                 "ori_shape": (h, w), "resized_shape": (h, w), "cls": b.cls[i][v].numpy()[:, None].copy(),
                 "bboxes": b.boxes[i][v].numpy().copy(), "segments": list(b.corners[i][v].numpy().copy()),
                 "keypoints": None, "bbox_format": "xywh", "normalized": True}
        return YOLODataset.update_labels_info(OBB_DATASET, label)


def ultralytics_mosaic(ref: Reference, hyp: AugmentHyp, params, row: int) -> dict:
    return replay.mosaic(ref, hyp, params, row, S)


def ultralytics_geometry(ref: Reference, hyp: AugmentHyp, params, row: int) -> dict:
    return replay.geometry(ref, hyp, params, row, S, preserve_obb=True)  # as v8_transforms builds it for OBB


def ultralytics_flips(labels: dict, ud: bool, lr: bool) -> dict:
    return replay.flips(labels, ud, lr, S)


def assert_segments(ours: torch.Tensor, theirs: np.ndarray, what: str = "") -> int:
    """Row for row the same 100 points within TOL, or the same clip rectangle (within FRAME_TOL) with its corners
    from another start (its 100 points then resample the corners from there). Shape: (n, 100, 2) both. Returns the
    rows of the second kind."""
    ours = ours.numpy()
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    turned = 0
    for r in np.flatnonzero(np.abs(ours - theirs).max((1, 2)) > TOL):
        gap = min(np.abs(np.roll(ours[r][V], k, 0) - theirs[r][V]).max() for k in range(4))
        tol = FRAME_TOL if clipped(theirs[r:r + 1])[0] else TOL
        assert gap <= tol, f"{what} row {r}: corners {ours[r][V].tolist()}, Ultralytics' {theirs[r][V].tolist()}"
        turned += 1
    return turned


def assert_row(out, b: int, labels: dict) -> int:
    """Sample b of our labels (boxes, valid, segments) against Ultralytics': the same rows kept, boxes and points."""
    inst = labels["instances"]
    inst.convert_bbox("xyxy")
    v = out.valid[b]
    assert int(v.sum()) == len(inst), f"sample {b}: {int(v.sum())} boxes kept, Ultralytics kept {len(inst)}"
    np.testing.assert_allclose(out.boxes[b][v].numpy(), inst.bboxes, atol=TOL, rtol=0, err_msg=f"sample {b}")
    np.testing.assert_array_equal(out.cls[b][v].numpy(), labels["cls"][:, 0])
    assert_segments(out.segments[b][v], inst.segments, f"sample {b}")
    return len(inst)


def clipped(segments: np.ndarray) -> np.ndarray:
    """Which segments are clip rectangles (their 4 corners at right angles), not moved corners. Shape (n, 100, 2)."""
    q = segments[:, V].astype(np.float64)
    d = np.roll(q, -1, 1) - q
    dots = np.abs((d * np.roll(d, -1, 1)).sum(-1)) / (np.linalg.norm(d, axis=-1) * np.linalg.norm(np.roll(d, -1, 1),
                                                                                                   axis=-1) + 1e-9)
    return dots.max(1) < 1e-4


def _hyp(**kw) -> AugmentHyp:
    return AugmentHyp(**({"imgsz": S, "hsv_h": 0, "hsv_s": 0, "hsv_v": 0, "fliplr": 0} | kw))


def test_the_corners_are_resampled_as_ultralytics_resamples_them():
    """Bit for bit, ``resample_segments(n=100)`` of any 4 points; the corners land at ``VERTICES``."""
    c = np.random.default_rng(0).uniform(-0.2, 1.2, (300, 4, 2)).astype(np.float32)
    ours = obb.resample_corners(torch.from_numpy(c))
    theirs = np.stack(ops.resample_segments(list(c.copy()), obb.POINTS))
    assert ours.dtype == torch.float32 and np.array_equal(ours.numpy(), theirs)
    assert np.array_equal(theirs[:, V], c)
    assert torch.equal(obb.vertices(ours), torch.from_numpy(c))


def _segments(rng: np.random.Generator, n: int, size: tuple[int, int] = (200, 160)) -> np.ndarray:
    """Resampled turned rectangles and sheared ones (parallelograms), centred anywhere within a third of the image's
    size of it: many cross its edge. Shape: (n, 100, 2) float32 pixels."""
    w, h = size
    xywhr = np.column_stack([rng.uniform(-w / 3, 4 * w / 3, n), rng.uniform(-h / 3, 4 * h / 3, n),
                             rng.uniform(0.02, 0.75, n) * max(size), np.zeros(n), rng.uniform(-4, 4, n)])
    xywhr[:, 3] = xywhr[:, 2] * rng.uniform(0.2, 0.8, n)
    q = ops.xywhr2xyxyxyxy(xywhr)
    shear = np.tan(np.radians(rng.uniform(-15, 15, (n, 1))))
    q[1::2, :, 0] += (shear * (q[..., 1] - q[..., 1].mean(1, keepdims=True)))[1::2]
    return np.stack(ops.resample_segments(list(q.astype(np.float32)), obb.POINTS))


def test_visible_part_is_opencvs_intersection():
    """The quadrilateral's part inside the image: the area and bounds of ``cv2.intersectConvexConvex`` with its hull,
    in either orientation and with its corners in any order (``hull4``: crossed or with one corner inside)."""
    rng = np.random.default_rng(1)
    seg = _segments(rng, 600)
    quad = seg[:, V].copy()
    quad[1::3] = quad[1::3, ::-1]  # clockwise
    quad[2::6] = quad[2::6][:, [0, 2, 1, 3]]  # crossed
    quad[5::6, 3] = quad[5::6, :3].mean(1)  # a corner inside the triangle of the others
    pts, ok, area = obb.visible_part(obb.hull4(torch.from_numpy(quad)), torch.tensor(200.0), torch.tensor(160.0))
    canvas = np.array(((0, 0), (200, 0), (200, 160), (0, 160)), np.float32)
    seen = 0
    for i in range(len(quad)):
        va, vis = cv2.intersectConvexConvex(cv2.convexHull(quad[i]), canvas)
        if vis is None or va <= 0:
            assert float(area[i]) < 1e-3, i
            continue
        seen += 1
        assert abs(float(area[i]) - va) <= 1e-4 * va + 1e-3, (i, float(area[i]), va)
        p, vis = pts[i][ok[i]].numpy(), vis.reshape(-1, 2)
        np.testing.assert_allclose(np.r_[p.min(0), p.max(0)], np.r_[vis.min(0), vis.max(0)], atol=TOL, rtol=0)
    assert 200 < seen < len(quad)


@pytest.mark.parametrize("size", [(200, 160), (37, 53)])
def test_the_obb_clip_is_instances_clip_preserving_obb(size, ties):
    """``clip_obb`` against ``Instances.clip(w, h, preserve_obb=True)``: the same boxes (the visible part's bounds,
    zero where nothing is visible, unclipped inside), the same segments (inside: as they were; else the rectangle of
    the visible part in the segment's own frame, 100 points)."""
    rng = np.random.default_rng(sum(size))
    seg = _segments(rng, 1500, size)
    box = np.concatenate([seg.min(1), seg.max(1)], 1) + rng.uniform(-0.5, 0.5, (len(seg), 4)).astype(np.float32)
    inst = Instances(box.copy(), seg.copy(), bbox_format="xyxy", normalized=False)
    inst.clip(*size, preserve_obb=True)
    boxes, segments = obb.clip_obb(torch.from_numpy(seg)[None], torch.from_numpy(box)[None], *size)
    np.testing.assert_allclose(boxes[0].numpy(), inst.bboxes, atol=TOL, rtol=0)
    assert_segments(segments[0], inst.segments)
    inside = (seg.min(1) >= 0).all(1) & (seg.max(1) <= size).all(1)
    gone = ~inst.bboxes.any(1)
    assert inside.sum() > 100 and gone.sum() > 100 and (~inside & ~gone).sum() > 300
    wide = (np.diff(inst.bboxes.reshape(-1, 2, 2), axis=1)[:, 0] > 1).all(1)  # a sliver's corners are too close
    assert clipped(segments[0].numpy()[~inside & ~gone & wide]).all() and not segments[0][gone].any()
    assert len(ties.ties) <= 2  # turned rectangles and parallelograms: their frames are not tied
    assert np.array_equal(boxes[0].numpy()[inside], box[inside])  # inside: the box as it was, not clipped


def test_a_tied_frame_gives_one_of_ultralytics_rectangles():
    """A sheared square (a rhombus) has two minimum-area rectangles of one area, along either pair of its sides, which
    are as long: which frame the clip fits the visible part in is rounding's choice, in OpenCV and in ``clip_frame``.
    Ours is the rectangle Ultralytics' clip makes in one of the two frames (its ``cv2.minAreaRect`` made to answer
    each)."""
    n = 40
    rng = np.random.default_rng(5)
    side, a = rng.uniform(40, 90, n), rng.uniform(-math.pi, math.pi, n)
    u = np.stack([np.cos(a), np.sin(a)], -1) * side[:, None]
    t = rng.uniform(0.5, 1.2, n)  # the angle between the sides
    vv = np.stack([np.cos(a + t), np.sin(a + t)], -1) * side[:, None]
    p0 = rng.uniform(-30, 60, (n, 2))
    quad = np.stack([p0, p0 + u, p0 + u + vv, p0 + vv], 1).astype(np.float32)
    seg = np.stack(ops.resample_segments(list(quad), obb.POINTS))
    box = np.concatenate([seg.min(1), seg.max(1)], 1)
    _, ours = obb.clip_obb(torch.from_numpy(seg)[None], torch.from_numpy(box)[None], 100, 100)
    frames = []
    for sides in (u, vv):
        segs = []
        for r in range(n):  # one row at a time: minAreaRect answers with this row's sides (width along them)
            one = Instances(box[r:r + 1].copy(), seg[r:r + 1].copy(), bbox_format="xyxy", normalized=False)
            frame = ((0.0, 0.0), (1.0, 0.0), math.degrees(math.atan2(sides[r, 1], sides[r, 0])))
            with mock.patch.object(ul_instance.cv2, "minAreaRect", return_value=frame):
                one.clip(100, 100, preserve_obb=True)
            segs.append(one.segments[0])
        frames.append(np.stack(segs))
    inside = (seg.min(1) >= 0).all(1) & (seg.max(1) <= 100).all(1)
    crossing = ~inside & frames[0].any((1, 2))
    assert crossing.sum() > 10 and (np.abs(frames[0] - frames[1]).max((1, 2)) > 1)[crossing].mean() > 0.5  # 2 apart
    for r in np.flatnonzero(crossing):
        gaps = [min(np.abs(np.roll(ours[0, r].numpy()[V], k, 0) - f[r][V]).max() for k in range(4)) for f in frames]
        assert min(gaps) <= 1e-2, (r, gaps)


def _ours_after_mosaic(batch: SourceBatch, hyp: AugmentHyp, params) -> Labels:
    op = WARP[0]
    plan = op.warp_step(WarpPlan(S, batch.hw), params.mosaic, hyp)
    labels = Labels(batch.cls, batch.boxes, batch.valid, segments=obb.resample_corners(batch.corners))
    return op.apply_corners(labels, op.apply_boxes(labels, plan, params.mosaic, hyp), plan, params.mosaic, hyp)


@pytest.mark.parametrize("grid", [4, 9])
def test_the_mosaic_moves_and_clips_oriented_boxes_as_ultralytics(grid, ties):
    """``Mosaic`` alone: each tile's segments offset onto the canvas, those crossing its edge clipped as the OBB clip
    does, those left without area dropped (``remove_zero_area_boxes``); a sample without mosaic keeps its own."""
    batch = obb_batch(B, seed=grid, side=0.8)
    hyp = _hyp(mosaic=0.6, mosaic_grid=grid)
    params = GpuAugment(hyp).sample(B, torch.Generator().manual_seed(0))
    ours = _ours_after_mosaic(batch, hyp, params)
    ref = Reference(batch)
    kept = 0
    for b in range(B):
        labels = ultralytics_mosaic(ref, hyp, params, b)
        labels["instances"].denormalize(*labels["img"].shape[1::-1])  # a sample without mosaic: still normalised
        kept += assert_row(ours, b, labels)
    assert not params.mosaic.apply.all()
    assert kept >= 3 * B
    assert clipped(ours.segments[ours.valid].numpy()).sum() >= 2  # some crossed the canvas' edge


@pytest.mark.parametrize("kw", [
    {},  # Ultralytics' defaults: mosaic 1.0, translate 0.1, scale 0.5, affine
    {"mosaic": 0.0, "degrees": 30.0, "shear": 5.0},
    {"degrees": 10.0, "perspective": 0.0008},  # warpPerspective: the perspective divide
    {"mosaic_grid": 9, "scale": 0.3},
    {"mosaic": 0.5, "translate": 0.3, "scale": 0.9, "degrees": 180.0},  # many boxes pushed across the output's edge
], ids=["default", "no-mosaic", "perspective", "mosaic9", "mixed"])
def test_mosaic_and_perspective_move_oriented_boxes_as_ultralytics(kw, ties):
    """Mosaic then ``RandomPerspective``: the segments through M, each box made from its moved points
    (``apply_segments``), the OBB clip to the output, ``box_candidates`` with area_thr 0.01."""
    batch = obb_batch(B, seed=len(kw))
    hyp = _hyp(**kw)
    aug = GpuAugment(hyp)
    params = aug.sample(B, torch.Generator().manual_seed(len(kw)))
    out = aug.geometry(batch, params)
    ref = Reference(batch)
    kept = sum(assert_row(out, b, ultralytics_geometry(ref, hyp, params, b)) for b in range(B))
    assert kept >= B
    if kw.get("translate"):
        assert clipped(out.segments[:B][out.valid[:B]].numpy()).sum() >= 2


@pytest.mark.parametrize("kw", [
    {"copy_paste": 0.5},  # Ultralytics' defaults otherwise: mosaic 1.0, translate 0.1, scale 0.5
    {"copy_paste": 1.0, "mosaic": 0.0, "degrees": 20.0},  # each image its own canvas, of its own size
    {"copy_paste": 0.7, "mosaic_grid": 9, "translate": 0.3},
], ids=["default", "no-mosaic", "mosaic9"])
def test_copy_paste_gives_ultralytics_oriented_boxes_and_pixels(kw, ties, stable_argsort):
    """Mosaic -> ``CopyPaste`` (flip) -> ``RandomPerspective``: each canvas's mirrored boxes pasted as Ultralytics
    pastes them (its segments mirrored point by point, the copies appended after the originals), the same boxes,
    classes and segments kept, and the same pixels (the copies' outlines filled as ``drawContours`` fills them). Its
    ``argsort`` is made stable, as ours is (``stable_argsort``)."""
    batch = obb_batch(B, seed=len(kw), side=0.35)
    hyp = _hyp(**kw)
    aug = GpuAugment(hyp)
    params = aug.sample(B, torch.Generator().manual_seed(len(kw)))
    out = aug.geometry(batch, params)
    ref = Reference(batch)
    kept = copies = 0
    for b in range(B):
        theirs = ultralytics_geometry(ref, hyp, params, b)
        kept += assert_row(out, b, theirs)
        np.testing.assert_array_equal(out.img[b].permute(1, 2, 0).numpy(), theirs["img"][..., ::-1],
                                      err_msg=f"sample {b}: pixels")
        copies += int(out.valid[b, out.valid.shape[1] // 2:].sum())
    assert kept >= 2 * B and copies > 0 and int(out.paste_lost) == 0


def test_an_oriented_box_fill_never_runs_out_of_event_slots():
    """The copies of boxes as tall as the canvas, tilted, of boxes cut by its edges, and of concave quadrilaterals as
    tall as the canvas (an annotated box whose corners make a chevron): every event fits the slots one outline is
    given (``quad_events``), each filled on its own (no pooling), so nothing is lost."""
    from yolofeed.augment.geometry.copy_paste import canvas_side, quad_events
    from yolofeed.kernels.polyfill import fill_union

    side = canvas_side(_hyp())
    g = torch.Generator().manual_seed(0)
    centre = torch.rand(64, 2, generator=g) * side
    half = torch.rand(64, 2, generator=g) * side * torch.tensor([0.05, 0.9])  # thin and tall, past the edges
    angle = torch.rand(64, generator=g) * math.pi
    c, s_ = angle.cos()[:, None], angle.sin()[:, None]
    local = torch.tensor([[-1.0, -1.0], [1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]])[None] * half[:, None]
    corners = centre[:, None] + torch.stack([local[..., 0] * c - local[..., 1] * s_,
                                             local[..., 0] * s_ + local[..., 1] * c], -1)
    top, bottom = torch.rand(16, generator=g) * 4, side - 1 - torch.rand(16, generator=g) * 4
    x = torch.rand(16, 3, generator=g) * side
    chevrons = torch.stack([torch.stack([x[:, 0], top], -1), torch.stack([x[:, 1], bottom], -1),
                            torch.stack([x[:, 2], top], -1), torch.stack([x[:, 1], bottom * 0.6], -1)], 1)
    outlines = obb.resample_corners(torch.cat([corners, chevrons])[None])[0]
    n, count = outlines.shape[1], len(outlines)
    every, owner = torch.ones(count, dtype=torch.bool), torch.arange(count) % 4
    _, dropped = fill_union(outlines, every, owner, 4, side, side, events=quad_events(n, side), chunk=1)
    assert int(dropped) == 0
    _, short = fill_union(outlines[64:], every[64:], owner[64:], 4, side, side, events=4 * side + n, chunk=1)
    assert int(short) > 0  # the check can fail: a convex outline's most drop a chevron's events


def test_perspective_keeps_a_box_with_more_than_1_percent_of_its_area(ties):
    """Where the labels have segments Ultralytics keeps a box that keeps more than 1 % of its (scaled) area, where
    detection needs 10 %: a box pushed all but 5 % out of the output stays, clipped to a rectangle 5 px wide."""
    corners = torch.tensor([[[0.0, 40.0], [100.0, 40.0], [100.0, 80.0], [0.0, 80.0]]]) / S  # 100 x 40 px
    boxes = torch.tensor([[[50.0, 60.0, 100.0, 40.0]]]) / S
    batch = SourceBatch(torch.zeros((1, S, S, 3), dtype=torch.uint8), torch.tensor([[S, S]]), torch.zeros(1, 1), boxes,
                        torch.ones(1, 1, dtype=torch.bool), corners=corners[None])
    aug = GpuAugment(_hyp(mosaic=0.0))
    params = aug.sample(1, torch.Generator().manual_seed(0))
    one = torch.ones(1, dtype=torch.float64)
    params.perspective = dataclasses.replace(params.perspective, scale=one, translate_x=one * (0.5 + 155 / S),
                                             translate_y=one * 0.5)  # 155 px to the right: x in [155, 255]
    out = aug.apply(batch, params)
    assert out.valid[0, 0] and not out.valid[0, 1:].any()  # its own image's one box, no mosaic tiles
    torch.testing.assert_close(out.boxes[0, 0], torch.tensor([155.0, 40.0, 160.0, 80.0]))
    torch.testing.assert_close(out.rboxes[0, 0, :4], torch.tensor([157.5, 60.0, 40.0, 5.0]))
    labels = ultralytics_geometry(Reference(batch), aug.hyp, params, 0)
    assert_row(aug.geometry(batch, params), 0, labels)
    detection = aug.apply(dataclasses.replace(batch, corners=None), params)
    assert not detection.valid.any()  # 5 % of the box: too little without segments


def test_flips_move_the_segments_as_ultralytics():
    g = torch.Generator().manual_seed(0)
    seg = obb.resample_corners(torch.rand(1, 3, 4, 2, generator=g) * S)
    boxes = obb.segment_bounds(seg)
    for ud, lr in ((True, False), (False, True), (True, True), (False, False)):
        labels = {"img": np.zeros((S, S, 3), np.uint8), "instances": Instances(
            boxes[0].numpy().copy(), seg[0].numpy().copy(), bbox_format="xyxy", normalized=False)}
        theirs = ultralytics_flips(labels, ud, lr)["instances"]
        ours = geometry.flip_segments(geometry.flip_segments(seg, torch.tensor([ud]), S, 1), torch.tensor([lr]), S, 0)
        assert np.array_equal(ours[0].numpy(), theirs.segments)  # S - x: exact
        theirs.convert_bbox("xyxy")
        fp = geometry.FlipParams(torch.tensor([ud]), torch.tensor([lr]))
        np.testing.assert_allclose(geometry.flip_boxes(boxes, fp, S)[0].numpy(), theirs.bboxes, atol=1e-4)


def _labels_of(rows, k: int) -> dict:
    """Row ``k`` of our augmented rows as Ultralytics' labels dict (HWC image, xyxy pixel boxes, segments)."""
    v = rows.valid[k]
    return {"img": np.ascontiguousarray(rows.img[k].permute(1, 2, 0).numpy()), "cls": rows.cls[k][v].numpy()[:, None],
            "instances": Instances(rows.boxes[k][v].numpy().copy(), rows.segments[k][v].numpy().copy(),
                                   bbox_format="xyxy", normalized=False)}


def test_mixup_keeps_both_images_oriented_boxes_as_ultralytics():
    batch = obb_batch(B, seed=7)
    aug = GpuAugment(_hyp(mixup=0.6))
    params = aug.sample(B, torch.Generator().manual_seed(7))
    base = aug.geometry(batch, params)
    out = aug.apply(batch, params)
    assert params.mixup.apply.any() and not params.mixup.apply.all()
    assert out.rboxes.shape == (*out.valid.shape, 5)
    ours = _compose_labels(aug, batch, params)  # the mixed segments, which the oriented boxes are made of
    for b in range(B):
        labels = _labels_of(base, b)
        if bool(params.mixup.apply[b]):
            labels["mix_labels"] = [_labels_of(base, int(params.mixup.partner[b]))]
            labels = MixUp(Reference(batch), p=1.0).apply_instances(labels, {})
        assert_row(ours, b, labels)


def _compose_labels(aug: GpuAugment, batch: SourceBatch, params) -> Labels:
    """The samples' labels after the pixel ops, segments included (what ``apply`` makes its oriented boxes of)."""
    from yolofeed.augment.pipeline import COMPOSE

    rows = aug.geometry(batch, params)
    b = params.size
    labels = Labels(rows.cls[:b], rows.boxes[:b], rows.valid[:b], segments=rows.segments[:b])
    for op in COMPOSE:
        term = op.compose_term(getattr(params, op.name), labels, rows, aug.hyp)
        labels = op.apply_corners(labels, op.apply_boxes(labels, rows, term), rows, term)
    return labels


def _ultralytics_cutmix(labels: dict, partner: dict, params, b: int) -> dict:
    """Ultralytics' CutMix (preserve_obb) on sample b's labels with our draws."""
    cm = CutMix(SimpleNamespace(get_image_and_label=lambda i: partner, use_obb=True), p=1.0)
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


def test_cutmix_takes_the_partner_boxes_as_ultralytics_obb(ties):
    """The partner's boxes with at least 1 % of their box in the area (10 % where the sample has none), clipped to the
    area as the OBB clip does, those left without area dropped; the area pasted where any was taken."""
    checked = taken = reshaped = 0
    for seed in range(5):
        batch = obb_batch(B, seed=10 + seed, width=3, side=0.3)
        aug = GpuAugment(_hyp(cutmix=1.0, mosaic=0.0, scale=0.9))
        params = aug.sample(B, torch.Generator().manual_seed(seed))
        base = aug.geometry(batch, params)
        ours = _compose_labels(aug, batch, params)
        k = base.valid.shape[1]
        for b in range(B):
            partner = _labels_of(base, int(params.cutmix.partner[b]))
            checked += assert_row(ours, b, _ultralytics_cutmix(_labels_of(base, b), partner, params, b)) > 0
        pasted = ours.segments[:, k:][ours.valid[:, k:]].numpy()
        taken += len(pasted)
        reshaped += clipped(pasted).sum()
    assert checked >= 15 and taken >= 5 and reshaped >= 2


def test_cutmix_takes_from_1_percent_where_the_sample_has_segments():
    """``get_params``: ``0.01 if len(labels["instances"].segments) else 0.1``: 1 % for an OBB sample with a box, 10 %
    for one without any, and for detection."""
    boxes = torch.tensor([[[0.0, 0.0, 10.0, 10.0]], [[0.0, 0.0, 0.0, 0.0]]])
    valid = torch.tensor([[True], [False]])
    partner = torch.tensor([[[50.0, 50.0, 150.0, 150.0]]]).repeat(2, 1, 1)  # 5 % of it in the area below
    p = mix.CutMixParams(torch.ones(2, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.float64),
                         torch.zeros(2, 3, 2, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.float64),
                         torch.arange(2))
    with mock.patch.object(mix.cutmix, "cutmix_areas", return_value=torch.tensor([[130.0, 50.0, 155.0, 70.0]] * 3)
                           .expand(2, 3, 4)):
        obb_plan = mix.plan_cutmix(p, boxes, valid, partner, torch.ones(2, 1, dtype=torch.bool), S, segments=True)
        det_plan = mix.plan_cutmix(p, boxes, valid, partner, torch.ones(2, 1, dtype=torch.bool), S)
    assert obb_plan.take[:, 0].tolist() == [True, False] and not det_plan.take.any()
    assert obb_plan.apply.tolist() == [True, False]


def _format_and_collate(per_sample: list[dict]) -> dict:
    """Ultralytics' ``Format`` as ``YOLODataset.build_transforms`` appends it for task=obb, then ``collate_fn``."""
    fmt = Format(bbox_format="xywh", normalize=True, return_mask=False, return_keypoint=False, return_obb=True,
                 batch_idx=True, mask_ratio=4, mask_overlap=True, bgr=0.0)
    keys = ("img", "cls", "bboxes", "batch_idx")
    return YOLODataset.collate_fn([{k: v for k, v in fmt(x).items() if k in keys} for x in per_sample])


def assert_rboxes(ours: torch.Tensor, theirs: torch.Tensor, points: np.ndarray) -> int:
    """Normalised xywhr rows as rectangles: centre and sides within TOL px, theta where the sides differ (a square's
    is ambiguous by pi/2: its corners are compared); or, where Ultralytics' minimum is tied (another direction as
    small within ``TIED``), ours holds every point and is as small.

    Shape: ours, theirs (N, 5); points (N, 100, 2) pixels, the segments Ultralytics made them of. Returns the tied rows.
    """
    assert ours.shape == theirs.shape and ours.dtype == torch.float32, (ours.shape, theirs.shape)
    assert ((ours[:, 4] >= -math.pi / 4) & (ours[:, 4] < 3 * math.pi / 4)).all()
    a, b = ours.double().numpy().copy(), theirs.double().numpy().copy()
    a[:, :4] *= S
    b[:, :4] *= S
    gap = np.linalg.norm(ops.xywhr2xyxyxyxy(a)[:, :, None] - ops.xywhr2xyxyxyxy(b)[:, None], axis=-1).min(2).max(1)
    same = gap <= TOL
    np.testing.assert_allclose(a[same, :4], b[same, :4], atol=TOL, rtol=0)
    sides = same & (b[:, 2] - b[:, 3] > TOL)
    turn = np.abs((a[:, 4] - b[:, 4] + math.pi / 2) % math.pi - math.pi / 2)[sides] * b[sides, 2] / 2
    assert (turn <= TOL).all(), f"theta moves the corners by up to {turn.max()} px"
    for r in np.flatnonzero(~same):
        cx, cy, w, h, theta = a[r]
        u = np.array([math.cos(theta), math.sin(theta)])
        rel = points[r].astype(np.float64) - [cx, cy]
        assert (np.abs(rel @ u) <= w / 2 + TOL).all() and (np.abs(rel @ [-u[1], u[0]]) <= h / 2 + TOL).all(), r
        assert w * h <= b[r, 2] * b[r, 3] * (1 + TIED), f"row {r}: {a[r]} is no minimum beside Ultralytics' {b[r]}"
    return int((~same).sum())


@pytest.mark.parametrize("kw, n, labels", [
    ({"mixup": 0.5, "flipud": 0.5, "fliplr": 0.5, "degrees": 30.0, "translate": 0.2}, B, {}),
    ({"mixup": 0.5, "cutmix": 1.0, "mosaic": 0.0, "scale": 0.9}, 12, {"width": 2, "side": 0.3}),  # room to paste
], ids=["mixup-flips", "mixup-cutmix"])
def test_the_pipeline_gives_ultralytics_obb_batch(kw, n, labels, ties):
    """v8_transforms' ops in its order for task=obb (Mosaic, RandomPerspective, MixUp, CutMix, RandomFlip up-down and
    left-right, then Format(return_obb=True) and collate_fn), our draws replayed, against ``to_ultralytics()``.

    As for pose (test_augment_keypoints.py): our flips run per row before mixing, so the partners' flip draws are set
    to their sample's; with CutMix on the flips are off.
    """
    batch = obb_batch(n, seed=21, **labels)
    hyp = _hyp(**({"hsv_h": 0.015} | kw))  # HSV leaves the labels alone
    aug = GpuAugment(hyp)
    params = aug.sample(n, torch.Generator().manual_seed(21))
    for f in ("flipud", "fliplr"):
        flips = getattr(params, f)
        setattr(params, f, flips[:n].repeat(len(flips) // n))  # each partner row flips as its sample
    out = aug.apply(batch, params)
    ref = Reference(batch)
    per_sample, pasted = [], 0
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
        per_sample.append(ultralytics_flips(labels, bool(params.flipud[b]), bool(params.fliplr[b])))
    points = np.concatenate([x["instances"].segments for x in per_sample])  # what Format makes its boxes of
    theirs = _format_and_collate(per_sample)
    ours = out.to_ultralytics()
    assert set(ours) == {"img", "cls", "bboxes", "batch_idx"} and len(theirs["bboxes"]) > 2 * n
    assert_rboxes(ours["bboxes"], theirs["bboxes"], points)
    assert torch.equal(ours["batch_idx"], theirs["batch_idx"]) and torch.equal(ours["cls"], theirs["cls"])
    if hyp.fliplr:
        assert params.fliplr[:n].any() and params.flipud[:n].any() and not params.fliplr[:n].all()
    if hyp.cutmix:
        assert pasted >= 3


def test_probability_zero_is_the_identity_for_oriented_boxes():
    """Nothing on: an S x S image's oriented boxes come out as its corners' minimum-area rectangles, in pixels, and
    normalised as Format normalises them."""
    batch = obb_batch(B, seed=3)
    batch.hw[:] = S
    hyp = AugmentHyp(imgsz=S, mosaic=0.0, translate=0.0, scale=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, fliplr=0.0)
    out = GpuAugment(hyp)(batch, torch.Generator().manual_seed(0))
    n = batch.valid.shape[1]
    v = out.valid[:, :n]
    assert v.sum() > B and torch.equal(v, batch.valid) and not out.valid[:, n:].any()
    points = np.stack(ops.resample_segments(list((batch.corners * S)[v].numpy()), obb.POINTS))
    norm = torch.from_numpy(ops.xyxyxyxy2xywhr(points)).float()
    norm[:, :4] /= S
    assert_rboxes(out.to_ultralytics()["bboxes"], norm, points)
    torch.testing.assert_close(out.boxes[:, :n][v], geometry.xywhn_to_xyxy(batch.boxes, batch.hw[:, None])[v])


def test_a_detection_batch_draws_as_before():
    """The same batch with and without corners: the same draws (segments add none), the same pixels; the boxes differ
    only by the OBB rules (made from the points, 1 % of the area), never for a box inside the output."""
    batch = obb_batch(B, seed=4)
    detection = dataclasses.replace(batch, corners=None)
    hyp = AugmentHyp(imgsz=S, mixup=0.5, cutmix=0.5, degrees=5.0, flipud=0.3)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    plain, oriented = GpuAugment(hyp)(detection, g1), GpuAugment(hyp)(batch, g2)
    assert torch.equal(g1.get_state(), g2.get_state())
    assert plain.rboxes is None and plain.kinds() == () and oriented.kinds() == ("rboxes",)
    assert set(plain.to_ultralytics()) == {"img", "cls", "bboxes", "batch_idx"}
    assert plain.to_ultralytics()["bboxes"].shape[1] == 4 and oriented.to_ultralytics()["bboxes"].shape[1] == 5
    p = GpuAugment(hyp).sample(B, torch.Generator().manual_seed(1))
    p.cutmix.apply[:] = False  # CutMix takes partner boxes from 1 % with segments: the pasted pixels may differ
    assert torch.equal(GpuAugment(hyp).apply(detection, p).img, GpuAugment(hyp).apply(batch, p).img)


def test_flattening_oriented_boxes_with_a_known_count_equals_boolean_indexing():
    out = GpuAugment(_hyp(mixup=0.5))(obb_batch(B, seed=5), torch.Generator().manual_seed(5))
    ref, got = out.to_ultralytics(), out.to_ultralytics(total=int(out.valid.sum()))
    assert got.keys() == ref.keys()
    for key in ref:
        assert torch.equal(got[key], ref[key]), key
    assert ref["bboxes"].shape == (int(out.valid.sum()), 5)
    torch.testing.assert_close(ref["bboxes"][:, :4] * S, out.rboxes[out.valid][:, :4])


def test_the_pool_keeps_corners_and_gives_the_gathered_batch():
    """Partners from a PartnerPool's ring: the same oriented boxes as the images gathered as a batch."""
    batch = obb_batch(B, seed=6, width=3)
    aug, pool = GpuAugment(_hyp(mixup=0.5, degrees=5.0)), PartnerPool(12, B)
    first = pool.push(batch)
    params = aug.sample(B, torch.Generator().manual_seed(6), partners=pool.partners(first, B))
    pooled = aug.apply(pool.sources, params)
    assert torch.equal(pool.sources.corners[:B, :3], batch.corners)
    pad = pool.sources.valid.shape[1] - 3
    gathered = SourceBatch(batch.images, batch.hw, torch.nn.functional.pad(batch.cls, (0, pad)),
                           torch.nn.functional.pad(batch.boxes, (0, 0, 0, pad)),
                           torch.nn.functional.pad(batch.valid, (0, pad)),
                           corners=torch.nn.functional.pad(batch.corners, (0, 0, 0, 0, 0, pad)))
    plain = aug.apply(gathered, params)
    assert torch.equal(pooled.valid, plain.valid) and pooled.valid.any()
    assert torch.equal(pooled.rboxes[pooled.valid], plain.rboxes[plain.valid])
    with pytest.raises(ValueError, match="corners"):
        pool.push(dataclasses.replace(batch, corners=None))  # one pool, one dataset


def _on_cuda(batch: SourceBatch) -> SourceBatch:
    return SourceBatch(*(t.cuda() for t in (batch.images, batch.hw, batch.cls, batch.boxes, batch.valid)),
                       corners=batch.corners.cuda())


@pytest.mark.gpu
def test_cuda_oriented_boxes_equal_the_cpu_path_and_make_no_host_sync():
    batch = obb_batch(16, seed=30)
    aug = GpuAugment(_hyp(mixup=0.5, cutmix=0.5, degrees=20.0, translate=0.2, fliplr=0.5, flipud=0.2))
    params = aug.sample(16, torch.Generator().manual_seed(30))
    ref, got = aug.apply(batch, params), aug.apply(_on_cuda(batch), to_device(params, "cuda"))
    assert torch.equal(got.valid.cpu(), ref.valid)
    v = ref.valid
    torch.testing.assert_close(got.boxes.cpu()[v], ref.boxes[v], atol=TOL, rtol=0)
    points = _compose_labels(aug, batch, params).segments[v].numpy()
    assert_rboxes(got.to_ultralytics()["bboxes"].cpu(), ref.to_ultralytics()["bboxes"], points)
    cuda, g = _on_cuda(batch), torch.Generator(device="cuda").manual_seed(0)
    pool = PartnerPool(40, 16)
    for run in (lambda: aug(cuda, g), lambda: aug(cuda, g, pool)):
        run()  # warm up: Triton compiles on first use
        with no_host_sync():
            out = run()
        total = int(out.valid.sum())
        with no_host_sync():
            flat = out.to_ultralytics(total=total)
        assert flat["bboxes"].shape == (total, 5)


@pytest.mark.gpu
def test_cuda_copy_paste_of_oriented_boxes_equals_the_cpu_path():
    """Copy-paste of oriented boxes on the GPU (the fill and the Triton warp's mirrored reads): the CPU path's pixels,
    boxes and segments, without a host sync."""
    batch = obb_batch(B, seed=32, side=0.35)
    aug = GpuAugment(_hyp(copy_paste=0.5, mixup=0.5))
    params = aug.sample(B, torch.Generator().manual_seed(32))
    cpu = aug.geometry(batch, params)
    gpu_batch, gpu_params = _on_cuda(batch), to_device(params, "cuda")
    aug.geometry(gpu_batch, gpu_params)  # the kernels compile, the allocator warms
    with no_host_sync():
        cuda = aug.geometry(gpu_batch, gpu_params)
    assert torch.equal(cuda.img.cpu(), cpu.img) and torch.equal(cuda.valid.cpu(), cpu.valid)
    assert int(cpu.valid[:, cpu.valid.shape[1] // 2:].sum()) > 0  # copies were pasted
    v = cpu.valid
    torch.testing.assert_close(cuda.segments.cpu()[v], cpu.segments[v], atol=TOL, rtol=0)


@pytest.mark.gpu
def test_graphed_augment_carries_oriented_boxes():
    from yolofeed.augment.graphs import GraphedAugment

    cuda = _on_cuda(obb_batch(16, seed=31))
    aug = GpuAugment(_hyp(mixup=0.3, degrees=5.0, fliplr=0.5))
    for pool in (None, PartnerPool(40, 16)):
        a, b = GraphedAugment(aug, seed=7, pool=pool), GraphedAugment(aug, seed=7, pool=pool and PartnerPool(40, 16))
        first = [x.rboxes.clone() for x in (a(cuda), b(cuda))]
        assert torch.equal(first[0], first[1])  # same seed, same draws
        with no_host_sync():
            out = a(cuda)
        assert a.captured == 1 and not torch.equal(out.rboxes, first[0])  # each replay draws anew
        assert out.rboxes.shape == (*out.valid.shape, 5)

"""Oriented boxes (OBB) as Ultralytics moves them: the 100-point resample of their corners and the OBB clip
(``Instances.clip(preserve_obb=True)``), held equal to Ultralytics' own functions on the same points.

A segment that the clip replaced is a rectangle whose corners may start from another corner than Ultralytics' (the
frame's direction is taken mod pi): such rows are compared as corner sequences. Where the frame is tied (two
minimum-area rectangles within ``TIED`` of one area, as any near-rectangle has), the replay answers the clip's
``cv2.minAreaRect`` with our frame (``TiesAsOurs``); an exact tie (a rhombus) is held to either of the two.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from unittest import mock

import cv2
import numpy as np
import pytest
import torch
from ultralytics.data.augment import Format, Mosaic, RandomFlip, RandomPerspective
from ultralytics.data.dataset import YOLODataset
from ultralytics.utils import instance as ul_instance
from ultralytics.utils import ops
from ultralytics.utils.instance import Instances

from yolofeed.augment import AugmentHyp, geometry
from yolofeed.augment.geometry import obb
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
    """Ultralytics' Mosaic -> RandomPerspective (preserve_obb, as v8_transforms builds it for OBB), our draws."""
    labels = ultralytics_mosaic(ref, hyp, params, row)
    canvas = torch.tensor([labels["img"].shape[:2]])
    one = geometry.PerspectiveParams(*(getattr(params.perspective, f)[row:row + 1] for f in
                                       geometry.PerspectiveParams.__dataclass_fields__))
    M, scale = geometry.perspective_matrix(one, canvas, S)
    rp = RandomPerspective(degrees=hyp.degrees, translate=hyp.translate, scale=hyp.scale, shear=hyp.shear,
                           perspective=hyp.perspective, size=(S, S), preserve_obb=True)
    rparams = {"M": M[0].numpy(), "scale": float(scale[0]), "orig_shape": labels["img"].shape[:2], "size": (S, S)}
    return rp.apply_instances(rp.apply_image(labels, rparams), rparams)


def ultralytics_flips(labels: dict, ud: bool, lr: bool) -> dict:
    """``RandomFlip`` vertical, then horizontal, as ``v8_transforms`` builds them without keypoints (flip_idx [])."""
    for direction, on in (("vertical", ud), ("horizontal", lr)):
        f = RandomFlip(p=1.0, direction=direction, flip_idx=[])
        p = {"flip": on, "h": S, "w": S, "direction": direction, "flip_idx": f.flip_idx}
        labels = f.apply_instances(f.apply_image(labels, p), p)
    return labels


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

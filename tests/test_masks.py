"""Segment masks on the device (``kernels.polyfill``, ``augment.masks``) against Ultralytics' own ``polygon2mask``,
``polygons2masks``, ``polygons2masks_overlap`` and ``Format`` + ``collate_fn`` (cv2.fillPoly, cv2.resize): pixel for
pixel, on random and adversarial polygons, mask ratios 1, 2 and 4, overlap on and off."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ultralytics.data.augment import Format
from ultralytics.data.dataset import YOLODataset
from ultralytics.data.utils import polygon2mask, polygons2masks, polygons2masks_overlap
from ultralytics.utils.instance import Instances
from ultralytics.utils.ops import resample_segments

from yolofeed.augment.masks import polygons_to_masks, ultralytics_masks
from yolofeed.errors import ConfigError
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


def _batch(seed: int, b: int, k: int, ratio: int, n: int = 1000, p_valid: float = 0.8):
    """A padded batch of resampled polygons: (b, k, n, 2) float32 pixels and (b, k) valid, star shapes of random
    sizes, some partly outside the image, one wholly outside (no pixel: area 0), the areas at ``ratio`` of an
    image's instances distinct (``test_tied_areas_keep_slot_order`` is about ties)."""
    rng = np.random.default_rng(seed)
    segs = np.zeros((b, k, n, 2), np.float32)
    valid = rng.random((b, k)) < p_valid
    valid[0, 1] = True
    for i in range(b):
        seen = set()
        for j in range(k):
            while True:
                m = int(rng.integers(3, 40))
                poly = _star(rng, rng.uniform(-10, [W + 10, H + 10]), rng.uniform(1, 45, m), m)
                poly = resample_segments([poly + (3 * W if (i, j) == (0, 1) else 0)], n)[0]
                area = int(polygon2mask((H, W), [poly.reshape(-1)], 1, ratio).sum())
                if area not in seen:
                    break
            seen.add(area)
            segs[i, j] = poly
    return segs, valid


@pytest.mark.parametrize("ratio", RATIOS)
def test_overlap_masks_and_order_equal_ultralytics(ratio):
    """With overlap each image's index mask and its label order equal ``polygons2masks_overlap``'s (an instance of
    no pixel first, as NumPy sorts -uint64 areas), and without overlap each slot's mask equals ``polygons2masks``'."""
    segs, valid = _batch(ratio, 4, 12, ratio)
    args = torch.from_numpy(segs), torch.from_numpy(valid), H, W, ratio
    m, per_slot = polygons_to_masks(*args, overlap=True), polygons_to_masks(*args, overlap=False)
    assert int(m.overflow) == 0 and int(per_slot.overflow) == 0
    assert m.masks.dtype == torch.uint8 and m.masks.shape == (4, H // ratio, W // ratio)
    for i in range(4):
        slots = np.flatnonzero(valid[i])
        ref, index = polygons2masks_overlap((H, W), list(segs[i, slots]), downsample_ratio=ratio)
        np.testing.assert_array_equal(m.masks[i].numpy(), ref)
        np.testing.assert_array_equal(m.order[i, :len(slots)].numpy(), slots[index])
        assert m.valid[i].tolist() == [True] * len(slots) + [False] * (12 - len(slots))
        np.testing.assert_array_equal(per_slot.masks[i, slots].numpy(),
                                      polygons2masks((H, W), list(segs[i, slots]), 1, ratio))
        assert not per_slot.masks[i, ~valid[i]].any()
    assert m.order[0, 0] == 1 and m.areas[0, 0] == 0  # the instance outside the image sorts first


def test_tied_areas_keep_slot_order():
    """Equal areas keep their slot order (NumPy's argsort leaves a machine-dependent order there); the index mask
    still equals Ultralytics' where the tied instances coincide, and the areas in order are Ultralytics'."""
    sq = np.array([[10, 10], [40, 10], [40, 40], [10, 40]], np.float32)
    polys = [sq, sq + 48, sq, sq * 2]  # slots 0 and 2 coincide, 1 is their size elsewhere: three equal areas
    segs = torch.from_numpy(np.stack(polys))[None]
    m = polygons_to_masks(segs, torch.ones(1, 4, dtype=torch.bool), H, W, 4)
    ref, index = polygons2masks_overlap((H, W), polys, downsample_ratio=4)
    assert m.order[0].tolist() == [3, 0, 1, 2]
    assert m.areas[0].tolist() == sorted(m.areas[0].tolist(), reverse=True)
    ref_areas = [int(polygon2mask((H, W), [polys[j].reshape(-1)], 1, 4).sum()) for j in index]
    assert m.areas[0].tolist() == ref_areas
    assert set(index[1:].tolist()) == {0, 1, 2} and index[0] == 3
    # each instance's pixels carry one of the tied ranks in both; they agree wherever the tie cannot matter
    ours, theirs = m.masks[0].numpy(), ref
    np.testing.assert_array_equal(ours == 0, theirs == 0)
    np.testing.assert_array_equal(ours == 1, theirs == 1)


def test_more_than_255_instances_index_in_int32():
    """Past 255 instances the index mask is int32 and its values past 255 equal Ultralytics'."""
    rng = np.random.default_rng(3)
    sizes, seen = [], set()
    while len(sizes) < 300:  # nested rectangles from the corner, every pixel count distinct
        a, b = (int(v) for v in rng.integers(1, 64, 2))
        if (a + 1) * (b + 1) not in seen:
            seen.add((a + 1) * (b + 1))
            sizes.append((a, b))
    polys = [np.array([[0, 0], [a, 0], [a, b], [0, b]], np.float32) for a, b in sizes]
    m = polygons_to_masks(torch.from_numpy(np.stack(polys))[None], torch.ones(1, 300, dtype=torch.bool), 64, 64, 1)
    ref, index = polygons2masks_overlap((64, 64), polys, downsample_ratio=1)
    assert ref.dtype == np.int32 and m.masks.dtype == torch.int32 and ref.max() > 255
    np.testing.assert_array_equal(m.masks[0].numpy(), ref)
    np.testing.assert_array_equal(m.order[0].numpy(), index)


def _stock_batch(segs, valid, cls, ratio, overlap):
    """Ultralytics' collated ``masks`` and ``sem_masks`` and ``cls``: ``Format`` per image, then ``collate_fn``."""
    fmt = Format(bbox_format="xywh", normalize=True, return_mask=True, mask_ratio=ratio, mask_overlap=overlap)
    items = []
    for i in range(len(segs)):
        slots = np.flatnonzero(valid[i])
        s = segs[i, slots]
        boxes = np.concatenate([s.min(1), s.max(1)], -1) if len(s) else np.zeros((0, 4), np.float32)
        inst = Instances(boxes, segments=s if len(s) else np.zeros((0, 1000, 2), np.float32), bbox_format="xyxy",
                         normalized=False)
        items.append(fmt({"img": np.zeros((H, W, 3), np.uint8), "cls": cls[i, slots, None], "instances": inst}))
    return YOLODataset.collate_fn(items)


@pytest.mark.parametrize("overlap", (True, False))
def test_collated_masks_and_sem_masks_equal_format_and_collate(overlap):
    """``ultralytics_masks`` of the batch, with the labels in ``reorder``'s order, gives the values of Ultralytics'
    collated ``masks``, ``sem_masks`` and ``cls`` (an image without instances included)."""
    segs, valid = _batch(7, 4, 10, 4)
    valid[2] = False
    cls = np.random.default_rng(7).integers(0, 80, valid.shape).astype(np.float32)
    stock = _stock_batch(segs, valid, cls, 4, overlap)
    m = polygons_to_masks(torch.from_numpy(segs), torch.from_numpy(valid), H, W, 4, overlap=overlap)
    ours_cls = m.reorder(torch.from_numpy(cls))
    for total in (None, int(valid.sum())):
        got = ultralytics_masks(m, ours_cls, total)
        np.testing.assert_array_equal(got["masks"].numpy(), stock["masks"].numpy())
        np.testing.assert_array_equal(got["sem_masks"].numpy(), stock["sem_masks"].numpy())
    np.testing.assert_array_equal(ours_cls[m.valid].numpy(), stock["cls"][:, 0].numpy())


@pytest.mark.parametrize("overlap", (True, False))
def test_rasterising_the_valid_slots_only_gives_the_same_masks(overlap):
    """``capacity`` at or above the valid slots' count (padding slots skipped) gives every mask, order and area of the
    padded fill, bit for bit, with nothing counted as dropped; below it the first valid slots in row order keep their
    masks, the rest are empty and counted in ``overflow``."""
    segs, valid = _batch(5, 4, 10, 4, p_valid=0.4)
    s, v = torch.from_numpy(segs), torch.from_numpy(valid)
    full = polygons_to_masks(s, v, H, W, 4, overlap=overlap)
    count = int(valid.sum())
    for capacity in (count, count + 3, 4 * 10):
        m = polygons_to_masks(s, v, H, W, 4, overlap=overlap, capacity=capacity)
        for key in ("masks", "order", "valid", "areas"):
            assert torch.equal(getattr(m, key), getattr(full, key)), (capacity, key)
        assert int(m.overflow) == 0 and int(m.past) == 0
    short = polygons_to_masks(s, v, H, W, 4, overlap=False, capacity=count - 2)
    every = polygons_to_masks(s, v, H, W, 4, overlap=False)
    rows = np.flatnonzero(valid.reshape(-1))
    kept, lost = rows[:count - 2], rows[count - 2:]
    assert torch.equal(short.masks.flatten(0, 1)[kept], every.masks.flatten(0, 1)[kept])
    assert int(short.masks.flatten(0, 1)[lost].sum()) == 0 < int(every.masks.flatten(0, 1)[lost].sum())
    assert int(short.past) == 2 and int(short.overflow) == 0


def test_mask_capacity_bounds_a_batch_of_mosaics():
    """The capacity holds every instance of every tile of a batch drawn from skewed label counts (far above what
    the augmentation keeps), in whole chunks, and is well below the padded slots where images differ in counts."""
    from yolofeed.augment.masks import mask_capacity

    rng = np.random.default_rng(0)
    counts = np.minimum(rng.geometric(0.12, 20_000), 90)  # mean ~8, a long tail to 90
    cap = mask_capacity(128, 4, counts.mean(), counts.std())
    drawn = np.array([counts[rng.integers(0, len(counts), 128 * 4)].sum() for _ in range(2000)])
    assert cap % 128 == 0 and cap > drawn.max()
    assert cap < 128 * 4 * counts.max() / 5


def test_mask_capacity_holds_a_heavy_tail_in_a_small_batch():
    """A set of a few crowded images among sparse ones: the normal bound alone is exceeded by a small batch that
    draws one crowded image; with the largest image's labels added it never is."""
    from yolofeed.augment.masks import mask_capacity

    rng = np.random.default_rng(1)
    counts = np.where(rng.random(20_000) < 0.001, 400, rng.integers(1, 4, 20_000)).astype(float)
    draws = np.array([counts[rng.integers(0, len(counts), 2 * 4)].sum() for _ in range(5_000)])
    normal = 8 * counts.mean() + 6.0 * 8 ** 0.5 * counts.std()
    assert (draws > normal).any()  # the case the largest image's term is for
    assert draws.max() < mask_capacity(2, 4, counts.mean(), counts.std(), counts.max(), chunk=8)


def test_ratio_must_divide_the_image():
    with pytest.raises(ConfigError, match="mask_ratio=3"):
        polygons_to_masks(torch.zeros(1, 1, 4, 2), torch.ones(1, 1, dtype=torch.bool), 64, 64, 3)


@pytest.mark.gpu
def test_cuda_equals_cpu_without_host_sync():
    """On CUDA the same masks, and nothing waits for the GPU (a CUDA graph can hold it)."""
    from helpers import no_host_sync

    segs, valid = _batch(11, 3, 8, 4)
    cpu = polygons_to_masks(torch.from_numpy(segs), torch.from_numpy(valid), H, W, 4)
    s, v = torch.from_numpy(segs).cuda(), torch.from_numpy(valid).cuda()
    with no_host_sync():
        gpu = polygons_to_masks(s, v, H, W, 4)
        packed = polygons_to_masks(s, v, H, W, 4, capacity=int(valid.sum()))
    assert torch.equal(gpu.masks.cpu(), cpu.masks) and torch.equal(gpu.order.cpu(), cpu.order)
    assert torch.equal(packed.masks.cpu(), cpu.masks) and int(packed.overflow) == 0

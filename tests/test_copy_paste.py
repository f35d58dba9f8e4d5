"""Copy-paste in its flip mode: equal to Ultralytics' ``CopyPaste`` between its ``Mosaic`` and ``RandomPerspective``
given the same draws, labels and pixels.

NumPy's ``argsort`` orders equal covers by the machine (its SIMD sort is not stable); yolofeed keeps them in slot
order, so the comparisons run Ultralytics with a stable ``argsort``: the same choice of copies wherever covers tie.
"""

from __future__ import annotations

import dataclasses

import cv2
import numpy as np
import pytest
import replay
import torch
from test_augment_segments import Reference, S, _hyp, assert_row, segment_batch

from helpers import no_host_sync, to_device
from yolofeed.augment import GpuAugment
from yolofeed.augment.geometry.copy_paste import COVER_BELOW, covers, mirror_boxes, pick
from yolofeed.kernels.polyfill import fill_union

B = 6


@pytest.mark.parametrize("seed", range(40))
def test_the_union_fill_is_draw_contours_of_each_polygon(seed):
    """``fill_union``: each image's mask is ``cv2.drawContours(FILLED)`` of each of its polygons in turn, on an image
    of its own size: overlapping, degenerate (1 or 2 points), on the edges and clipped polygons included; nothing
    past an image's own size."""
    rng = np.random.default_rng(seed)
    r = int(rng.integers(1, 4))
    h_max, w_max = int(rng.integers(8, 60)), int(rng.integers(8, 60))
    sizes = np.stack([rng.integers(4, h_max + 1, r), rng.integers(4, w_max + 1, r)], 1)
    sizes[0] = (h_max, w_max)
    p, n = int(rng.integers(1, 9)), 40
    owner = rng.integers(0, r, p)
    polys = []
    for i in range(p):
        h, w = sizes[owner[i]]
        k = int(rng.choice([1, 2, 3, 4, 9, n]))
        q = (rng.integers(0, [w + 1, h + 1], (k, 2)).astype(np.float64) if rng.random() < 0.3
             else rng.uniform(-0.3, 1.3, (k, 2)) * [w, h])
        if rng.random() < 0.7:  # copy-paste's polygons lie on their canvas; the rest reach past the image
            q = np.clip(q, 0, [w, h])
        polys.append(np.concatenate([q, np.repeat(q[-1:], n - k, 0)]))
    points = np.stack(polys).astype(np.float32)
    valid = rng.random(p) < 0.9
    masks, dropped = fill_union(torch.from_numpy(points), torch.from_numpy(valid), torch.from_numpy(owner), r, h_max,
                                w_max, clip=torch.from_numpy(sizes[owner]), events=2 * n * (h_max + 2),
                                chunk=1 + seed % 4)  # chunks of 1-4 polygons share the histogram
    assert int(dropped) == 0
    for i in range(r):
        h, w = sizes[i]
        expected = np.zeros((h, w), np.uint8)
        for j in np.flatnonzero((owner == i) & valid):
            cv2.drawContours(expected, points[[j]].astype(np.int32), -1, 1, cv2.FILLED)
        np.testing.assert_array_equal(masks[i, :h, :w].numpy(), expected.astype(bool), err_msg=f"image {i}")
        assert int(masks[i].sum()) == int(expected.sum()), f"image {i}: painted past its own size"


def test_the_union_fill_of_no_polygon_or_of_a_tall_batch_is_right():
    """No polygon at all (a copy capacity of 0) paints nothing; polygons times rows past 2**28 (a combined sort key
    would overflow int64 there) still pair each polygon's crossings on its own rows."""
    empty, dropped = fill_union(torch.zeros(0, 5, 2), torch.zeros(0, dtype=torch.bool),
                                torch.zeros(0, dtype=torch.long), 2, 8, 8)
    assert empty.shape == (2, 8, 8) and not empty.any() and int(dropped) == 0
    square = torch.tensor([[1.0, 0.0], [6.0, 0.0], [6.0, 5.0], [1.0, 5.0]])
    p, h, w = 4097, 65536, 8
    points, valid = torch.zeros(p, 4, 2), torch.zeros(p, dtype=torch.bool)
    points[-1], valid[-1] = square, True
    expected = np.zeros((8, w), np.uint8)
    cv2.drawContours(expected, square[None].numpy().astype(np.int32), -1, 1, cv2.FILLED)
    for events in (8, 9, 10):
        masks, dropped = fill_union(points, valid, torch.zeros(p, dtype=torch.long), 1, h, w, events=events,
                                    chunk=p)  # one chunk: its events pooled, polygons x rows past 2**28
        assert int(dropped) == 0 and int(masks.sum()) == int(expected.sum())
        np.testing.assert_array_equal(masks[0, :8].numpy(), expected.astype(bool))


def test_too_few_event_slots_are_counted():
    """A fill that needs more events than it is given drops the rest and says how many: never silently."""
    zigzag = torch.tensor([[[0.0, 0.0], [5.0, 30.0], [10.0, 0.0], [15.0, 30.0], [20.0, 0.0]]])
    _, dropped = fill_union(zigzag, torch.tensor([True]), torch.tensor([0]), 1, 32, 32, events=20)
    assert int(dropped) > 0


@pytest.mark.parametrize("kw", [
    {"copy_paste": 0.5},  # Ultralytics' mosaic 1.0, translate 0.1, scale 0.5
    {"copy_paste": 1.0, "mosaic": 0.0, "degrees": 20.0},  # each image its own canvas, of its own size
    {"copy_paste": 0.3, "mosaic": 0.5, "scale": 0.9, "shear": 5.0},
    {"copy_paste": 0.5, "mosaic_grid": 9, "perspective": 0.0005},
    {"copy_paste": 0.7, "mixup": 0.5, "cutmix": 0.5},  # the partners' rows paste too
], ids=["default", "no-mosaic", "mixed", "mosaic9", "partners"])
def test_copy_paste_gives_ultralytics_labels_and_pixels(kw, stable_argsort):
    """Every augmented row (samples and mix partners) after the warp: Ultralytics' Mosaic -> CopyPaste(flip) ->
    RandomPerspective with our draws, the same boxes, classes and polygons in the same order, the same pixels."""
    batch = segment_batch(B, seed=len(kw), side=0.35)
    hyp = _hyp(**kw)
    aug = GpuAugment(hyp)
    params = aug.sample(B, torch.Generator().manual_seed(len(kw)))
    rows = aug.geometry(batch, params)
    ref = Reference(batch)
    kept = copies = 0
    for r in range(len(rows.img)):
        theirs = replay.geometry(ref, hyp, params, r, S)
        kept += assert_row(rows, r, theirs)
        np.testing.assert_array_equal(rows.img[r].permute(1, 2, 0).numpy(), theirs["img"][..., ::-1],
                                      err_msg=f"row {r}: pixels")
        copies += int(rows.valid[r, rows.valid.shape[1] // 2:].sum())
    assert kept > 2 * B and copies > 0


def test_the_pasted_pixels_are_the_mirrored_canvas(stable_argsort):
    """With copy_paste the pixels differ from the same draws without it exactly where a copy was pasted, and there
    they are the mirror's: Ultralytics' canvas after CopyPaste, compared as it leaves the mosaic (no perspective)."""
    batch = segment_batch(B, seed=7, side=0.3)
    batch.hw[:] = S
    base = dict(mosaic=0.0, translate=0.0, scale=0.0)
    plain, pasted = GpuAugment(_hyp(**base)), GpuAugment(_hyp(copy_paste=1.0, **base))
    params = plain.sample(B, torch.Generator().manual_seed(0))
    a, b = plain.geometry(batch, params).img, pasted.geometry(batch, params).img
    assert not torch.equal(a, b)
    changed = (a != b).any(1)  # (B, S, S)
    mirror = a.flip(-1)
    assert torch.equal(b[changed[:, None].expand_as(b)], mirror[changed[:, None].expand_as(b)])


def test_the_copies_obey_the_cover_rule():
    """Each chosen copy covers less than 30 % of every original box; the number chosen is round(p x eligible), half
    to even; no chosen copy covers more than an eligible one left out."""
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(64, 12, 2, generator=g) * 80
    boxes = torch.cat([xy, xy + 4 + torch.rand(64, 12, 2, generator=g) * 30], -1)
    valid = torch.rand(64, 12, generator=g) < 0.8
    width = torch.full((64,), 100.0)
    for p in (0.25, 0.5, 1.0):
        picks = pick(boxes, valid, width, p)
        ioa = covers(mirror_boxes(boxes, width), boxes, valid)
        eligible = valid & (ioa < COVER_BELOW).all(2)
        for r in range(64):
            chosen = picks.order[r][picks.chosen[r]]
            assert len(chosen) == round(p * int(eligible[r].sum()))
            assert eligible[r, chosen].all()
            left = eligible[r].clone()
            left[chosen] = False
            if len(chosen) and left.any():
                assert ioa[r, chosen].amax(1).max() <= ioa[r, left].amax(1).min()


def test_copy_paste_zero_is_the_identity_and_draws_nothing():
    """copy_paste=0: the slots do not double and nothing is pasted; on or off, the draws are the same."""
    batch = segment_batch(B, seed=2)
    g0, g1 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    off, on = GpuAugment(_hyp())(batch, g0), GpuAugment(_hyp(copy_paste=0.5))(batch, g1)
    assert torch.equal(g0.get_state(), g1.get_state())
    assert on.valid.shape[1] == 2 * off.valid.shape[1]
    k = off.valid.shape[1]
    assert torch.equal(on.valid[:, :k], off.valid) and torch.equal(on.boxes[:, :k], off.boxes)


def test_a_detection_batch_is_left_alone():
    """Without polygons Ultralytics' CopyPaste does nothing: the same labels and pixels as with copy_paste=0."""
    batch = dataclasses.replace(segment_batch(B, seed=4), polygons=None, polygon_lengths=None)
    p = GpuAugment(_hyp()).sample(B, torch.Generator().manual_seed(1))
    off, on = GpuAugment(_hyp()).apply(batch, p), GpuAugment(_hyp(copy_paste=0.5)).apply(batch, p)
    assert torch.equal(off.img, on.img) and torch.equal(off.valid, on.valid)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: run on the device machine")
def test_cuda_copy_paste_equals_the_cpu_path(stable_argsort):
    """The Triton warp's mirrored reads and the fill on the GPU give the CPU path's pixels and labels."""
    batch = segment_batch(B, seed=9, side=0.35)
    hyp = _hyp(copy_paste=0.5, mixup=0.5)
    aug = GpuAugment(hyp)
    params = aug.sample(B, torch.Generator().manual_seed(2))
    cpu = aug.geometry(batch, params)
    dev = torch.device("cuda")
    gpu_batch, gpu_params = to_device(batch, dev), to_device(params, dev)
    aug.geometry(gpu_batch, gpu_params)  # the kernels compile, the allocator warms
    with no_host_sync():  # capturable in the augmentation's CUDA graph
        cuda = aug.geometry(gpu_batch, gpu_params)
    assert torch.equal(cuda.img.cpu(), cpu.img) and torch.equal(cuda.valid.cpu(), cpu.valid)
    assert torch.equal(cuda.polygons.cpu(), cpu.polygons)


def test_copies_past_the_capacity_are_left_out_labels_and_pixels_alike_and_counted(stable_argsort):
    """A batch's bound on its copies (a training batch's: ``paste_capacity``): the first copies in row-major order
    are pasted, the rest are not, neither their labels nor their pixels, and ``paste_lost`` says how many."""
    batch = segment_batch(B, seed=3, side=0.35)
    batch.hw[:] = S
    hyp = _hyp(copy_paste=1.0, mosaic=0.0, translate=0.0, scale=0.0)  # the output is the canvas: every copy stays
    params = GpuAugment(hyp).sample(B, torch.Generator().manual_seed(3))
    every = GpuAugment(hyp).geometry(batch, params)
    few = GpuAugment(hyp, paste_capacity=2, paste_room=8).geometry(batch, params)  # room: no event dropped
    k = every.valid.shape[1] // 2
    copies = int(every.valid[:, k:].sum())
    assert copies > 3 and int(every.paste_lost) == 0
    assert int(few.valid[:, k:].sum()) == 2 and int(few.paste_lost) == copies - 2
    assert torch.equal(few.valid[:, :k], every.valid[:, :k])
    # the 2 copies kept are the first in row-major order: rows wholly kept paste as with every copy, rows without a
    # kept copy paste nothing (the image without copy-paste), a row cut short neither
    plain = GpuAugment(_hyp(mosaic=0.0, translate=0.0, scale=0.0)).geometry(batch, params)
    kept, held = few.valid[:, k:].sum(1), every.valid[:, k:].sum(1)
    whole = [r for r in range(B) if kept[r] and kept[r] == held[r]]
    none = [r for r in range(B) if not kept[r] and held[r]]
    assert none and all(torch.equal(few.img[r], plain.img[r]) and not torch.equal(few.img[r], every.img[r])
                        for r in none)
    assert all(torch.equal(few.img[r], every.img[r]) for r in whole)
    cut = [r for r in range(B) if 0 < kept[r] < held[r]]
    assert all(not torch.equal(few.img[r], every.img[r]) for r in cut) and len(whole) + len(cut) >= 1


def test_too_few_fill_slots_are_counted_as_lost():
    """The fill's pooled event slots run out: what it dropped is counted in ``paste_lost``, never silent."""
    from yolofeed.augment.masks import MaskedAugment

    batch = segment_batch(B, seed=3, side=0.35)
    hyp = _hyp(copy_paste=1.0)
    aug = MaskedAugment(hyp, mask_ratio=4)
    aug.paste_room = 0  # no event slots at all (a room of 0 is not a setting: it forces the overflow)
    out = aug(batch, torch.Generator().manual_seed(3))
    assert int(out.masks.overflow) > 0

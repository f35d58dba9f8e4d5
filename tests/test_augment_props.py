"""Properties of the augmentation that hold whatever Ultralytics does: boxes follow pixels, warps compose."""

from __future__ import annotations

import numpy as np
import torch

from helpers import random_augmented
from yolofeed.augment import AugmentHyp, GpuAugment, SourceBatch, geometry
from yolofeed.kernels.warp import warp_reference

S = 128


def _painted_batch(n: int, seed: int = 0) -> tuple[SourceBatch, torch.Tensor]:
    """n grey images of assorted sizes, each with one rectangle in a colour of its own, labelled with that rectangle."""
    g = torch.Generator().manual_seed(seed)
    images = torch.full((n, S, S, 3), 90, dtype=torch.uint8)
    hw = torch.stack([torch.randint(64, S + 1, (n,), generator=g), torch.randint(64, S + 1, (n,), generator=g)], 1)
    colours = torch.stack([torch.randperm(200, generator=g)[:n] + 40, torch.randint(0, 40, (n,), generator=g),
                           torch.randint(200, 256, (n,), generator=g)], 1).to(torch.uint8)
    boxes = torch.zeros(n, 1, 4)
    for i in range(n):  # test set-up, not the hot path
        h, w = hw[i].tolist()
        bw = torch.randint(12, w // 2, (1,), generator=g).item()
        bh = torch.randint(12, h // 2, (1,), generator=g).item()
        x1, y1 = torch.randint(0, w - bw, (1,), generator=g).item(), torch.randint(0, h - bh, (1,), generator=g).item()
        images[i, y1:y1 + bh, x1:x1 + bw] = colours[i]
        boxes[i, 0] = torch.tensor([(x1 + bw / 2) / w, (y1 + bh / 2) / h, bw / w, bh / h])
    cls = torch.arange(n, dtype=torch.float32)[:, None]  # class = which image, to find its colour
    return SourceBatch(images, hw, cls, boxes, torch.ones(n, 1, dtype=torch.bool)), colours


def test_boxes_follow_pixels():
    """Paint a box, augment (mosaic, rotation, shear, scale, translation, flips), find the paint where the box says."""
    n = 16
    batch, colours = _painted_batch(n)
    hyp = AugmentHyp(imgsz=S, degrees=25.0, shear=8.0, scale=0.4, translate=0.2, flipud=0.5, fliplr=0.5,
                     hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    checked = 0
    for seed in range(3):
        out = GpuAugment(hyp)(batch, torch.Generator().manual_seed(seed))
        for b in range(n):
            for k in torch.nonzero(out.valid[b])[:, 0].tolist():
                c = colours[int(out.cls[b, k])].int()
                close = (out.img[b].int() - c[:, None, None]).abs().sum(0) < 30  # (S, S): the painted colour
                x1, y1, x2, y2 = out.boxes[b, k].tolist()
                if min(x1, y1) < 0.5 or max(x2, y2) > S - 0.5:
                    continue  # clipped at the output edge: a rotated box's clipped hull is looser than its paint
                near = torch.zeros_like(close)
                near[max(0, int(y1) - 3):int(y2) + 3, max(0, int(x1) - 3):int(x2) + 3] = True
                ys, xs = torch.nonzero(close & near, as_tuple=True)
                if len(xs) < 4:
                    continue  # the same image twice in one mosaic, or a sliver: nothing to measure
                found = [xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1]
                # within 2 px: bilinear edges, the half-pixel between pixel centres (the warp) and pixel
                # edges (the boxes) that Ultralytics' geometry has too, and a rotated rectangle's sharp
                # corner, which bilinear sampling blends into the background (axis-aligned: < 1.2 px)
                np.testing.assert_allclose(found, [x1, y1, x2, y2], atol=2.0)
                checked += 1
    assert checked >= 30


def test_box_transforms_compose_as_matrices():
    g = torch.Generator().manual_seed(1)
    pts = torch.rand(4, 10, 2, generator=g) * S
    boxes = torch.cat([pts, pts], -1)  # degenerate boxes: points, so min/max of corners is exact
    A, B = torch.eye(3).repeat(4, 1, 1), torch.eye(3).repeat(4, 1, 1)
    A[:, :2] += torch.randn(4, 2, 3, generator=g) * 0.3
    B[:, :2] += torch.randn(4, 2, 3, generator=g) * 0.3
    two = geometry.transform_boxes(geometry.transform_boxes(boxes, A, False), B, False)
    one = geometry.transform_boxes(boxes, B @ A, False)
    torch.testing.assert_close(two, one, rtol=1e-4, atol=1e-3)


def _single(img: torch.Tensor) -> tuple:
    h, w = img.shape[1:3]
    layout = geometry.Layout(torch.tensor([[0]]), torch.tensor([[[0, 0, w, h]]]),
                             torch.zeros(1, 1, 2, dtype=torch.long), torch.tensor([[h, w]]), torch.tensor([False]))
    return layout, geometry.FlipParams(torch.tensor([False]), torch.tensor([False]))


def test_image_warps_compose_as_matrices():
    """Warping by an integer shift A, then by B, equals one warp by B @ A (up to float32 rounding: <= 1 level)."""
    g = torch.Generator().manual_seed(2)
    img = torch.randint(0, 256, (1, S, S, 3), dtype=torch.uint8, generator=g)
    A = torch.eye(3)[None].clone()
    A[0, 0, 2], A[0, 1, 2] = 7.0, -5.0
    B = torch.eye(3)[None].clone()
    B[0, :2, :2] = torch.tensor([[0.9, 0.2], [-0.15, 1.1]])
    B[0, :2, 2] = torch.tensor([4.0, 6.0])
    layout, flips = _single(img)
    first = warp_reference(img, layout, A, flips, S, False)
    second = warp_reference(first.permute(0, 2, 3, 1).contiguous(), layout, B, flips, S, False)
    direct = warp_reference(img, layout, B @ A, flips, S, False)
    # compare where neither warp reached the 114 border (a 2 px margin around the shifted-in band)
    inside = torch.zeros(S, S, dtype=torch.bool)
    inside[:S - 5 - 2, 7 + 2:] = True
    ys, xs = torch.meshgrid(torch.arange(S), torch.arange(S), indexing="ij")
    pts = torch.stack([xs.flatten().float(), ys.flatten().float(), torch.ones(S * S)], 0)
    back = torch.linalg.inv(B[0]) @ pts
    ok = inside[back[1].round().long().clamp(0, S - 1), back[0].round().long().clamp(0, S - 1)]
    ok &= (back[0] > 2) & (back[0] < S - 3) & (back[1] > 2) & (back[1] < S - 3)
    ok = ok.reshape(S, S)
    diff = (second.int() - direct.int()).abs()[0].amax(0)[ok]
    assert diff.max() <= 1 and (diff == 0).float().mean() > 0.99  # seen: 99.75 % identical


def test_integer_shift_is_an_exact_copy():
    g = torch.Generator().manual_seed(3)
    img = torch.randint(0, 256, (1, S, S, 3), dtype=torch.uint8, generator=g)
    M = torch.eye(3)[None].clone()
    M[0, 0, 2], M[0, 1, 2] = 11.0, 3.0
    layout, flips = _single(img)
    out = warp_reference(img, layout, M, flips, S, False)[0].permute(1, 2, 0)
    assert torch.equal(out[3:, 11:], img[0, :S - 3, :S - 11])
    assert (out[:3] == 114).all() and (out[:, :11] == 114).all()


def test_sampled_probabilities():
    hyp = AugmentHyp(mosaic=0.3, mixup=0.6, fliplr=0.25, flipud=0.75, bgr=0.5)
    p = GpuAugment(hyp).sample(20000, torch.Generator().manual_seed(0))
    for got, want in ((p.mosaic.apply, 0.3), (p.mixup.apply, 0.6), (p.flips.lr, 0.25), (p.flips.ud, 0.75),
                      (p.bgr, 0.5)):
        assert abs(got.float().mean().item() - want) < 0.015
    assert abs(p.mixup.ratio.mean().item() - 0.5) < 0.005 and abs(p.mixup.ratio.std().item() - (1 / 260) ** 0.5) < 0.003
    # each sample blends with a row of its own: a fresh mosaic of an image drawn uniformly from the batch
    assert torch.equal(p.mixup.partner, torch.arange(20000, 40000)) and p.mosaic.sources.shape[0] == 40000
    assert abs(p.mosaic.sources[20000:, 0].float().mean().item() - 9999.5) < 100
    assert abs(p.perspective.scale.mean().item() - 1.0) < 0.01 and p.perspective.scale.min() >= 0.5


def test_flattening_with_a_known_count_equals_boolean_indexing():
    """The sync-free flattening (count known on the host) gives the boolean-indexing rows, in the same order."""
    cases = [(4, 7, 0.5), (4, 7, 0.0), (4, 7, 1.0), (1, 5, 0.5), (1, 1, 1.0), (3, 0, 0.5), (16, 32, 0.1)]
    for seed, (b, k, p) in enumerate(cases):
        out = random_augmented(b, k, p, seed)
        ref = out.to_ultralytics()
        got = out.to_ultralytics(total=int(out.valid.sum()))
        assert got.keys() == ref.keys()
        for key in ref:
            assert got[key].dtype == ref[key].dtype and torch.equal(got[key], ref[key]), (b, k, p, key)

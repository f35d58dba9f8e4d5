"""Each augmentation op equals Ultralytics' CPU op given the same parameters.

Parameters are drawn by yolofeed and replayed through Ultralytics (its ops take a ``params`` dict;
where they draw internally, the draw is patched to return ours). Images are compared exactly:
the warp and HSV reproduce OpenCV's arithmetic bit for bit (the warp that of the release the test extra pins; other
releases round within one level, ``helpers.assert_warp_equal``). Boxes within 1e-3 px (float32 matrix
products in another summation order), the same boxes kept.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from unittest import mock

import cv2
import numpy as np
import pytest
import torch
from ultralytics.data.augment import CutMix, LetterBox, MixUp, Mosaic, RandomFlip, RandomHSV, RandomPerspective

from helpers import assert_warp_equal, source_batch, ultralytics_dataset
from yolofeed.augment import AugmentHyp, GpuAugment, color, geometry, mix
from yolofeed.augment.letterbox import letterbox
from yolofeed.augment.pipeline import compose
from yolofeed.kernels.hsv import apply_hsv, hsv_to_rgb, rgb_to_hsv
from yolofeed.kernels.warp import warp_reference

S = 160
B = 6


@pytest.fixture(scope="module")
def reference(synth_root):
    """Ultralytics' own dataset of the packed split: its load_image and labels are the reference."""
    return ultralytics_dataset(synth_root / "data.yaml", "train", S)


def _geometry_only(**kw) -> AugmentHyp:
    return AugmentHyp(imgsz=S, hsv_h=0, hsv_s=0, hsv_v=0, fliplr=0, **kw)


def _ultralytics_geometry(ref, hyp, params, b):
    """Ultralytics' Mosaic -> RandomPerspective for sample b, with yolofeed's draws."""
    labels = ref.get_image_and_label(b)
    mp = params.mosaic
    if bool(mp.apply[b]):
        mosaic = Mosaic(ref, imgsz=S, p=1.0, n=hyp.mosaic_grid)
        partners = mp.sources[b, 1:].tolist()
        xc, yc = mp.center[b].tolist()
        with mock.patch.object(mosaic, "get_indexes", return_value=partners), \
                mock.patch.object(random, "uniform", side_effect=[float(yc), float(xc)]):  # yc is drawn first
            p = mosaic.get_params(labels)
        labels = mosaic.apply_instances(mosaic.apply_image(labels, p), p)
        labels.pop("mix_labels", None)
    canvas = torch.tensor([labels["img"].shape[:2]])
    one = geometry.PerspectiveParams(*(getattr(params.perspective, f)[b:b + 1] for f in
                                       geometry.PerspectiveParams.__dataclass_fields__))
    M, scale = geometry.perspective_matrix(one, canvas, S)
    rp = RandomPerspective(degrees=hyp.degrees, translate=hyp.translate, scale=hyp.scale, shear=hyp.shear,
                           perspective=hyp.perspective, size=(S, S))
    rparams = {"M": M[0].numpy(), "scale": float(scale[0]), "orig_shape": labels["img"].shape[:2], "size": (S, S)}
    labels = rp.apply_instances(rp.apply_image(labels, rparams), rparams)
    return labels


@pytest.mark.parametrize("kw", [
    {},  # Ultralytics' defaults: mosaic 1.0, translate 0.1, scale 0.5, affine
    {"mosaic": 0.0, "degrees": 15.0, "shear": 5.0},  # single images, rotated and sheared
    {"degrees": 10.0, "perspective": 0.0008},  # warpPerspective
    {"mosaic_grid": 9, "scale": 0.3},
    {"mosaic": 0.5, "translate": 0.3, "scale": 0.9},
], ids=["default", "no-mosaic", "perspective", "mosaic9", "mixed"])
def test_mosaic_and_perspective_equal_ultralytics(pack, reference, kw):
    train = pack(S)
    hyp = _geometry_only(**kw)
    aug = GpuAugment(hyp)
    params = aug.sample(B, torch.Generator().manual_seed(len(kw)))
    out = aug.apply(source_batch(train, list(range(B))), params)
    for b in range(B):
        theirs = _ultralytics_geometry(reference, hyp, params, b)
        ours_img = out.img[b].permute(1, 2, 0).numpy()
        assert_warp_equal(ours_img, theirs["img"][..., ::-1])
        inst = theirs["instances"]
        inst.convert_bbox("xyxy")
        v = out.valid[b]
        assert int(v.sum()) == len(inst), f"sample {b}: {int(v.sum())} boxes kept, Ultralytics kept {len(inst)}"
        np.testing.assert_allclose(out.boxes[b][v].numpy(), inst.bboxes, atol=1e-3)
        np.testing.assert_array_equal(out.cls[b][v].numpy(), theirs["cls"][:, 0])


def test_flips_equal_ultralytics():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (S, S, 3), dtype=np.uint8)
    boxes = torch.tensor([[[10.0, 20.0, 50.0, 90.0], [100.0, 5.0, 160.0, 40.0]]])
    from ultralytics.utils.instance import Instances

    for ud, lr in ((True, False), (False, True), (True, True)):
        labels = {"img": img.copy(), "instances": Instances(boxes[0].numpy().copy(), bbox_format="xyxy",
                                                            normalized=False)}
        for direction, on in (("vertical", ud), ("horizontal", lr)):
            f = RandomFlip(p=1.0, direction=direction)
            p = {"flip": on, "h": S, "w": S, "direction": direction, "flip_idx": None}
            labels = f.apply_instances(f.apply_image(labels, p), p)
        fp = geometry.FlipParams(torch.tensor([ud]), torch.tensor([lr]))
        layout = geometry.Layout(torch.tensor([[0]]), torch.tensor([[[0, 0, S, S]]]),
                                 torch.zeros(1, 1, 2, dtype=torch.long), torch.tensor([[S, S]]), torch.tensor([False]))
        ours = warp_reference(torch.from_numpy(img)[None], layout, torch.eye(3)[None], fp, S, False)
        np.testing.assert_array_equal(ours[0].permute(1, 2, 0).numpy(), labels["img"])
        labels["instances"].convert_bbox("xyxy")
        np.testing.assert_allclose(geometry.flip_boxes(boxes, fp, S)[0].numpy(), labels["instances"].bboxes)


def test_hsv_equals_ultralytics():
    hyp = AugmentHyp(imgsz=S, hsv_h=0.5, hsv_s=0.9, hsv_v=0.9)  # large gains: every LUT branch is used
    p = color.sample_hsv(4, hyp, torch.Generator().manual_seed(1), torch.device("cpu"))
    imgs = torch.from_numpy(np.random.default_rng(2).integers(0, 256, (4, 3, 64, 64), dtype=np.uint8))
    imgs[:, :, :8, :8] = 255  # pure white, which 8.3.79's lut_sat[0] = 0 keeps white
    ours = apply_hsv(imgs, color.hsv_luts(p))
    t = RandomHSV(hgain=hyp.hsv_h, sgain=hyp.hsv_s, vgain=hyp.hsv_v)
    for b in range(4):
        bgr = np.ascontiguousarray(imgs[b].permute(1, 2, 0).numpy()[..., ::-1])
        u = (p.gains[b] / torch.tensor([hyp.hsv_h, hyp.hsv_s, hyp.hsv_v], dtype=torch.float64)).numpy()
        with mock.patch.object(np.random, "uniform", return_value=u):
            t.apply_image({"img": bgr})  # in place
        np.testing.assert_array_equal(ours[b].permute(1, 2, 0).numpy(), bgr[..., ::-1])


def test_hsv_conversions_equal_opencv():
    """``rgb_to_hsv`` and ``hsv_to_rgb`` are ``cv2.cvtColor``'s uint8 RGB <-> HSV (hue 0-179), bit for bit: every
    (red, green) pair with blue in steps of 15, and every (hue, saturation) pair with value in steps of 15."""
    levels = np.arange(256, dtype=np.uint8)
    r, g, b = np.meshgrid(levels, levels, levels[::15], indexing="ij")
    rgb = np.stack([r, g, b], -1).reshape(256, -1, 3)  # one image, 1.2 M colours
    np.testing.assert_array_equal(rgb_to_hsv(torch.from_numpy(rgb)).numpy(),
                                  cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV))
    h, s, v = np.meshgrid(np.arange(180, dtype=np.uint8), levels, levels[::15], indexing="ij")
    hsv = np.stack([h, s, v], -1).reshape(180, -1, 3)  # 0.8 M triples
    np.testing.assert_array_equal(hsv_to_rgb(torch.from_numpy(hsv)).numpy(),
                                  cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB))


def test_mixup_equals_ultralytics():
    rng = np.random.default_rng(3)
    imgs = torch.from_numpy(rng.integers(0, 256, (8, 3, 32, 32), dtype=np.uint8))  # 4 samples, then their partners
    p = mix.sample_mixup(torch.tensor([6, 4, 7, 5]), AugmentHyp(mixup=1.0), torch.Generator().manual_seed(0))
    ours = compose(imgs, p, None, None, None, 4)
    assert ours.shape[0] == 4
    for b in range(4):
        a, o = imgs[b].permute(1, 2, 0).numpy(), imgs[p.partner[b]].permute(1, 2, 0).numpy()
        labels = MixUp(None).apply_image({"img": a.copy(), "mix_labels": [{"img": o}]}, {"r": float(p.ratio[b])})
        np.testing.assert_array_equal(ours[b].permute(1, 2, 0).numpy(), labels["img"])
    assert 0.3 < float(p.ratio.min()) and float(p.ratio.max()) < 0.7  # Beta(32, 32) is tight around 0.5


def _labels_of(rows, k: int) -> dict:
    """Row ``k`` of augmented rows as Ultralytics' labels dict (HWC image, xyxy pixel boxes)."""
    from ultralytics.utils.instance import Instances

    return {"img": np.ascontiguousarray(rows.img[k].permute(1, 2, 0).numpy()),
            "cls": rows.cls[k][rows.valid[k]].numpy()[:, None],
            "instances": Instances(rows.boxes[k][rows.valid[k]].numpy().copy(), bbox_format="xyxy", normalized=False)}


def test_cutmix_equals_ultralytics(pack):
    train = pack(S)
    hyp = _geometry_only(cutmix=1.0, mosaic=0.0)
    aug = GpuAugment(hyp)
    checked = 0
    for seed in range(6):
        params = aug.sample(B, torch.Generator().manual_seed(seed))
        batch = source_batch(train, list(range(B)))
        out = aug.apply(batch, params)
        base = aug.geometry(batch, params)  # every row before mixing: the B samples, then their CutMix partners
        assert len(base.img) == 2 * B and bool((params.cutmix.partner == torch.arange(B, 2 * B)).all())
        boxes, valid = base.boxes[:B], base.valid[:B]
        plan = mix.plan_cutmix(params.cutmix, boxes, valid, base.boxes, base.valid, S)
        areas = mix.cutmix_areas(params.cutmix, S)
        for b in range(B):
            if not bool(params.cutmix.apply[b]):
                continue
            j = int(params.cutmix.partner[b])
            labels, partner = _labels_of(base, b), _labels_of(base, j)
            cm = CutMix(SimpleNamespace(get_image_and_label=lambda i, pl=partner: pl), p=1.0)
            lam = params.cutmix.lam[b].tolist()
            c = (params.cutmix.centre[b] * S).floor().long().tolist()
            draws = [v for k in range(3) for v in (c[k][0], c[k][1])]
            free = [k for k in range(3) if (mix.ioa(areas[b, k:k + 1], boxes[b][valid[b]]).sum() <= 0)]
            chosen = max(free, key=lambda k: float(params.cutmix.pick[b, k])) if free else None
            with mock.patch.object(cm, "get_indexes", return_value=0), \
                    mock.patch.object(np.random, "beta", side_effect=lam), \
                    mock.patch.object(np.random, "randint", side_effect=draws), \
                    mock.patch.object(np.random, "choice", return_value=chosen):
                cp = cm.get_params(labels)
            assert bool(plan.apply[b]) == (not cp.get("skip", False))
            labels = cm.apply_instances(cm.apply_image(labels, cp), cp)
            np.testing.assert_array_equal(out.img[b].permute(1, 2, 0).numpy(), labels["img"])
            v = out.valid[b]
            labels["instances"].convert_bbox("xyxy")
            np.testing.assert_allclose(out.boxes[b][v].numpy(), labels["instances"].bboxes, atol=1e-3)
            np.testing.assert_array_equal(out.cls[b][v].numpy(), labels["cls"][:, 0])
            checked += 1
    assert checked >= 5


def test_letterbox_equals_ultralytics(pack):
    train = pack(S)
    idx = list(range(5))
    batch = source_batch(train, idx)
    for shape in ((S, S), (S, 192), (192, 224)):  # square val, and rect batch shapes (never smaller than images)
        ours, off = letterbox(batch.images, batch.hw, shape)
        for k, i in enumerate(idx):
            theirs = LetterBox(new_shape=shape, scaleup=False)(image=np.ascontiguousarray(train.image(i)))
            np.testing.assert_array_equal(ours[k].permute(1, 2, 0).numpy(), theirs)
    with pytest.raises(ValueError, match="do not fit"):
        letterbox(batch.images, batch.hw, (64, 64))


def test_probability_zero_is_the_identity(pack):
    """Nothing on: an S x S input comes out unchanged, boxes and all."""
    train = pack(S)
    hyp = AugmentHyp(imgsz=S, mosaic=0.0, translate=0.0, scale=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, fliplr=0.0)
    batch = source_batch(train, list(range(B)))
    rng = torch.Generator().manual_seed(0)
    batch.images = torch.randint(0, 256, batch.images.shape, dtype=torch.uint8, generator=rng)
    batch.hw[:] = S
    out = GpuAugment(hyp)(batch, rng)
    np.testing.assert_array_equal(out.img.permute(0, 2, 3, 1).numpy(), batch.images.numpy())
    expect = geometry.xywhn_to_xyxy(batch.boxes, batch.hw[:, None, :]).clamp(0, S)  # the warp clips to the image
    small = (expect[..., 2] - expect[..., 0] <= 2) | (expect[..., 3] - expect[..., 1] <= 2)  # box_candidates' 2 px
    n = batch.valid.shape[1]  # the other mosaic tiles' slots stay empty
    assert torch.equal(out.valid[:, :n], batch.valid & ~small) and not out.valid[:, n:].any()
    torch.testing.assert_close(out.boxes[:, :n][out.valid[:, :n]], expect[out.valid[:, :n]])


def test_closed_mosaic_turns_off_only_the_mix_ops():
    hyp = AugmentHyp(mosaic=1.0, mixup=0.3, cutmix=0.2, degrees=5.0)
    closed = hyp.closed()
    assert (closed.mosaic, closed.mixup, closed.cutmix, closed.copy_paste) == (0, 0, 0, 0)
    assert closed.degrees == 5.0 and closed.fliplr == hyp.fliplr


def test_hyp_defaults_are_ultralytics_defaults():
    from ultralytics.cfg import get_cfg

    cfg = vars(get_cfg())
    default = AugmentHyp()
    for k in ("mosaic", "mixup", "cutmix", "degrees", "translate", "scale", "shear", "perspective", "hsv_h", "hsv_s",
              "hsv_v", "flipud", "fliplr", "bgr", "close_mosaic"):
        assert getattr(default, k) == cfg[k], k
    assert AugmentHyp.from_args({"mosaic": 0.5, "imgsz": 320}).mosaic == 0.5


def test_bad_hyperparameters_are_explained():
    from yolofeed.errors import ConfigError

    with pytest.raises(ConfigError, match="mixup=1.5"):
        AugmentHyp(mixup=1.5)
    with pytest.raises(ConfigError, match="mosaic_grid"):
        AugmentHyp(mosaic_grid=6)

"""The pose task's keypoints through every op: equal to Ultralytics' own transforms given the same draws.

As ``test_augment_ops.py`` does for boxes: yolofeed draws, and the draws are replayed through Ultralytics'
``Mosaic``, ``RandomPerspective``, ``MixUp``, ``CutMix``, ``RandomFlip`` (with ``flip_idx``) and ``Format``, whose
``Instances`` carry the same keypoints. Positions agree within 1e-3 px (float32 matrix products summed in another
order), visibility exactly, row for row with the boxes. A detection batch (no keypoints) augments bit for bit as
before, from the same draws.
"""

from __future__ import annotations

import dataclasses
import warnings
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
import replay
import torch
from ultralytics.data.augment import CutMix, Format, MixUp, RandomFlip
from ultralytics.data.dataset import YOLODataset
from ultralytics.utils.instance import Instances
from ultralytics.utils.metrics import bbox_ioa

from helpers import no_host_sync, to_device
from yolofeed.augment import AugmentHyp, GpuAugment, geometry, mix
from yolofeed.augment.pipeline import CARRIED
from yolofeed.augment.pool import PartnerPool
from yolofeed.errors import ConfigError
from yolofeed.schema import AugmentedBatch, SourceBatch

S, B, P = 160, 6, 5
FLIP_IDX = (0, 2, 1, 4, 3)  # a nose, then left/right pairs: the order after a flip
KPT = {"kpt_shape": (P, 3), "flip_idx": FLIP_IDX}


def pose_batch(n: int, seed: int, width: int = 5, side: float = 0.4) -> SourceBatch:
    """n random images of assorted sizes with ``width`` label slots, each box (up to ``side`` of the image wide and
    high) with P keypoints around it: visible (2), occluded (1), or absent (0, at (0, 0) as COCO stores them); some
    on the image's edge."""
    g = torch.Generator().manual_seed(seed)
    hw = torch.stack([torch.randint(S // 2, S + 1, (n,), generator=g), torch.randint(S // 2, S + 1, (n,), generator=g)],
                     1)
    images = torch.randint(0, 256, (n, S, S, 3), dtype=torch.uint8, generator=g)
    centre = torch.rand(n, width, 2, generator=g) * 0.8 + 0.1
    wh = torch.rand(n, width, 2, generator=g) * side + 0.05
    boxes = torch.cat([centre, wh], -1)
    valid = torch.rand(n, width, generator=g) < 0.85
    xy = (centre[:, :, None] + (torch.rand(n, width, P, 2, generator=g) - 0.5) * wh[:, :, None] * 1.6).clamp(0, 1)
    vis = torch.randint(0, 3, (n, width, P), generator=g).float()
    xy = torch.where(vis[..., None] == 0, torch.zeros_like(xy), xy)
    return SourceBatch(images, hw, torch.randint(0, 3, (n, width), generator=g).float(), boxes, valid,
                       keypoints=torch.cat([xy, vis[..., None]], -1))


class Reference:
    """Ultralytics' view of a ``pose_batch``: ``get_image_and_label`` as ``YOLODataset`` gives it for pose."""

    cache, buffer = None, []

    def __init__(self, batch: SourceBatch):
        self.batch = batch

    def get_image_and_label(self, i: int) -> dict:
        b = self.batch
        h, w = b.hw[i].tolist()
        v = b.valid[i]
        img = np.ascontiguousarray(b.images[i, :h, :w].numpy()[..., ::-1])  # BGR, as load_image gives
        inst = Instances(b.boxes[i][v].numpy().copy(), keypoints=b.keypoints[i][v].numpy().copy(), bbox_format="xywh",
                         normalized=True)
        return {"im_file": f"{i}.jpg", "img": img, "ori_shape": (h, w), "resized_shape": (h, w),
                "cls": b.cls[i][v].numpy()[:, None].copy(), "instances": inst}


def ultralytics_geometry(ref: Reference, hyp: AugmentHyp, params, row: int) -> dict:
    return replay.geometry(ref, hyp, params, row, S)


def ultralytics_flips(labels: dict, ud: bool, lr: bool, flip_idx=FLIP_IDX) -> dict:
    return replay.flips(labels, ud, lr, S, flip_idx)


def assert_keypoints(ours: torch.Tensor, theirs: np.ndarray, what: str = "") -> None:
    """Positions within 1e-3 px, visibility exactly. Shape: (n, P, 3) both."""
    assert ours.shape == theirs.shape, (what, tuple(ours.shape), theirs.shape)
    np.testing.assert_allclose(ours[..., :2].numpy(), theirs[..., :2], atol=1e-3, err_msg=what)
    np.testing.assert_array_equal(ours[..., 2].numpy(), theirs[..., 2], err_msg=what)


def assert_row(out, b: int, labels: dict) -> int:
    """Sample b of our output against Ultralytics' labels: the same boxes kept, their keypoints in their rows."""
    inst = labels["instances"]
    inst.convert_bbox("xyxy")
    v = out.valid[b]
    assert int(v.sum()) == len(inst), f"sample {b}: {int(v.sum())} boxes kept, Ultralytics kept {len(inst)}"
    np.testing.assert_allclose(out.boxes[b][v].numpy(), inst.bboxes, atol=1e-3)
    np.testing.assert_array_equal(out.cls[b][v].numpy(), labels["cls"][:, 0])
    assert_keypoints(out.keypoints[b][v], inst.keypoints, f"sample {b}")
    return len(inst)


def _hyp(**kw) -> AugmentHyp:
    base = {"imgsz": S, "hsv_h": 0, "hsv_s": 0, "hsv_v": 0, "fliplr": 0} | KPT
    return AugmentHyp(**(base | kw))


@pytest.mark.parametrize("kw", [
    {},  # Ultralytics' defaults: mosaic 1.0, translate 0.1, scale 0.5, affine
    {"mosaic": 0.0, "degrees": 15.0, "shear": 5.0},
    {"degrees": 10.0, "perspective": 0.0008},  # warpPerspective: the perspective divide
    {"mosaic_grid": 9, "scale": 0.3},
    {"mosaic": 0.5, "translate": 0.3, "scale": 0.9},  # many points pushed off the output
], ids=["default", "no-mosaic", "perspective", "mosaic9", "mixed"])
def test_mosaic_and_perspective_keypoints_equal_ultralytics(kw):
    batch = pose_batch(B, seed=len(kw))
    hyp = _hyp(**kw)
    aug = GpuAugment(hyp)
    params = aug.sample(B, torch.Generator().manual_seed(len(kw)))
    out = aug.apply(batch, params)
    ref = Reference(batch)
    kept = sum(assert_row(out, b, ultralytics_geometry(ref, hyp, params, b)) for b in range(B))
    assert kept >= B
    hidden = out.keypoints[..., 2][out.valid] == 0
    assert hidden.any() and not hidden.all()


def test_flips_move_and_reorder_keypoints_as_ultralytics():
    g = torch.Generator().manual_seed(0)
    kp = torch.cat([torch.rand(1, 3, P, 2, generator=g) * S, torch.randint(0, 3, (1, 3, P, 1), generator=g).float()],
                   -1)
    boxes = torch.tensor([[[10.0, 20.0, 50.0, 90.0], [100.0, 5.0, 160.0, 40.0], [0.0, 0.0, 160.0, 160.0]]])
    for ud, lr in ((True, False), (False, True), (True, True), (False, False)):
        labels = {"img": np.zeros((S, S, 3), np.uint8), "instances": Instances(
            boxes[0].numpy().copy(), keypoints=kp[0].numpy().copy(), bbox_format="xyxy", normalized=False)}
        theirs = ultralytics_flips(labels, ud, lr)["instances"]
        fp = geometry.FlipParams(torch.tensor([ud]), torch.tensor([lr]))
        ours = geometry.flip_keypoints(kp, fp.ud, S, 1, FLIP_IDX)
        ours = geometry.flip_keypoints(ours, fp.lr, S, 0, FLIP_IDX)
        assert_keypoints(ours[0], theirs.keypoints, f"ud={ud} lr={lr}")
        if ud != lr:  # one flip: the left/right pairs swapped; two: swapped back
            assert torch.equal(ours[0, :, 1, 2], kp[0, :, 2, 2])
        theirs.convert_bbox("xyxy")
        np.testing.assert_allclose(geometry.flip_boxes(boxes, fp, S)[0].numpy(), theirs.bboxes)
    without = RandomFlip(p=1.0, direction="horizontal", flip_idx=None)  # Ultralytics' detection flip: no reorder
    labels = {"img": np.zeros((S, S, 3), np.uint8), "instances": Instances(
        boxes[0].numpy().copy(), keypoints=kp[0].numpy().copy(), bbox_format="xyxy", normalized=False)}
    p = {"flip": True, "h": S, "w": S, "direction": "horizontal", "flip_idx": None}
    theirs = without.apply_instances(labels, p)["instances"]
    assert_keypoints(geometry.flip_keypoints(kp, torch.tensor([True]), S, 0, None)[0], theirs.keypoints)


def _labels_of(rows, k: int) -> dict:
    """Row ``k`` of our augmented rows as Ultralytics' labels dict (HWC image, xyxy pixel boxes, keypoints)."""
    v = rows.valid[k]
    return {"img": np.ascontiguousarray(rows.img[k].permute(1, 2, 0).numpy()), "cls": rows.cls[k][v].numpy()[:, None],
            "instances": Instances(rows.boxes[k][v].numpy().copy(), keypoints=rows.keypoints[k][v].numpy().copy(),
                                   bbox_format="xyxy", normalized=False)}


def test_mixup_keeps_both_images_keypoints_as_ultralytics():
    batch = pose_batch(B, seed=7)
    aug = GpuAugment(_hyp(mixup=0.6))
    params = aug.sample(B, torch.Generator().manual_seed(7))
    out, base = aug.apply(batch, params), aug.geometry(batch, params)
    assert params.mixup.apply.any() and not params.mixup.apply.all()
    for b in range(B):
        labels = _labels_of(base, b)
        if bool(params.mixup.apply[b]):
            labels["mix_labels"] = [_labels_of(base, int(params.mixup.partner[b]))]
            labels = MixUp(None).apply_instances(labels, {})
        assert_row(out, b, labels)


def _ultralytics_cutmix(labels: dict, partner: dict, params, b: int) -> dict:
    """Ultralytics' CutMix on sample b's labels with our draws (the existing box test's replay)."""
    cm = CutMix(SimpleNamespace(get_image_and_label=lambda i: partner), p=1.0)
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


def test_cutmix_clips_the_partner_keypoints_to_the_area_as_ultralytics():
    checked = 0
    for seed in range(4):
        batch = pose_batch(B, seed=10 + seed)
        aug = GpuAugment(_hyp(cutmix=1.0, mosaic=0.0, scale=0.9))
        params = aug.sample(B, torch.Generator().manual_seed(seed))
        out, base = aug.apply(batch, params), aug.geometry(batch, params)
        for b in range(B):
            partner = _labels_of(base, int(params.cutmix.partner[b]))
            checked += assert_row(out, b, _ultralytics_cutmix(_labels_of(base, b), partner, params, b)) > 0
    assert checked >= 12
    pasted = out.keypoints[:, base.valid.shape[1]:][out.valid[:, base.valid.shape[1]:]]
    assert len(pasted) and (pasted[..., 2] == 0).any()  # partner points outside the area: invisible


def _format_and_collate(per_sample: list[dict]) -> dict:
    """Ultralytics' ``Format`` as ``YOLODataset.build_transforms`` appends it for pose, then ``collate_fn``."""
    fmt = Format(bbox_format="xywh", normalize=True, return_mask=False, return_keypoint=True, return_obb=False,
                 batch_idx=True, mask_ratio=4, mask_overlap=True, bgr=0.0)
    keys = ("img", "cls", "bboxes", "keypoints", "batch_idx")
    return YOLODataset.collate_fn([{k: v for k, v in fmt(x).items() if k in keys} for x in per_sample])


@pytest.mark.parametrize("kw, n, labels", [
    ({"mixup": 0.5, "flipud": 0.5, "fliplr": 0.5, "degrees": 10.0}, B, {}),
    ({"mixup": 0.5, "cutmix": 1.0, "mosaic": 0.0, "scale": 0.9}, 12, {"width": 2, "side": 0.2}),  # room to paste
], ids=["mixup-flips", "mixup-cutmix"])
def test_the_pipeline_gives_ultralytics_pose_batch(kw, n, labels):
    """v8_transforms' ops in its order (Mosaic, RandomPerspective, MixUp, CutMix, RandomFlip up-down and left-right
    with flip_idx, then Format and collate_fn), our draws replayed, against ``to_ultralytics()``.

    Our flips run per row before mixing (``pipeline``); Ultralytics flips the mixed sample. Given the same flip for a
    sample and its partners the two agree exactly, so the partners' flip draws are set to their sample's. CutMix
    picks its area in the flipped frame here, in the unflipped one there (equal in distribution): with CutMix on the
    flips are off.
    """
    batch = pose_batch(n, seed=21, **labels)
    hyp = _hyp(**({"hsv_h": 0.015} | kw))  # HSV leaves keypoints alone
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
            labels = MixUp(None).apply_instances(labels, {})
            labels.pop("mix_labels")
        if hyp.cutmix and bool(params.cutmix.apply[b]):
            partner = ultralytics_geometry(ref, hyp, params, int(params.cutmix.partner[b]))
            before = len(labels["instances"])
            labels = _ultralytics_cutmix(labels, partner, params, b)
            pasted += len(labels["instances"]) > before
        per_sample.append(ultralytics_flips(labels, bool(params.flipud[b]), bool(params.fliplr[b])))
    theirs = _format_and_collate(per_sample)
    ours = out.to_ultralytics()
    assert ours["keypoints"].shape == theirs["keypoints"].shape and ours["keypoints"].dtype == torch.float32
    assert len(theirs["keypoints"]) > 2 * n
    torch.testing.assert_close(ours["keypoints"][..., :2], theirs["keypoints"][..., :2], atol=1e-3 / S, rtol=0)
    assert torch.equal(ours["keypoints"][..., 2], theirs["keypoints"][..., 2])
    torch.testing.assert_close(ours["bboxes"], theirs["bboxes"], atol=1e-3 / S, rtol=0)
    assert torch.equal(ours["batch_idx"], theirs["batch_idx"]) and torch.equal(ours["cls"], theirs["cls"])
    if hyp.fliplr:
        assert params.fliplr[:n].any() and params.flipud[:n].any() and not params.fliplr[:n].all()
    if hyp.cutmix:
        assert pasted >= 3


def test_probability_zero_is_the_identity_for_keypoints():
    """Nothing on: an S x S image's keypoints come out where they were, in pixels, visibility kept."""
    batch = pose_batch(B, seed=3)
    batch.hw[:] = S
    hyp = AugmentHyp(imgsz=S, mosaic=0.0, translate=0.0, scale=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, fliplr=0.0, **KPT)
    out = GpuAugment(hyp)(batch, torch.Generator().manual_seed(0))
    n = batch.valid.shape[1]
    v = out.valid[:, :n]
    expect = torch.cat([batch.keypoints[..., :2] * S, batch.keypoints[..., 2:]], -1)
    assert v.sum() > B and not out.valid[:, n:].any()
    torch.testing.assert_close(out.keypoints[:, :n][v], expect[v])
    formatted = out.to_ultralytics()["keypoints"]
    torch.testing.assert_close(formatted, batch.keypoints[v], atol=1e-6, rtol=0)


def test_a_detection_batch_draws_and_augments_as_before():
    """The same batch with and without keypoints: identical pixels, boxes and draws (keypoints add no draw)."""
    batch = pose_batch(B, seed=4)
    detection = dataclasses.replace(batch, keypoints=None)
    kw = {"imgsz": S, "mixup": 0.5, "cutmix": 0.5, "degrees": 5.0, "flipud": 0.3}
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    plain = GpuAugment(AugmentHyp(**kw))(detection, g1)
    pose = GpuAugment(AugmentHyp(**kw, **KPT))(batch, g2)
    assert plain.keypoints is None and pose.keypoints is not None
    assert pose.keypoints.shape == (*pose.valid.shape, P, 3)
    for f in ("img", "cls", "boxes", "valid"):
        assert torch.equal(getattr(plain, f), getattr(pose, f)), f
    assert torch.equal(g1.get_state(), g2.get_state())
    assert set(plain.to_ultralytics()) == {"img", "cls", "bboxes", "batch_idx"}


def test_flattening_keypoints_with_a_known_count_equals_boolean_indexing():
    out = GpuAugment(_hyp(mixup=0.5))(pose_batch(B, seed=5), torch.Generator().manual_seed(5))
    ref, got = out.to_ultralytics(), out.to_ultralytics(total=int(out.valid.sum()))
    assert got.keys() == ref.keys() and "keypoints" in got
    for key in ref:
        assert torch.equal(got[key], ref[key]), key
    assert ref["keypoints"].shape == (len(ref["bboxes"]), P, 3)


def test_the_pool_keeps_keypoints_and_gives_the_gathered_batch():
    """Partners from a PartnerPool's ring: the same keypoints as the images gathered as a batch."""
    batch = pose_batch(B, seed=6, width=3)
    aug, pool = GpuAugment(_hyp(mixup=0.5, degrees=5.0)), PartnerPool(12, B)
    first = pool.push(batch)
    params = aug.sample(B, torch.Generator().manual_seed(6), partners=pool.partners(first, B))
    pooled = aug.apply(pool.sources, params)
    assert torch.equal(pool.sources.keypoints[:B, :3], batch.keypoints)
    pad = pool.sources.valid.shape[1] - 3
    gathered = SourceBatch(batch.images, batch.hw, torch.nn.functional.pad(batch.cls, (0, pad)),
                           torch.nn.functional.pad(batch.boxes, (0, 0, 0, pad)),
                           torch.nn.functional.pad(batch.valid, (0, pad)),
                           keypoints=torch.nn.functional.pad(batch.keypoints, (0, 0, 0, 0, 0, pad)))
    plain = aug.apply(gathered, params)
    assert torch.equal(pooled.valid, plain.valid) and pooled.valid.any()
    assert torch.equal(pooled.keypoints[pooled.valid], plain.keypoints[plain.valid])
    with pytest.raises(ValueError, match="keypoints"):
        pool.push(dataclasses.replace(batch, keypoints=None))  # one pool, one dataset


def test_keypoint_settings_are_checked_as_ultralytics_checks_them():
    batch = pose_batch(2, seed=8)
    with pytest.raises(ConfigError, match="no kpt_shape"):
        GpuAugment(AugmentHyp(imgsz=S))(batch)
    with pytest.raises(ConfigError, match="expected"):
        GpuAugment(AugmentHyp(imgsz=S, kpt_shape=(17, 3), fliplr=0.0))(batch)
    with pytest.raises(ConfigError, match="flip_idx"):
        AugmentHyp(kpt_shape=(P, 3), flip_idx=(0, 1, 2))
    # the yaml's kpt_shape may be the wrong one (17 with labels of 5 keypoints): the message says either can be
    with pytest.raises(ConfigError, match=r"flip_idx=\[0, 3, 2, 1, 4\]: expected kpt_shape\[0\]=17 .*; or "
                                          r"kpt_shape=\[17, 3\] is the one to mend: the label rows hold 5 \+ "
                                          r"keypoints x 3 columns"):
        AugmentHyp(kpt_shape=(17, 3), flip_idx=(0, 3, 2, 1, 4))
    with pytest.raises(ConfigError, match="kpt_shape"):
        AugmentHyp(kpt_shape=(P, 4))
    for bad in ([None] * P, [1.5, 3, 2, 1, 4], ["0", "3", "2", "1", "4"], "abc", 5, True):  # one line, no traceback
        with pytest.raises(ConfigError, match="flip_idx=.*whole numbers"):
            AugmentHyp(kpt_shape=(P, 3), flip_idx=bad)
    with pytest.raises(ConfigError, match="kpt_shape"):
        AugmentHyp(kpt_shape=[5.0, 3])
    with pytest.warns(UserWarning, match="no flip_idx"):  # v8_transforms: no flip_idx, no flips for pose
        hyp = AugmentHyp(kpt_shape=[P, 2], fliplr=0.5, flipud=0.1)
    assert (hyp.fliplr, hyp.flipud, hyp.kpt_shape) == (0.0, 0.0, (P, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert AugmentHyp(kpt_shape=(P, 3), flip_idx=list(FLIP_IDX)).flip_idx == FLIP_IDX
    data = {"kpt_shape": [P, 3], "flip_idx": list(FLIP_IDX)}
    assert AugmentHyp.from_args({"task": "pose"}, data=data).kpt_shape == (P, 3)
    assert AugmentHyp.from_args({"task": "detect"}, data=data).kpt_shape is None  # keypoints only for pose


def test_an_augmented_batch_with_polygons_and_no_masks_is_refused():
    out = GpuAugment(_hyp())(pose_batch(2, seed=9), torch.Generator().manual_seed(0))
    assert isinstance(out, AugmentedBatch) and out.kinds() == ("keypoints",)
    with pytest.raises(ConfigError, match="no masks"):  # a segment loss would read masks that were never made
        dataclasses.replace(out, segments=torch.zeros(*out.valid.shape, 1000, 2)).to_ultralytics()


def test_every_op_carries_keypoints_corners_and_polygons():
    assert CARRIED == ("keypoints", "corners", "polygons")


def _on_cuda(batch: SourceBatch) -> SourceBatch:
    return SourceBatch(*(t.cuda() for t in (batch.images, batch.hw, batch.cls, batch.boxes, batch.valid)),
                       keypoints=batch.keypoints.cuda())


@pytest.mark.gpu
def test_cuda_keypoints_equal_the_cpu_path_and_make_no_host_sync():
    batch = pose_batch(16, seed=30)
    aug = GpuAugment(_hyp(mixup=0.5, cutmix=0.5, degrees=5.0, fliplr=0.5, flipud=0.2))
    params = aug.sample(16, torch.Generator().manual_seed(30))
    ref, got = aug.apply(batch, params), aug.apply(_on_cuda(batch), to_device(params, "cuda"))
    assert torch.equal(got.valid.cpu(), ref.valid)
    v = ref.valid
    torch.testing.assert_close(got.keypoints.cpu()[v][..., :2], ref.keypoints[v][..., :2], atol=1e-3, rtol=0)
    assert torch.equal(got.keypoints.cpu()[v][..., 2], ref.keypoints[v][..., 2])
    cuda, g = _on_cuda(batch), torch.Generator(device="cuda").manual_seed(0)
    pool = PartnerPool(40, 16)
    for run in (lambda: aug(cuda, g), lambda: aug(cuda, g, pool)):
        run()  # warm up: Triton compiles on first use
        with no_host_sync():
            out = run()
        total = int(out.valid.sum())
        with no_host_sync():
            flat = out.to_ultralytics(total=total)
        assert flat["keypoints"].shape == (total, P, 3)


@pytest.mark.gpu
def test_graphed_augment_carries_keypoints():
    from yolofeed.augment.graphs import GraphedAugment

    cuda = _on_cuda(pose_batch(16, seed=31))
    aug = GpuAugment(_hyp(mixup=0.3, degrees=5.0, fliplr=0.5))
    for pool in (None, PartnerPool(40, 16)):
        a, b = GraphedAugment(aug, seed=7, pool=pool), GraphedAugment(aug, seed=7, pool=pool and PartnerPool(40, 16))
        first = [x.keypoints.clone() for x in (a(cuda), b(cuda))]
        assert torch.equal(first[0], first[1])  # same seed, same draws
        with no_host_sync():
            out = a(cuda)
        assert a.captured == 1 and not torch.equal(out.keypoints, first[0])  # each replay draws anew
        assert out.keypoints.shape == (*out.valid.shape, P, 3)

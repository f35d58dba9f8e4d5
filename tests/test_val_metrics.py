"""The batched update_metrics against Ultralytics' own, image by image: the same statistics, hence the same mAP."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from yolofeed.train.val_metrics import match_batch, padded_iou, update_metrics
from yolofeed.ultralytics_seam import DetectionValidator

NC = 5


def validator(**args) -> DetectionValidator:
    v = DetectionValidator(args={**dict(conf=0.001, iou=0.7, max_det=300, plots=False, save_json=False), **args})
    v.device, v.training, v.data = torch.device("cpu"), True, {"val": "val"}
    v.dataloader = SimpleNamespace(dataset=SimpleNamespace(im_files=[]), sampler=[])
    v.init_metrics(SimpleNamespace(names={i: str(i) for i in range(NC)}))
    return v


def make_batch(rng: np.random.Generator, n: int, h: int = 96, w: int = 128, grid: bool = False,
               dtype=torch.float32, max_targets: int = 6, max_preds: int = 12):
    """A validator batch and postprocess-like predictions. ``grid``: coordinates on a coarse grid and few classes, so
    that IoUs and confidences tie and boxes repeat exactly."""
    preds, cls, boxes, bidx = [], [], [], []
    for i in range(n):
        t = int(rng.integers(0, max_targets + 1))
        p = int(rng.integers(0, max_preds + 1))
        def xyxy(k):
            if grid:
                a = rng.integers(0, 4, (k, 2)) * 16.0
                b = a + rng.integers(1, 4, (k, 2)) * 16.0
            else:
                a = rng.uniform(0, 80, (k, 2))
                b = a + rng.uniform(1, 50, (k, 2))
            return np.concatenate([a, b], 1).astype(np.float32)
        tb = xyxy(t)
        if t and p:  # detections near the targets, some exact copies
            pb = np.concatenate([tb[rng.integers(0, t, p // 2)], xyxy(p - p // 2)])
            pb[: p // 4] += rng.normal(0, 0 if grid else 3, (p // 4, 4)).astype(np.float32)
        else:
            pb = xyxy(p)
        k = 2 if grid else NC
        conf = np.sort(rng.choice([0.5, 0.25, 0.125], p) if grid else rng.uniform(0.001, 1, p))[::-1].copy()
        preds.append({"bboxes": torch.from_numpy(pb).to(dtype), "conf": torch.from_numpy(conf).to(dtype),
                      "cls": torch.from_numpy(rng.integers(0, k, p).astype(np.float32)).to(dtype),
                      "extra": torch.zeros(p, 0, dtype=dtype)})
        cls.append(rng.integers(0, k, t))
        xywh = np.concatenate([(tb[:, :2] + tb[:, 2:]) / 2, tb[:, 2:] - tb[:, :2]], 1) / [w, h, w, h]
        boxes.append(xywh.astype(np.float32))
        bidx.append(np.full(t, i))
    perm = rng.permutation(sum(len(c) for c in cls))  # batch_idx need not be sorted
    batch = {"img": torch.zeros(n, 3, h, w), "cls": torch.from_numpy(np.concatenate(cls)[perm]).float()[:, None],
             "bboxes": torch.from_numpy(np.concatenate(boxes)[perm]).float(),
             "batch_idx": torch.from_numpy(np.concatenate(bidx)[perm]).float(),
             "ori_shape": [(h, w)] * n, "ratio_pad": [((1.0, 1.0), (0, 0))] * n,
             "im_file": [f"d/{i}.jpg" for i in range(n)]}
    return preds, batch


def clone(preds):
    return [{k: v.clone() for k, v in p.items()} for p in preds]


def assert_same(ours: DetectionValidator, theirs: DetectionValidator):
    assert ours.seen == theirs.seen
    for key in theirs.metrics.stats:
        a, b = ours.metrics.stats[key], theirs.metrics.stats[key]
        assert len(a) == len(b), key
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.shape == y.shape, key
            np.testing.assert_array_equal(x, y, err_msg=key)
    assert ours.metrics.box.image_metrics == theirs.metrics.box.image_metrics
    if theirs.metrics.stats["tp"] and not theirs.args.plots:  # (plots would draw the curves)
        assert ours.get_stats() == theirs.get_stats()
    np.testing.assert_array_equal(ours.confusion_matrix.matrix, theirs.confusion_matrix.matrix)
    if theirs.args.plots:  # a batch with targets or detections counted something
        assert theirs.confusion_matrix.matrix.sum() > 0


def run_both(batches, **args):
    """Ours and Ultralytics' on the same batches: the same statistics; with ``plots`` (each case runs with and without),
    the same confusion matrix."""
    for plots in (False, True):
        ours, theirs = validator(**{"plots": plots, **args}), validator(**{"plots": plots, **args})
        for preds, batch in batches:
            assert update_metrics(ours, clone(preds), batch)
            theirs.update_metrics(clone(preds), batch)
        assert_same(ours, theirs)


@pytest.mark.parametrize("seed", range(6))
def test_random_batches_match_ultralytics(seed):
    rng = np.random.default_rng(seed)
    run_both([make_batch(rng, int(rng.integers(1, 9))) for _ in range(3)])


@pytest.mark.parametrize("seed", range(6))
def test_ties_in_iou_and_score_and_repeated_boxes(seed):
    rng = np.random.default_rng(100 + seed)
    run_both([make_batch(rng, 6, grid=True, max_targets=8, max_preds=20) for _ in range(3)])


def test_empty_images_no_predictions_no_targets():
    rng = np.random.default_rng(7)
    run_both([make_batch(rng, 4, max_targets=0), make_batch(rng, 4, max_preds=0),
              make_batch(rng, 3, max_targets=0, max_preds=0), make_batch(rng, 5)])


def test_single_cls_and_half_predictions():
    rng = np.random.default_rng(8)
    run_both([make_batch(rng, 5, dtype=torch.float16) for _ in range(2)], single_cls=True)
    run_both([make_batch(rng, 5, dtype=torch.float16, grid=True) for _ in range(2)])


def test_degenerate_boxes_give_the_same_nan_and_negative_ious():
    rng = np.random.default_rng(9)
    preds, batch = make_batch(rng, 4, max_targets=5, max_preds=10)
    for p in preds:  # some boxes inside out (negative area), some of zero area: IoU negative, inf or NaN there
        if len(p["bboxes"]):
            p["bboxes"][0] = p["bboxes"][0][[2, 3, 0, 1]]
            p["bboxes"][-1, 2:] = p["bboxes"][-1, :2]
    run_both([(preds, batch)])


def test_max_det_many_detections_few_targets():
    rng = np.random.default_rng(10)
    run_both([make_batch(rng, 3, max_targets=3, max_preds=300, grid=True)])


@pytest.mark.parametrize("seed", range(4))
def test_the_confusion_matrix_counts_only_detections_above_its_confidence(seed):
    """The matrix counts detections above ``conf`` (the statistics all of them): a threshold that drops some of each
    image's, ties in confidence and IoU among those left."""
    rng = np.random.default_rng(200 + seed)
    run_both([make_batch(rng, 5, grid=seed % 2 == 1, max_targets=8, max_preds=20) for _ in range(2)], conf=0.3)


def test_the_confusion_matrix_at_its_iou_threshold_and_among_tied_detections():
    """A claim needs an IoU above the threshold: the second detection of a box, its target claimed, does not claim
    another target it overlaps at the threshold exactly (0.45 in float32). Among detections of one confidence the
    first in order claims the target (a stable sort: numpy's default sort reorders these)."""
    def one(boxes, conf, cls, targets, target_cls, h=64, w=64):
        t = torch.tensor(targets, dtype=torch.float32)
        xywh = torch.cat([(t[:, :2] + t[:, 2:]) / 2, t[:, 2:] - t[:, :2]], 1) / torch.tensor([w, h, w, h])
        preds = [{"bboxes": torch.tensor(boxes, dtype=torch.float32), "conf": torch.tensor(conf),
                  "cls": torch.tensor(cls, dtype=torch.float32), "extra": torch.zeros(len(boxes), 0)}]
        batch = {"img": torch.zeros(1, 3, h, w), "cls": torch.tensor(target_cls, dtype=torch.float32)[:, None],
                 "bboxes": xywh, "batch_idx": torch.zeros(len(targets)), "ori_shape": [(h, w)],
                 "ratio_pad": [((1.0, 1.0), (0, 0))], "im_file": ["d/0.jpg"]}
        return preds, batch

    a, b = [0, 0, 10, 4.5], [0, 0, 10, 10]  # IoU 45 / 100 = 0.45 exactly
    at = one([a, a], [0.9, 0.8], [0, 2], [a, b], [0, 1])
    keys = "ccc-bcbc-cc-c-bc--ccccb-"  # b: confidence 0.5, c: 0.25, -: far from the target (no candidate)
    tied = one([[8, 8, 40, 40] if k != "-" else [50, 50, 60, 60] for k in keys],
               [{"b": 0.5, "c": 0.25, "-": 0.5}[k] for k in keys], [i % 3 for i in range(len(keys))],
               [[8, 8, 40, 40]], [1])
    for preds, batch in (at, tied):
        run_both([(preds, batch)], plots=True)
    for (preds, batch), cell in ((at, (NC, 1)), (tied, (1, 1))):
        ours = validator(plots=True)
        update_metrics(ours, clone(preds), batch)
        assert ours.confusion_matrix.matrix[cell] == 1, ours.confusion_matrix.matrix
        # at: target b missed (background row); tied: the detection at 4, of class 1, claimed the class-1 target


def test_refuses_what_it_does_not_batch():
    rng = np.random.default_rng(11)
    preds, batch = make_batch(rng, 2)
    for args in (dict(save_json=True), dict(save_txt=True), dict(plots=True, visualize=True)):
        v = validator()
        v.args.update(args) if hasattr(v.args, "update") else [setattr(v.args, k, x) for k, x in args.items()]
        if args.get("visualize"):  # the matrix keeps each image's matches to draw them
            v.confusion_matrix.matches = {}
        assert not update_metrics(v, clone(preds), batch)
        assert v.seen == 0 and v.confusion_matrix.matrix.sum() == 0


def test_match_batch_equals_match_predictions_per_image():
    rng = np.random.default_rng(12)
    v = validator()
    thresholds = v.iouv.numpy()
    iou = rng.choice([0.0, 0.5, 0.55, 0.7, 0.95, 1.0], (7, 5, 9)).astype(np.float32)  # ties everywhere
    got = match_batch(iou, thresholds)
    for b in range(7):
        want = v.match_predictions(torch.zeros(9), torch.zeros(5), torch.from_numpy(iou[b])).numpy()
        np.testing.assert_array_equal(got[b], want)


def test_padded_iou_is_box_iou_bit_for_bit():
    from ultralytics.utils.metrics import box_iou

    rng = np.random.default_rng(13)
    a = torch.from_numpy(rng.uniform(0, 100, (3, 4, 4)).astype(np.float32))
    b = torch.from_numpy(rng.uniform(0, 100, (3, 6, 4)).astype(np.float32))
    a[..., 2:] += a[..., :2]
    b[..., 2:] += b[..., :2]
    got = padded_iou(a, b)
    for i in range(3):
        assert torch.equal(got[i], box_iou(a[i], b[i]))


def test_the_trainer_batches_a_detection_validators_statistics_and_the_metrics_are_stocks(synth_root, monkeypatch,
                                                                                          tmp_path):
    """With ``batched_val_metrics`` (the default) the trainer's detection validator is the batched one, and a
    validation through it serves every batch itself and hands Ultralytics' metrics the same per-image statistics as
    Ultralytics' own validator (the same images and model); off, the trainer keeps Ultralytics' validator. A
    validator of another class (pose, OBB, segment match otherwise) is never swapped."""
    from ultralytics import YOLO
    from ultralytics.utils.metrics import DetMetrics

    from yolofeed import FastDetectionTrainer
    from yolofeed.train import val_metrics
    from yolofeed.train.val_metrics import BatchedDetectionValidator, install
    from yolofeed.ultralytics_seam import DetectionValidator

    seen, served = [], []
    clear = DetMetrics.clear_stats
    monkeypatch.setattr(DetMetrics, "clear_stats", lambda self: (
        seen.append({k: [np.array(a) for a in v] for k, v in self.stats.items()}), clear(self))[1])
    batched = val_metrics.update_metrics
    monkeypatch.setattr(val_metrics, "update_metrics", lambda *a: served.append(batched(*a)) or served[-1])
    # an untrained model scores every box below Ultralytics' conf=0.001: a lower threshold gives each image its 300
    kw = dict(data=str(synth_root / "data.yaml"), imgsz=96, batch=4, device="cpu", plots=False, verbose=False,
              conf=1e-9)
    torch.manual_seed(0)
    model = YOLO("yolo11n.yaml")
    stock = model.val(**kw)
    assert not served
    ours = model.val(validator=BatchedDetectionValidator, **kw)
    assert served and all(served)
    assert stock.results_dict == ours.results_dict
    a, b = [x for x in seen if x.get("conf")]  # Ultralytics also clears before a validation
    assert a.keys() == b.keys() and sum(len(c) for c in a["conf"]) > 1000
    for key in a:
        assert len(a[key]) == len(b[key]) and all(np.array_equal(x, y) and x.dtype == y.dtype
                                                  for x, y in zip(a[key], b[key])), key
    # with plots (the last epoch's validation, the final one): the batched path counts the confusion matrix too
    served.clear()
    plots = {**kw, "plots": True, "conf": 0.01, "project": str(tmp_path)}
    stock = model.val(name="stock", **plots)
    assert not served
    ours = model.val(validator=BatchedDetectionValidator, name="ours", **plots)
    assert served and all(served)
    assert stock.results_dict == ours.results_dict and stock.confusion_matrix.matrix.sum() > 0
    np.testing.assert_array_equal(ours.confusion_matrix.matrix, stock.confusion_matrix.matrix)

    args = dict(model="yolo11n.yaml", data=str(synth_root / "data.yaml"), imgsz=64, batch=8, device="cpu",
                plots=False, epochs=1)
    for on in (True, False):
        trainer = FastDetectionTrainer.with_options(batched_val_metrics=on)(overrides=args)
        trainer.test_loader = None  # made in _setup_train; the validator only keeps it
        validator = trainer.get_validator()
        assert type(validator) is (BatchedDetectionValidator if on else DetectionValidator)

    class PoseLike(DetectionValidator):  # a validator that matches otherwise keeps its class
        pass

    other = PoseLike.__new__(PoseLike)
    assert not install(other) and type(other) is PoseLike

"""The validation's NMS with each image's candidates found a group of images at a time (train/val_nms.py): Ultralytics'
detections bit for bit, whatever the scores, dtypes, classes, groups and cuts."""

from __future__ import annotations

import pytest
import torch

from yolofeed.train import val_nms
from yolofeed.train.val_nms import batched_nms
from yolofeed.ultralytics_seam import non_max_suppression

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _prediction(b: int, nc: int, anchors: int, extra: int, dtype: torch.dtype, device: str, seed: int,
                low: float = -8.0) -> torch.Tensor:
    """A model's raw validation output (B, 4 + nc + extra, anchors): xywh boxes in pixels, sigmoid scores spread
    from far below to above the thresholds, overlapping boxes (NMS has work), an image with nothing above 0.001, an
    anchor with a NaN score beside ones above the threshold, tied scores."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(b, 2, anchors, generator=g) * 160
    wh = torch.rand(b, 2, anchors, generator=g) * 60 + 2
    scores = torch.sigmoid(torch.empty(b, nc, anchors).uniform_(low, 3.0, generator=g))
    n = anchors // 7 * 7
    scores[:, :, 1:n:7] = scores[:, :, 0:n:7]  # ties between anchors
    if b > 1:
        scores[1] = 1e-5  # nothing above 0.001 in this image
    scores[0, :, 3] = 0.9
    if nc > 1:
        scores[0, 1, 3] = float("nan")  # an anchor Ultralytics drops whole (its amax is NaN)
    parts = [xy, wh, scores]
    if extra:
        parts.append(torch.randn(b, extra, anchors, generator=g))
    return torch.cat(parts, 1).to(dtype).to(device)


def _same(ours: list[torch.Tensor], stock: list[torch.Tensor]) -> None:
    assert len(ours) == len(stock)
    for i, (a, s) in enumerate(zip(ours, stock)):
        assert a.dtype == s.dtype and a.shape == s.shape and a.device == s.device, i
        assert torch.equal(a, s), i


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("nc", "extra", "dtype", "conf", "agnostic", "max_nms"), [
    (80, 0, torch.float16, 0.001, False, 30000),
    (80, 0, torch.float32, 0.001, False, 30000),
    (3, 0, torch.float16, 0.25, False, 30000),
    (80, 0, torch.float16, 0.001, True, 30000),
    (5, 32, torch.float16, 0.001, False, 30000),
    (80, 0, torch.float16, 0.001, False, 40),  # the max_nms cut (argsort), ties included
])
def test_the_batched_nms_gives_ultralytics_detections_bit_for_bit(device, nc, extra, dtype, conf, agnostic, max_nms,
                                                                   monkeypatch):
    """Each image's detections as Ultralytics' ``non_max_suppression`` gives them for the validator's call, whether
    all images are one group or each its own (``ROWS``), with the max_det cut, class-agnostic or not, extra channels,
    float16 or float32 outputs, a NaN score and an empty image."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pred = _prediction(4, nc, 64, extra, dtype, device, seed=nc + extra)
    kwargs = {"nc": 0 if not extra else nc, "multi_label": True, "agnostic": agnostic, "max_det": 50,
              "max_nms": max_nms}
    stock = non_max_suppression(pred.clone(), conf, 0.7, **kwargs)
    assert any(len(x) for x in stock) and any(not len(x) for x in stock)
    _same(batched_nms(pred.clone(), conf, 0.7, **kwargs), stock)
    monkeypatch.setattr(val_nms, "ROWS", 1)  # each image a group of its own
    _same(batched_nms(pred.clone(), conf, 0.7, **kwargs), stock)


def test_a_call_it_does_not_serve_is_ultralytics_own(monkeypatch):
    """Calls other than the validator's (one class, a classes filter, indices asked, rotated boxes, end-to-end
    outputs) go to Ultralytics' function with the same arguments."""
    calls = []
    monkeypatch.setattr(val_nms, "non_max_suppression", lambda *a, **k: calls.append((a, k)) or ["stock"])
    pred = _prediction(2, 3, 50, 0, torch.float32, "cpu", seed=1)
    for kw in ({"multi_label": False}, {"multi_label": True, "classes": [1]}, {"multi_label": True,
               "return_idxs": True}, {"multi_label": True, "rotated": True}, {"multi_label": True, "end2end": True}):
        assert batched_nms(pred, 0.001, 0.7, **kw) == ["stock"]
    assert batched_nms(_prediction(2, 1, 50, 0, torch.float32, "cpu", seed=1), 0.001, 0.7,
                       multi_label=True) == ["stock"]  # nc 1: Ultralytics' best-class branch
    assert len(calls) == 6


def _copy(preds):
    return torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, preds)


def test_the_validators_postprocess_is_ultralytics_with_the_batched_nms(tmp_path):
    """yolofeed's validator's ``postprocess`` (COPIED) gives Ultralytics' own detections for a model's raw output, as
    set up for training's validations (conf 0.001) and with ``single_cls``."""
    from types import SimpleNamespace

    from ultralytics.nn.tasks import DetectionModel

    from yolofeed.train.val_metrics import BatchedDetectionValidator
    from yolofeed.ultralytics_seam import DetectionValidator

    torch.manual_seed(0)
    model = DetectionModel("yolo11n.yaml", nc=80, verbose=False).eval()
    with torch.no_grad():
        for branch in model.model[-1].cv3:  # class scores about 0.5, where an untrained head's are below 0.001
            branch[-1].bias.zero_()
        preds = model(torch.rand(3, 3, 64, 64))
    for single_cls in (False, True):
        validator = SimpleNamespace(args=SimpleNamespace(conf=0.001, iou=0.7, task="detect", single_cls=single_cls,
                                                         agnostic_nms=False, max_det=300), nc=80, end2end=False)
        # each on its own copy: an older release's NMS converts the boxes of what it is given in place
        stock = DetectionValidator.postprocess(validator, _copy(preds))
        ours = BatchedDetectionValidator.postprocess(validator, _copy(preds))
        assert sum(len(x["bboxes"]) for x in stock) > 0
        for a, b in zip(ours, stock):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]) if t.is_floating_point() else t


@pytest.mark.parametrize("seed", range(3))
def test_odd_inputs_give_ultralytics_detections_bit_for_bit(seed, monkeypatch):
    """Seeded odd inputs, each against Ultralytics' NMS bit for bit (NaN included): bfloat16 and float64, infinite and
    NaN scores, NaN and infinite boxes, scores on the threshold, conf 0 and 1, iou 0 and 1, max_det 0, exactly
    max_nms candidates, a tuple input, torchvision's NMS or Ultralytics' own (found by a reviewer's fuzzing: all held;
    a wrong nc with no candidate raised, and no longer does)."""
    import random
    import sys

    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    for case in range(25):
        b, nc, anchors = rng.choice((1, 3)), rng.choice((2, 7)), rng.choice((0, 1, 40))
        dtype = rng.choice((torch.float16, torch.bfloat16, torch.float32, torch.float64))
        xy, wh = torch.rand(b, 2, anchors, generator=g) * 200, torch.rand(b, 2, anchors, generator=g) * 50 + 1
        scores = torch.sigmoid(torch.empty(b, nc, anchors).uniform_(-9, 4, generator=g))
        odd = torch.rand(scores.shape, generator=g)
        scores[odd < 0.03], scores[odd > 0.97] = float("inf"), float("nan")
        xy[torch.rand(xy.shape, generator=g) < 0.03] = float("nan")
        if case % 5 == 0:
            scores.fill_(0.25)  # every score on the threshold below
        pred = torch.cat([xy, wh, scores], 1).to(dtype)
        conf, iou = rng.choice((0.0, 0.25, 1.0)), rng.choice((0.0, 0.7, 1.0))
        kwargs = {"multi_label": True, "agnostic": rng.random() < 0.3, "max_det": rng.choice((0, 1, 300)),
                  "max_nms": rng.choice((1, 10, 30000))}
        if rng.random() < 0.3:
            monkeypatch.delitem(sys.modules, "torchvision", raising=False)  # Ultralytics' TorchNMS
        stock = non_max_suppression((pred.clone(), None) if case % 4 == 0 else pred.clone(), conf, iou, **kwargs)
        ours = batched_nms((pred.clone(), None) if case % 4 == 0 else pred.clone(), conf, iou, **kwargs)
        assert len(ours) == len(stock), case
        for a, s in zip(ours, stock):
            assert a.dtype == s.dtype and a.shape == s.shape and torch.equal(_bits(a), _bits(s)), case
        monkeypatch.undo()
    wrong = torch.cat([torch.rand(2, 4, 50) * 100, torch.full((2, 3, 50), 1e-5)], 1)
    _same(batched_nms(wrong, 0.001, 0.7, multi_label=True, nc=4), non_max_suppression(wrong, 0.001, 0.7,
                                                                                          multi_label=True, nc=4))


def test_the_time_limit_falls_where_ultralytics_does_under_a_stepping_clock(monkeypatch):
    """The clock read once an image after its NMS, as Ultralytics reads it: with a clock that steps a second a read,
    both stop at the same image and say so."""
    import itertools
    import time as time_module

    pred = _prediction(6, 3, 40, 0, torch.float32, "cpu", seed=2, low=2.0)
    results = []
    for fn in (non_max_suppression, batched_nms):
        monkeypatch.setattr(time_module, "time", itertools.count().__next__)
        results.append(fn(pred.clone(), 0.001, 0.7, multi_label=True, max_time_img=0.0))
        monkeypatch.undo()
    assert sum(len(x) > 0 for x in results[1]) < 6
    _same(results[1], results[0])

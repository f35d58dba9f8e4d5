"""The loss's target padding from a count known ahead: the same tensors and losses, without the syncs."""

from __future__ import annotations

import pytest
import torch
from ultralytics.cfg import get_cfg
from ultralytics.nn.tasks import DetectionModel, SegmentationModel
from ultralytics.utils.loss import v8DetectionLoss

from yolofeed.train import targets
from yolofeed.train.targets import KEY, KnownCountLoss, max_per_image

COUNTS = [3, 0, 5, 1, 0, 2]  # boxes per image: two empty images, the largest not first


def _model(yaml: str, cls=DetectionModel) -> torch.nn.Module:
    m = cls(yaml, nc=4, verbose=False)
    m.args = get_cfg()  # the hyperparameters Ultralytics' loss reads (box, cls, dfl, epochs)
    return m


def _batch(counts: list[int], seed: int = 0) -> dict:
    """Ultralytics' collated labels, rows grouped by image in order (as its collate_fn and ours make them)."""
    g = torch.Generator().manual_seed(seed)
    n = sum(counts)
    xy, wh = 0.2 + 0.6 * torch.rand(n, 2, generator=g), 0.05 + 0.2 * torch.rand(n, 2, generator=g)
    return {"batch_idx": torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts)).float(),
            "cls": torch.randint(0, 4, (n, 1), generator=g).float(), "bboxes": torch.cat([xy, wh], 1),
            "img": torch.rand(len(counts), 3, 64, 64, generator=g)}


def _targets(b: dict) -> torch.Tensor:
    return torch.cat((b["batch_idx"].view(-1, 1), b["cls"].view(-1, 1), b["bboxes"]), 1)


def test_padding_with_the_known_count_equals_ultralytics():
    b, scale = _batch(COUNTS), torch.tensor([64.0, 48.0, 64.0, 48.0])
    loss = v8DetectionLoss(_model("yolo11n.yaml"))
    want = loss.preprocess(_targets(b), len(COUNTS), scale.clone())
    assert max_per_image(b["batch_idx"], len(COUNTS)) == max(COUNTS) == want.shape[1]
    loss.__class__ = KnownCountLoss
    loss._known = max(COUNTS)
    assert torch.equal(loss.preprocess(_targets(b), len(COUNTS), scale.clone()), want)
    loss._known = max(COUNTS) + 2  # more padding than needed: the assigner masks zero rows (mask_gt)
    assert torch.equal(loss.preprocess(_targets(b), len(COUNTS), scale.clone())[:, :max(COUNTS)], want)
    with pytest.raises(IndexError):  # too little: an error, never dropped boxes
        loss._known = max(COUNTS) - 1
        loss.preprocess(_targets(b), len(COUNTS), scale.clone())
    loss._known = 7  # an empty batch takes Ultralytics' path whatever the count says
    assert loss.preprocess(torch.zeros(0, 6), 2, scale).shape == (2, 0, 5)
    assert max_per_image(torch.zeros(0), 2) == 0


@pytest.mark.parametrize("yaml", ["yolo11n.yaml", "yolo26n.yaml"])
def test_the_loss_and_its_gradients_are_unchanged(yaml, monkeypatch):
    """Whole criterion, both families (YOLO26's E2E loss holds two detection losses): a batch with
    max_boxes gives bit-identical losses and gradients; one without takes Ultralytics' path."""
    torch.manual_seed(0)
    model = _model(yaml).train()
    b = _batch(COUNTS, seed=1)
    preds = model(b["img"])

    def run(batch):
        model.zero_grad()
        loss, items = model.loss(batch, preds)
        loss.sum().backward(retain_graph=True)
        return loss.detach().clone(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    want = run(b)  # the criterion Ultralytics made, untouched
    measured = []  # calls of Ultralytics' own padding (the one that learns the count on the host)
    own = v8DetectionLoss.preprocess
    monkeypatch.setattr(v8DetectionLoss, "preprocess", lambda self, *a, **k: measured.append(1) or own(self, *a, **k))
    stock = model.criterion
    targets.install(model)
    assert model.criterion is stock  # swapped in place: its state (assigner, E2E schedule) stays
    inner = [stock] if yaml.startswith("yolo11") else [stock.one2many, stock.one2one]
    assert all(type(x) is KnownCountLoss for x in inner)
    for batch, calls in (({**b, KEY: max(COUNTS)}, 0), (b, len(inner))):
        measured.clear()
        got = run(batch)
        assert len(measured) == calls
        assert torch.equal(got[0], want[0])
        assert len(got[1]) == len(want[1]) and all(torch.equal(x, y) for x, y in zip(got[1], want[1]))
    assert all(x._known is None for x in inner)  # nothing stays behind for the next batch


def test_install_creates_the_criterion_and_leaves_other_tasks_alone():
    m = _model("yolo11n.yaml")
    assert getattr(m, "criterion", None) is None
    targets.install(m)
    targets.install(m)  # idempotent
    assert type(m.criterion) is KnownCountLoss
    seg = _model("yolo11n-seg.yaml", SegmentationModel)
    targets.install(seg)
    assert type(seg.criterion).__name__ == "v8SegmentationLoss"  # its own preprocess: not ours to change


@pytest.mark.gpu
def test_cuda_padding_makes_no_host_sync():
    b = {k: v.cuda() for k, v in _batch(COUNTS).items()}
    loss = v8DetectionLoss(_model("yolo11n.yaml").cuda())
    scale = torch.tensor([64.0, 64.0, 64.0, 64.0], device="cuda")
    want = loss.preprocess(_targets(b), len(COUNTS), scale.clone())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError):  # Ultralytics' own padding learns the count on the host
            loss.preprocess(_targets(b), len(COUNTS), scale.clone())
        loss.__class__ = KnownCountLoss
        loss._known = max(COUNTS)
        got = loss.preprocess(_targets(b), len(COUNTS), scale.clone())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(got, want)

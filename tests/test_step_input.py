"""``half_input`` (train/step.py): the step's input image made in the autocast's dtype from the uint8 batch in one
kernel. Its values are those the first convolution's autocast cast makes of Ultralytics' float32 image, so the step
is the same step: equal bit for bit, on the CPU under float16 autocast and on CUDA (marked ``gpu``). Where it cannot
hold (no amp, the CPU, ``multi_scale``, a first layer that is not a convolution of the image alone) the image stays
Ultralytics' float32.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from test_ahead import StaticAugment

from yolofeed.augment import AugmentHyp
from yolofeed.loader import TrainLoader
from yolofeed.train.ahead import AugmentAhead
from yolofeed.train.step import SyncFreeStep
from yolofeed.ultralytics_seam import Conv, DetectionModel, DetectionTrainer, scaled_input

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _reference(img: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Ultralytics' ``img.float() / 255``, then the autocast's cast at the first convolution."""
    return (img.float() / 255).to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_scaled_input_is_ultralytics_division_then_the_autocast_cast(device, dtype):
    every = torch.arange(256, dtype=torch.uint8, device=device).view(1, 1, 16, 16).expand(2, 3, 16, 16)
    noise = torch.randint(0, 256, (4, 3, 40, 24), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    for img in (every, noise.to(device), noise.float().to(device)):  # uint8, and AugmentAhead's float in [0, 255]
        ours = scaled_input(img, dtype)
        assert ours.dtype == dtype and ours.device == img.device and ours.shape == img.shape
        assert torch.equal(ours, _reference(img, dtype))


def _model(device: str = "cpu") -> DetectionModel:
    from ultralytics.cfg import get_cfg

    torch.manual_seed(0)
    model = DetectionModel("yolo11n.yaml", nc=8, verbose=False).to(device).train()
    model.args = get_cfg()
    return model.to(memory_format=torch.channels_last)


def _batch(device: str, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    n = 12
    wh = torch.rand(n, 2, generator=g) * 0.3 + 0.05
    xy = torch.rand(n, 2, generator=g) * (1 - wh) + wh / 2
    return {"img": torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8, generator=g).to(device),
            "batch_idx": torch.arange(2).repeat_interleave(6).float().to(device),
            "cls": torch.randint(0, 8, (n, 1), generator=g).float().to(device),
            "bboxes": torch.cat([xy, wh], 1).to(device)}


def _step(model: DetectionModel, batch: dict, img: torch.Tensor) -> dict:
    """One training step under float16 autocast (GradScaler's scale a constant): its loss items, every gradient and
    batch-norm buffer."""
    with torch.autocast(img.device.type, dtype=torch.float16):
        loss, items = model.loss({**batch, "img": img})
    (loss.sum() * 256.0).backward()
    out = {f"item {k}": v.detach().clone() for k, v in items.items()} if isinstance(items, dict) else \
        {"items": items.detach().clone()}
    out.update({f"grad {k}": p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    out.update({f"buffer {k}": b.clone() for k, b in model.named_buffers()})
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_a_step_on_the_half_input_is_the_same_step_bit_for_bit(device, monkeypatch):
    if device == "cuda":
        monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    stock = _model(device)
    ours = copy.deepcopy(stock)
    batch = _batch(device)
    want = _step(stock, batch, batch["img"].float() / 255)
    got = _step(ours, batch, scaled_input(batch["img"], torch.float16))
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), k


def _trainer(**kw) -> SimpleNamespace:
    """What ``step_input_dtype`` reads of a trainer."""
    t = SimpleNamespace(half_input=True, device=torch.device("cuda"), amp=True, model=kw.pop("model", None),
                        args=SimpleNamespace(multi_scale=0.0, amp=True))
    for k, v in kw.items():
        setattr(t.args if k in ("multi_scale",) else t, k, v)
    if kw.get("amp") == "bf16":
        t.args.amp, t.amp = "bf16", True
    return t


@pytest.fixture(scope="module")
def plain_model():
    return DetectionModel("yolo11n.yaml", nc=8, verbose=False)


def test_the_input_dtype_is_the_autocasts_where_the_first_layer_convolves_the_image(plain_model):
    dtype = SyncFreeStep.step_input_dtype
    assert dtype(_trainer(model=plain_model)) is torch.float16
    assert dtype(_trainer(model=plain_model, amp="bf16")) is torch.bfloat16
    for off in ({"half_input": False}, {"device": torch.device("cpu")}, {"multi_scale": 0.5}, {"amp": False},
                {"amp": None}, {"model": None}):
        assert dtype(_trainer(**{"model": plain_model, **off})) is None, off


def test_a_first_layer_that_is_not_a_convolution_of_the_image_alone_keeps_float32(plain_model):
    model = copy.deepcopy(plain_model)
    first = model.model[0]
    assert isinstance(first, Conv) and first.f == -1
    first.f = [-1, 4]  # fed more than the image (the image kept for later)
    assert SyncFreeStep.step_input_dtype(_trainer(model=model)) is None
    first.f = -1
    model.model[0] = torch.nn.Identity()  # not a convolution: its first op would see the float16 image
    assert SyncFreeStep.step_input_dtype(_trainer(model=model)) is None


class _Trainer(SyncFreeStep, DetectionTrainer):
    """``SyncFreeStep.preprocess_batch`` before Ultralytics' own, without a trainer's set-up."""


def _bare(dtype: torch.dtype | None, monkeypatch) -> _Trainer:
    t = object.__new__(_Trainer)
    t.device, t.args = torch.device("cpu"), SimpleNamespace(multi_scale=0.0)
    monkeypatch.setattr(_Trainer, "step_input_dtype", lambda self: dtype)
    return t


def test_preprocess_scales_the_image_once_and_leaves_the_rest_to_ultralytics(monkeypatch):
    batch = _batch("cpu")
    stock = _bare(None, monkeypatch).preprocess_batch(dict(batch))
    assert stock["img"].dtype == torch.float32 and torch.equal(stock["img"], batch["img"].float() / 255)
    ours = _bare(torch.float16, monkeypatch)
    out = ours.preprocess_batch(dict(batch))
    assert out.keys() == stock.keys()
    assert out["img"].dtype == torch.float16 and torch.equal(out["img"], stock["img"].half())
    for k in ("batch_idx", "cls", "bboxes"):
        assert torch.equal(out[k], stock[k]), k
    scaled = scaled_input(batch["img"], torch.float16)  # already scaled (AugmentAhead's): passed on as it is
    assert ours.preprocess_batch({**batch, "img": scaled})["img"] is scaled


def test_the_train_batch_plot_gets_stocks_float32_image(monkeypatch):
    """``plot_images`` truncates ``img * 255`` to uint8, and float16's ``k / 255`` times 255 falls below k for about
    half the levels: the plot is handed stock's float32 image again, exactly."""
    every = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).expand(2, 3, 16, 16)
    seen = []
    monkeypatch.setattr(DetectionTrainer, "plot_training_samples", lambda self, batch, ni: seen.append(batch["img"]))
    t = _bare(torch.float16, monkeypatch)
    for dtype in (torch.float16, torch.bfloat16):
        t.plot_training_samples({"img": scaled_input(every, dtype)}, 0)
        assert seen[-1].dtype == torch.float32 and torch.equal(seen[-1], every.float() / 255), dtype
    stock = every.float() / 255
    t.plot_training_samples({"img": stock}, 1)
    assert torch.equal(seen[-1], stock) and seen[-1].data_ptr() == stock.data_ptr()  # stock's own, not copied
    assert ((scaled_input(every, torch.float16).float() * 255).to(torch.uint8) != every).any()  # what it mends


def test_augmenting_ahead_makes_the_steps_image_before_the_next_replay(pack):
    """``AugmentAhead``'s ``convert``: the augmenter's image (overwritten by its next call) made into the step's; the
    scaled input equals the plain float copy divided, as Ultralytics divides it, and cast."""
    hyp = AugmentHyp(imgsz=64, mixup=0.5)
    plain = list(AugmentAhead(TrainLoader(pack(64), 5, "cpu", seed=1), StaticAugment(hyp, seed=9)))
    half = list(AugmentAhead(TrainLoader(pack(64), 5, "cpu", seed=1), StaticAugment(hyp, seed=9),
                             convert=lambda img: scaled_input(img, torch.float16)))
    assert len(plain) == len(half) == 5
    for a, b in zip(plain, half):
        assert b["img"].dtype == torch.float16 and torch.equal(b["img"], (a["img"] / 255).half())
        assert torch.equal(a["bboxes"], b["bboxes"])


def test_half_input_is_an_option_recorded_and_checked_and_on_by_default():
    from yolofeed.bench.modes import trainer_class
    from yolofeed.cli import build_config
    from yolofeed.errors import ConfigError
    from yolofeed.train import options
    from yolofeed.train.trainer import FastDetectionTrainer

    assert "half_input" in options.OPTIONS and FastDetectionTrainer.half_input is True
    assert FastDetectionTrainer.with_options(half_input=False).half_input is False
    assert FastDetectionTrainer.with_options(half_input=True).half_input is True
    with pytest.raises(ConfigError, match="half_input='yes'"):
        FastDetectionTrainer.with_options(half_input="yes")
    assert build_config("bench", ["data=x.yaml", "half_input=True"]).half_input is True
    assert trainer_class("ceiling", {"half_input": True}).half_input is True
    assert trainer_class("ceiling_stock", {"half_input": True}).half_input is False  # Ultralytics' own step


@pytest.mark.gpu
def test_a_graph_captured_on_the_half_input_takes_only_half_batches_and_replays_the_eager_steps(monkeypatch):
    from yolofeed.train import graphed

    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    stock = _model("cuda")
    ours = copy.deepcopy(stock)
    for m in graphed.fusable_convs(ours):
        m.__class__ = graphed.FusedConv
    ours.__class__ = graphed._graphed_class(type(ours))
    logs = []
    ours.__dict__["_graph"] = graphed._Graph(ours, {"enabled": True, "dtype": torch.float16}, logs.append)
    assert graphed.capture_ahead(ours, 2, 64, torch.device("cuda"), torch.float16), logs
    g = ours.__dict__["_graph"]
    batch = _batch("cuda", seed=3)
    half = scaled_input(batch["img"], torch.float16)
    assert g.takes(half) and not g.takes(batch["img"].float() / 255)  # a float32 batch runs eager
    eager = copy.deepcopy(stock)
    for m in graphed.fusable_convs(eager):  # the same fused arithmetic, eager
        m.__class__ = graphed.FusedConv
        m.fused = True
    want, got = _step(eager, batch, batch["img"].float() / 255), _step(ours, batch, half)
    for k in want:
        if k.startswith("buffer") and not want[k].is_floating_point():
            assert torch.equal(want[k], got[k]), k
        else:
            d, scale = (want[k].float() - got[k].float()).norm().item(), want[k].float().norm().item()
            assert d <= 1e-3 * max(scale, 1.0 if "running_var" in k else 0.0) + 1e-8, (k, d, scale)

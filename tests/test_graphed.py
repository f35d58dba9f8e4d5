"""The graphed step (train/graphed.py): the swapped Conv computes Ultralytics' Conv, the swapped classes copy and
pickle as Ultralytics' own, and where the graph cannot serve the step stays eager with one line.

On CUDA (marked ``gpu``), step by step from the same state: the graph replays the eager fused step; its gradients and
batch-norm statistics are as close to the float32 step's as stock's fp16 step is (within twice its error); and it
takes Ultralytics' loss.
"""

from __future__ import annotations

import copy
import io
import pickle
from types import SimpleNamespace

import pytest
import torch

from yolofeed import ultralytics_seam as seam
from yolofeed.train import graphed
from yolofeed.ultralytics_seam import Conv, DetectionModel


def _model(device="cpu"):
    torch.manual_seed(0)
    return DetectionModel("yolo11n.yaml", nc=8, verbose=False).to(device).train()


def _swapped(model):
    graphed.swap(model)
    return model


LAYOUT = pytest.mark.skipif(not seam.since(seam.GRAPH_LAYOUT_SINCE), reason="the layout swaps serve from "
                            f"{seam.GRAPH_LAYOUT_SINCE} on")


def _layout_step(model, img, device_type, dtype):
    """The model's training outputs under autocast, and every gradient of a fixed function of them; the model's
    CastConv2ds' weights cast at once first, as the capture casts them."""
    with torch.autocast(device_type, dtype=dtype):
        convs = [m for m in model.modules() if type(m) is graphed.CastConv2d]
        if convs:
            graphed.cast_for_autocast(convs, dtype)
        preds = model(img)
    heads = [preds] if "boxes" in preds else [preds["one2many"], preds["one2one"]]
    total = 0.0
    for n, p in enumerate(v for h in heads for k, v in sorted(h.items()) if k != "feats"):
        w = torch.randn(p.shape, generator=torch.Generator().manual_seed(n)).to(p.device)
        total = total + (p.float() * w).sum()
    total.backward()
    return heads, {k: p.grad for k, p in model.named_parameters() if p.grad is not None}


def test_fused_conv_computes_ultralytics_conv_forward_backward_and_statistics():
    torch.manual_seed(0)
    stock = Conv(8, 16, 3, 1).train()
    ours = copy.deepcopy(stock)
    ours.__class__ = graphed.FusedConv
    ours.fused = True  # as inside a capture: the fused op (its torch reference on the CPU)
    x = torch.randn(4, 8, 12, 10).to(memory_format=torch.channels_last)
    dy = torch.randn(4, 16, 12, 10)
    outs = []
    for m in (stock, ours):
        xi = x.clone().requires_grad_(True)
        y = m(xi)
        y.backward(dy)
        outs.append((y, xi.grad, m.conv.weight.grad, m.bn.weight.grad, m.bn.running_mean, m.bn.running_var,
                     m.bn.num_batches_tracked))
    for a, b in zip(*outs):  # float32 rounding of another summation order, relative to each result's largest value
        assert (a - b).abs().max() <= 1e-5 * a.abs().max().clamp_min(1.0), (a - b).abs().max()


def test_fused_conv_outside_a_capture_is_ultralytics_conv_exactly():
    stock = Conv(8, 16, 3, 1).train()
    ours = copy.deepcopy(stock)
    ours.__class__ = graphed.FusedConv
    x = torch.randn(2, 8, 6, 6).to(memory_format=torch.channels_last)
    assert torch.equal(stock(x), ours(x))
    ours.eval(), stock.eval()
    ours.fused = True  # eval: running statistics, Ultralytics' path whatever the flag
    assert torch.equal(stock(x), ours(x))


def test_swapped_model_copies_and_pickles_as_ultralytics_own():
    model = _model()
    convs = sum(type(m) is Conv for m in model.modules())
    _swapped(model)
    model.__dict__["_graph"] = object()  # a graph is never copied nor pickled
    twin = copy.deepcopy(model)
    assert type(twin) is DetectionModel and "_graph" not in twin.__dict__
    assert not any(isinstance(m, graphed._SWAPPED) for m in twin.modules())
    assert sum(type(m) is Conv for m in twin.modules()) == convs
    data = pickle.dumps(model)
    assert b"yolofeed" not in data  # a checkpoint loads without yolofeed
    buf = io.BytesIO()
    torch.save({"ema": model}, buf)
    assert b"yolofeed" not in buf.getvalue()
    back = pickle.loads(data)
    assert type(back) is DetectionModel
    for (k, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k


@LAYOUT
@pytest.mark.parametrize("cfg, upsamples, head", [("yolo11n.yaml", 2, True), ("yolo26n.yaml", 2, True),
                                                  ("yolov5n.yaml", 0, True), ("yolo11n-seg.yaml", 2, False)])
def test_layout_swaps_keep_every_value_and_gradient(cfg, upsamples, head, monkeypatch):
    """While a capture sets ``fused``: the head's upsamples in the autocast dtype and the Detect head's outputs
    cells-major (the loss's ``.permute(0, 2, 1)`` of them is contiguous), every output and gradient Ultralytics' bit
    for bit; unset, Ultralytics' layout. On the CPU's bfloat16 autocast, channels-last, with upsampling in float32
    under autocast as CUDA's autocast runs it (the CPU's does not). yolov5n's C3 head takes each Concat's output
    twice, so its gradient would be summed in half: its upsamples are kept; a Segment head keeps its layout."""
    upsample = torch.nn.Upsample.forward
    monkeypatch.setattr(torch.nn.Upsample, "forward", lambda self, x: upsample(
        self, x.float() if torch.is_autocast_enabled("cpu") else x))
    torch.manual_seed(0)
    model = seam.DetectionModel if "seg" not in cfg else __import__("ultralytics").nn.tasks.SegmentationModel
    stock = model(cfg, nc=8, verbose=False).train().to(memory_format=torch.channels_last)
    ours = copy.deepcopy(stock)
    graphed.swap_layout(ours)
    swapped = [type(m) for m in ours.modules() if isinstance(m, graphed._SWAPPED)]
    assert swapped == [graphed.HalfUpsample] * upsamples + [graphed.TokenMajorDetect] * head
    img = torch.rand(2, 3, 64, 64).to(memory_format=torch.channels_last)
    for fused in (True, False):
        for m in ours.modules():
            if isinstance(m, graphed._SWAPPED):
                m.fused = fused
        stock.zero_grad(set_to_none=True), ours.zero_grad(set_to_none=True)
        (a, ga), (b, gb) = (_layout_step(m, img, "cpu", torch.bfloat16) for m in (stock, ours))
        for ha, hb in zip(a, b):
            assert ha.keys() == hb.keys()
            for k in ha.keys() - {"feats"}:
                assert torch.equal(ha[k], hb[k]), (k, fused)
            for k in ("boxes", "scores"):
                assert hb[k].permute(0, 2, 1).is_contiguous() is (fused and head), (k, fused)
        assert ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga), fused


def _halves_pair(cfg, device):
    """A model with its FusedConvs, and a copy with ``swap_halves`` too, both fusing (on the CPU, the op's torch
    reference)."""
    torch.manual_seed(0)
    fused = DetectionModel(cfg, nc=8, verbose=False).to(device).train().to(memory_format=torch.channels_last)
    ours = copy.deepcopy(fused)  # before the swaps: a swapped layer copies as Ultralytics'
    for model in (fused, ours):
        for m in graphed.fusable_convs(model):
            seam.swap_class(m, Conv, graphed.FusedConv)
    graphed.swap_halves(ours)
    for model in (fused, ours):
        for m in model.modules():
            if isinstance(m, graphed._SWAPPED):
                m.fused = True
    return fused, ours


def _same_step(a, b, img, device_type, dtype):
    """Both models' outputs, every gradient and every batch-norm buffer after one step equal bit for bit."""
    (ha, ga), (hb, gb) = (_layout_step(m, img, device_type, dtype) for m in (a, b))
    assert all(torch.equal(x[k], y[k]) for x, y in zip(ha, hb) for k in ("boxes", "scores"))
    assert ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga), [
        k for k in ga if not torch.equal(ga[k], gb[k])]
    assert all(torch.equal(x, y) for x, y in zip(a.buffers(), b.buffers()))


@LAYOUT
@pytest.mark.parametrize("cfg, c2f, c3k2", [("yolo11n.yaml", 0, 8), ("yolo26n.yaml", 0, 8), ("yolov8n.yaml", 8, 0)])
def test_halves_keep_every_value_and_gradient(cfg, c2f, c3k2):
    """C2f and C3k2 with cv1's output written as two dense halves: the outputs, every gradient and the batch-norm
    statistics are those of the same fused model whose forward chunks one output, bit for bit; a C2f subclass with
    a forward of its own, or whose cv1 is not a FusedConv, keeps its class; unset, the block is Ultralytics'."""
    fused, ours = _halves_pair(cfg, "cpu")
    blocks = [type(m) for m in ours.modules() if type(m) in (graphed.HalvesC2f, graphed.HalvesC3k2)]
    assert blocks.count(graphed.HalvesC2f) == c2f and blocks.count(graphed.HalvesC3k2) == c3k2
    _same_step(fused, ours, torch.rand(2, 3, 64, 64).to(memory_format=torch.channels_last), "cpu", torch.bfloat16)
    half = next(m for m in ours.modules() if type(m) in (graphed.HalvesC2f, graphed.HalvesC3k2))
    x = torch.rand(1, half.cv1.conv.in_channels, 8, 8).to(memory_format=torch.channels_last)
    assert all(len(y) == 2 and y[1].is_contiguous(memory_format=torch.channels_last)
               for y in [half.cv1.forward_halves(x)])
    stock = copy.deepcopy(half)  # copies as Ultralytics' own block, without ``fused``
    assert type(stock) is type(half)._stock and "fused" not in stock.__dict__
    for m in half.modules():
        m.__dict__.pop("fused", None)  # unset, as after a capture: Ultralytics' forward, layer by layer
    with torch.no_grad():
        assert torch.equal(half(x), stock(x))

    class Own(type(half)._stock):
        def forward(self, x):
            return super().forward(x)

    model = DetectionModel(cfg, nc=8, verbose=False)
    blocks = [m for m in model.modules() if isinstance(m, seam.C2f)]
    blocks[0].__class__ = Own
    blocks[1].cv1 = torch.nn.Conv2d(1, 1, 1)
    graphed.swap(model)
    assert type(blocks[0]) is Own and type(blocks[1]) is type(half)._stock
    assert type(blocks[2]) is type(half)


@LAYOUT
@pytest.mark.parametrize("patched", ["C2f", "C3k2"])
def test_a_c2f_whose_forward_was_patched_keeps_its_class(patched, monkeypatch):
    """A forward patched on Ultralytics' class (C2f's own, or one given to C3k2) is not the one the halves copy:
    no block of the model is swapped."""
    original = seam.C2f.forward
    monkeypatch.setattr(getattr(seam, patched), "forward", lambda self, x: original(self, x))
    model = DetectionModel("yolo11n.yaml", nc=8, verbose=False)
    graphed.swap(model)
    assert not any(type(m) in (graphed.HalvesC2f, graphed.HalvesC3k2) for m in model.modules())


@LAYOUT
@pytest.mark.parametrize("change", ["forward", "cv1", "twice", "head", "not_concat", "bilinear"])
def test_half_upsamples_only_where_the_output_reaches_one_convolution(change):
    """An upsample keeps autocast's float32 where its Concat feeds a layer that may use its input otherwise than in
    one convolution (a C2f whose forward is overridden or whose cv1 is not a Conv), where its output or the Concat's
    is taken twice (a gradient summed in half), where something else than a Concat takes it, and where it is not
    nearest."""
    model = _model()
    layers = model.model
    assert [m.i for m in graphed.half_upsamples(model)] == [11, 14]

    class Custom(type(layers[13])):
        def forward(self, x):
            return super().forward(x)

    class NotConcat(seam.Concat):
        pass

    if change == "forward":
        layers[13].__class__ = Custom  # takes Concat 12, which takes upsample 11
    elif change == "cv1":
        layers[13].cv1 = torch.nn.Conv2d(1, 1, 1)
    elif change == "twice":
        layers[12].f = [-1, -1, 6]  # Concat 12 takes upsample 11 twice
    elif change == "head":
        layers[23].f = [16, 19, 22, 12]  # the head takes Concat 12 too
    elif change == "not_concat":
        layers[12].__class__ = NotConcat
    else:
        layers[11].mode = "bilinear"
    assert [m.i for m in graphed.half_upsamples(model)] == [14]


def test_layer_inputs_route_as_ultralytics_predict_once():
    """``f``: -1 the layer before (the first layer's the image), another negative index counts back, a list takes
    each, an index listed twice is taken twice."""
    layers = torch.nn.Sequential(*(torch.nn.Identity() for _ in range(5)))
    for i, (m, f) in enumerate(zip(layers, [-1, -1, [-1, 0], -3, [1, 1, -2]])):
        m.f, m.i = f, i
    takers = seam.layer_inputs(SimpleNamespace(model=layers))
    assert {i: [t.i for t in ts] for i, ts in takers.items()} == {0: [1, 2, 3], 1: [2, 4, 4], 2: [4], 3: [], 4: []}


def test_the_capture_sees_every_swap_and_the_triton_cat_and_leaves_neither(monkeypatch):
    """What ``make_graphed_callables`` records: every swapped layer's fast path and ``torch.cat`` as the channel
    concatenation's Triton copy; after it (made or failed) each layer is Ultralytics' again, ``torch.cat`` is
    torch's and the batch-norm buffers are as before."""
    from yolofeed.kernels import channel_cat

    model = _swapped(_model())
    seen = []

    def fake(flat, args, **kw):
        layers = [m for m in model.modules() if isinstance(m, graphed._SWAPPED)]
        seen.append((torch.cat is channel_cat._thread_cat, getattr(channel_cat._inside, "depth", 0),
                     {type(m).__name__ for m in layers}, all(m.fused for m in layers)))
        if len(seen) == 2:
            raise RuntimeError("CUDA out of memory")
        return flat

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", fake)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    before = [b.clone() for b in model.buffers()]
    logs = []
    for _ in range(2):
        graphed._Graph(model, {"enabled": True, "dtype": torch.float16}, logs.append)._capture(
            torch.zeros(2, 3, 64, 64))
        assert torch.cat is channel_cat._torch_cat and not getattr(channel_cat._inside, "depth", 0)
        assert not any(m.fused for m in model.modules() if isinstance(m, graphed._SWAPPED))
        assert all(torch.equal(a, b) for a, b in zip(before, model.buffers()))
    assert seen == [(True, 1, {"FusedConv", "HalfUpsample", "TokenMajorDetect", "CastConv2d", "HalvesC3k2"},
                     True)] * 2
    assert "2 upsamples in half precision" in logs[0] and "stays eager" in logs[1]


def test_a_capture_of_the_step_waits_first_where_the_trainer_asks(monkeypatch):
    """``before_capture`` (the trainer's ``_settle_overlapped``: a validation beside the training ends first) runs
    before the graph's warm-up passes and capture; ``install`` and a graph made again after an out-of-memory retry
    (``drop_stale``) hand it the trainer's."""
    from yolofeed.train.trainer import FastTrainer

    model = _swapped(_model())
    order = []
    monkeypatch.setattr(torch.cuda, "make_graphed_callables", lambda flat, args, **kw: order.append("capture") or flat)
    graph = graphed._Graph(model, {"enabled": True, "dtype": torch.float16}, lambda _: None,
                           lambda: order.append("settled"))
    graph._capture(torch.zeros(2, 3, 64, 64))
    assert order == ["settled", "capture"]
    trainer = FastTrainer.__new__(FastTrainer)
    trainer.model, trainer.device = _model(), torch.device("cpu")
    monkeypatch.setattr(graphed, "why_not", lambda t: None)
    monkeypatch.setattr(seam, "step_autocast", lambda t: torch.float16)
    assert graphed.install(trainer)
    made = trainer.model.__dict__["_graph"]
    assert made.before_capture == trainer._settle_overlapped
    made.shape = (8, 3, 64, 64)  # a graph for another batch size: an out-of-memory retry makes a fresh one
    trainer.args, trainer.epochs = SimpleNamespace(nbs=4, time=None), 3
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    graphed.drop_stale(trainer, 4, 10)
    assert trainer.model.__dict__["_graph"] is not made
    assert trainer.model.__dict__["_graph"].before_capture == trainer._settle_overlapped


def test_weights_cast_at_once_are_autocasts_casts_bit_for_bit():
    """Every trained convolution's weight and bias cast in one ``_foreach_copy_`` before the forward: the outputs and
    every gradient are Ultralytics' under autocast bit for bit (the CPU's bfloat16 autocast casts a convolution's
    weight at its use, as CUDA's float16 one does); each cast is taken once (a second call of a convolution in the
    same forward casts as autocast does), and a swapped convolution pickles as torch's."""
    torch.manual_seed(0)
    stock = DetectionModel("yolo11n.yaml", nc=8, verbose=False).train().to(memory_format=torch.channels_last)
    ours = copy.deepcopy(stock)
    graphed.swap_convs(ours)
    convs = [m for m in ours.modules() if type(m) is graphed.CastConv2d]
    frozen = [m for m in ours.modules() if type(m) is torch.nn.Conv2d]
    assert len(convs) > 80 and len(frozen) == 1 and not frozen[0].weight.requires_grad  # the DFL's
    img = torch.rand(2, 3, 64, 64).to(memory_format=torch.channels_last)
    copies = []
    real = torch._foreach_copy_
    torch._foreach_copy_ = lambda out, src: copies.append(len(out)) or real(out, src)
    try:
        a, ga = _layout_step(stock, img, "cpu", torch.bfloat16)
        b, gb = _layout_step(ours, img, "cpu", torch.bfloat16)
    finally:
        torch._foreach_copy_ = real
    n = sum(1 + (m.bias is not None) for m in convs)
    assert copies == [n, n]  # the forward's one cast and the backward's one
    assert not any("_cast" in m.__dict__ for m in convs)
    for ha, hb in zip(a, b):
        assert all(torch.equal(ha[k], hb[k]) for k in ("boxes", "scores"))
    assert ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)

    conv = convs[0]
    x = torch.rand(1, conv.in_channels, 8, 8)
    conv.zero_grad(), stock.model[0].conv.zero_grad()
    graphed.cast_for_autocast([conv], torch.bfloat16)
    assert type(pickle.loads(pickle.dumps(conv))) is torch.nn.Conv2d and "_cast" not in pickle.loads(
        pickle.dumps(conv)).__dict__
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conv(x) + conv(x)  # the cast, then autocast's
        z = stock.model[0].conv(x) + stock.model[0].conv(x)
    (y.float().sum() + 0).backward(), z.float().sum().backward()
    assert torch.equal(y, z) and torch.equal(conv.weight.grad, stock.model[0].conv.weight.grad)


def test_swapped_model_without_a_graph_predicts_as_ultralytics():
    stock = _model()
    ours = _swapped(copy.deepcopy(stock))
    x = torch.rand(2, 3, 64, 64)
    a, b = stock.predict(x), ours.predict(x)
    for p, q in zip(torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)):
        assert torch.equal(p, q)
    graphed.uninstall(ours)
    assert type(ours) is DetectionModel and not any(isinstance(m, graphed._SWAPPED) for m in ours.modules())
    assert {type(m).__name__ for m in ours.modules()} == {type(m).__name__ for m in stock.modules()}


def _trainer(**kw):
    args = kw.pop("args", SimpleNamespace(nbs=64, multi_scale=0.0))
    return SimpleNamespace(device=torch.device(kw.pop("device", "cuda")), world_size=kw.pop("world_size", 1),
                           model=kw.pop("model", None), accumulate=kw.pop("accumulate", 1), batch_size=16,
                           args=args, **kw)


@pytest.mark.parametrize("kw, why", [({"device": "cpu"}, "not on CUDA"), ({"world_size": 2}, "DDP"),
                                     ({"accumulate": 4}, "accumulate over 4 batches"),
                                     ({"args": SimpleNamespace(nbs=64, multi_scale=0.5)}, "multi_scale=0.5")])
def test_where_the_graph_cannot_serve_the_step_stays_eager_with_one_line(kw, why, caplog, monkeypatch):
    monkeypatch.setattr("yolofeed.ultralytics_seam.compiled", lambda t: False)
    model = _model()
    trainer = _trainer(model=model, **kw)
    assert why in graphed.why_not(trainer)
    assert graphed.install(trainer) is False
    assert type(model) is DetectionModel  # untouched


def test_compiled_model_stays_eager(monkeypatch):
    monkeypatch.setattr("yolofeed.ultralytics_seam.compiled", lambda t: True)
    assert "compile=True" in graphed.why_not(_trainer(model=_model()))


def test_graphed_step_is_an_option_recorded_and_checked():
    from yolofeed.errors import ConfigError
    from yolofeed.train import options
    from yolofeed.train.trainer import FastDetectionTrainer

    assert "graphed_step" in options.OPTIONS and FastDetectionTrainer.graphed_step is True
    assert FastDetectionTrainer.with_options(graphed_step=False).graphed_step is False
    with pytest.raises(ConfigError, match="graphed_step='no'"):
        FastDetectionTrainer.with_options(graphed_step="no")


# ---- CUDA ----

def _batch(b, imgsz, device, seed):
    g = torch.Generator().manual_seed(seed)
    n = b * 6
    wh = torch.rand(n, 2, generator=g) * 0.3 + 0.05
    xy = torch.rand(n, 2, generator=g) * (1 - wh) + wh / 2
    return {"img": torch.rand(b, 3, imgsz, imgsz, generator=g).to(device),
            "batch_idx": torch.arange(b).repeat_interleave(6).float().to(device),
            "cls": torch.randint(0, 8, (n, 1), generator=g).float().to(device),
            "bboxes": torch.cat([xy, wh], 1).to(device)}


def _prepared(model, graph: bool = False, fused: bool = False, log=print):
    """The model as a training step meets it: Ultralytics' hyperparameters, channels-last; with ``graph`` the graphed
    step installed, with ``fused`` (and no graph) every FusedConv fusing eagerly."""
    from ultralytics.cfg import get_cfg

    model.args = get_cfg()
    model = model.to(memory_format=torch.channels_last)
    if graph or fused:
        _swapped(model)
    if graph:
        model.__dict__["_graph"] = graphed._Graph(model, {"enabled": True, "dtype": torch.float16}, log)
    if fused:
        for m in model.modules():
            if isinstance(m, graphed._SWAPPED):
                m.fused = True
    return model


def _surrogate(preds) -> torch.Tensor:
    """A fixed random linear function of the model's raw outputs: what the graph computes (the forward and the
    backward), without the assigner, whose top-k flips on a rounding difference (a model at its initial weights scores
    every anchor alike) and would turn rounding into a different gradient."""
    total = 0.0
    for n, p in enumerate(torch.utils._pytree.tree_leaves(preds)):
        if isinstance(p, torch.Tensor) and p.is_floating_point() and p.requires_grad:
            g = torch.Generator().manual_seed(1000 + n)
            w = torch.randn(p.shape[1:], generator=g).to(p.device)  # the same weights for every batch size
            total = total + (p.float() * w).sum() / p.shape[0]
    return total


def _step(model, batch, loss: str = "yolo", amp: bool = True) -> float:
    """One training step's loss and gradients under fp16 autocast (``amp``), as Ultralytics' (GradScaler's scale a
    constant); ``loss`` "yolo" is the model's own loss, "surrogate" the outputs' ``_surrogate`` (unscaled: its
    gradient is dense, and scaled it overflows fp16 in the first layers)."""
    device = batch["img"].device.type
    with torch.autocast(device, dtype=torch.float16, enabled=amp and device == "cuda"):
        total = model.loss(batch)[0].sum() if loss == "yolo" else _surrogate(model(batch["img"]))
    scale = 256.0 if loss == "yolo" else 1.0
    (total * scale).backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(scale)
    return total.detach().float().item()


def _state(model) -> dict:
    """The step's results: each gradient and each floating batch-norm buffer, by name, in float32."""
    out = {f"grad {k}": p.grad.float().clone() for k, p in model.named_parameters() if p.grad is not None}
    out.update({f"buffer {k}": b.float().clone() for k, b in model.named_buffers() if b.is_floating_point()})
    return out


def _lockstep(reference, others: dict, batches, check, loss: str = "yolo") -> None:
    """Each batch from the same state: every model in ``others`` (name: (model, amp)) copies ``reference``'s
    parameters and buffers (in place: a graph's addresses stay), each takes the step, and ``check(n, results)`` gets
    {name: (loss, state)} with the reference's as "reference"; then only ``reference`` moves on (SGD). A training run
    amplifies any rounding, so one step at a time is what can be held to a bound."""
    opt = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=1e-3, momentum=0.9)
    for n, batch in enumerate(batches):
        results = {}
        for name, (model, amp) in others.items():
            with torch.no_grad():
                for p, q in zip(reference.parameters(), model.parameters()):
                    q.copy_(p)
                for a, b in zip(reference.buffers(), model.buffers()):
                    b.copy_(a)
            results[name] = (_step(model, batch, loss, amp), _state(model))
            for q in model.parameters():
                q.grad = None
        results["reference"] = (_step(reference, batch, loss), _state(reference))
        for name, (model, _) in others.items():  # num_batches_tracked: one count a training batch
            assert all(torch.equal(a, b) for a, b in zip(reference.buffers(), model.buffers())
                       if not a.is_floating_point()), (n, name)
        check(n, results)
        opt.step()
        opt.zero_grad(set_to_none=True)


def _close(a: dict, b: dict, tol: float, what: str) -> None:
    """Every entry of ``b`` within ``tol`` of ``a``'s, relative to the entry's norm (a variance starts at 1), or 1e-8
    (a gradient that is all but zero)."""
    assert a.keys() == b.keys(), what
    for k in a:
        d, scale = (a[k] - b[k]).norm().item(), a[k].norm().clamp_min(1.0 if "running_var" in k else 0.0).item()
        assert d <= tol * scale + 1e-8, (what, k, d, scale)


def test_a_whole_model_with_fused_convs_steps_as_ultralytics_on_the_cpu():
    """FusedConv fusing (its torch reference on the CPU) in yolo11n, step by step against the stock model: the
    lockstep harness the CUDA tests use, on arithmetic that differs only in float32 summation order."""
    stock = _model()
    batches = [_batch(2, 64, "cpu", s) for s in range(2)]

    def check(n, r):
        assert abs(r["fused"][0] - r["reference"][0]) <= 1e-4 * abs(r["reference"][0]), n
        _close(r["reference"][1], r["fused"][1], 1e-3, n)

    _lockstep(_prepared(stock), {"fused": (_prepared(copy.deepcopy(stock), fused=True), True)}, batches, check)


def _cuda_case(last: int = 7):
    stock = _model("cuda")
    batches = [_batch(16, 160, "cuda", s) for s in range(4)]
    return stock, batches + ([_batch(last, 160, "cuda", 99)] if last else [])  # a short last batch runs eager


@pytest.mark.gpu
def test_graphed_steps_equal_the_same_fused_steps_eager(monkeypatch):
    """The graph replays what the eager fused step computes: the replay, the batch-norm restore after the capture and
    the gradients handed out by the graph are exact, up to the rounding of kernels cuDNN may pick otherwise inside a
    capture."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    stock, batches = _cuda_case(last=0)
    logs = []
    eager = _prepared(copy.deepcopy(stock), fused=True)
    ours = _prepared(copy.deepcopy(stock), graph=True, log=logs.append)

    def check(n, r):
        assert abs(r["graphed"][0] - r["reference"][0]) <= 1e-5 * abs(r["reference"][0]), n
        _close(r["reference"][1], r["graphed"][1], 1e-3, n)

    _lockstep(eager, {"graphed": (ours, True)}, batches, check, loss="surrogate")
    g = ours.__dict__["_graph"]
    assert g.flat is not None and g.shape == (16, 3, 160, 160), logs  # captured, at the full batch


@LAYOUT
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", ["yolo11n.yaml", "yolo26n.yaml"])
def test_layout_swaps_and_weights_cast_at_once_on_cuda_are_ultralytics_step_bit_for_bit(cfg, monkeypatch):
    """On CUDA, float16 autocast, channels-last: Ultralytics' upsample runs in float32 (autocast's list) and ours in
    half, and every convolution's weight is cast at once; the outputs, Ultralytics' loss and every gradient are
    stock's bit for bit."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    torch.manual_seed(0)
    stock = _prepared(DetectionModel(cfg, nc=8, verbose=False).cuda().train())
    ours = copy.deepcopy(stock)
    graphed.swap_layout(ours)
    graphed.swap_convs(ours)
    for m in ours.modules():
        if isinstance(m, graphed._SWAPPED):
            m.fused = True
    dtypes = {}

    def hook(name):
        def record(module, inputs, output):
            dtypes.setdefault(name, output.dtype)  # returns None: the output stays
        return record

    for name, m in (("stock", stock), ("ours", ours)):
        m.model[11].register_forward_hook(hook(name))
    batch = _batch(16, 160, "cuda", 0)
    (a, ga), (b, gb) = (_layout_step(m, batch["img"].to(memory_format=torch.channels_last), "cuda", torch.float16)
                        for m in (stock, ours))
    assert dtypes == {"stock": torch.float32, "ours": torch.float16}
    for ha, hb in zip(a, b):
        assert all(torch.equal(ha[k], hb[k]) for k in ("boxes", "scores"))
    assert ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga), [k for k in ga
                                                                                     if not torch.equal(ga[k], gb[k])]
    stock.zero_grad(set_to_none=True), ours.zero_grad(set_to_none=True)
    losses = [_step(m, batch) for m in (stock, ours)]
    assert losses[0] == losses[1]
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(stock.parameters(), ours.parameters()) if p.grad is not None)


@LAYOUT
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", ["yolo11n.yaml", "yolo26n.yaml"])
def test_halves_on_cuda_are_the_fused_step_bit_for_bit(cfg, monkeypatch):
    """On CUDA, float16 autocast, channels-last, the Triton op: C2f/C3k2's cv1 written as two dense halves, and their
    gradients read where they are, give the outputs, every gradient and the batch-norm statistics of the same fused
    model that chunks one output, bit for bit."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    fused, ours = _halves_pair(cfg, "cuda")
    img = _batch(16, 160, "cuda", 0)["img"].to(memory_format=torch.channels_last)
    _same_step(fused, ours, img, "cuda", torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("in_plans_thread", [False, True])
def test_a_graph_captured_ahead_leaves_the_model_as_it_was_and_replays_the_eager_steps(monkeypatch, in_plans_thread):
    """``capture_ahead`` on a blank batch, the model in eval mode: the model's mode, parameters, buffers (batch-norm
    statistics and counts) and gradients are as before it, and the steps then replay the eager fused steps; made in
    the early plans' thread (train/plans.py, after its early pass) too, replayed in this one."""
    from yolofeed.train import plans

    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    stock, batches = _cuda_case(last=0)
    eager = _prepared(copy.deepcopy(stock), fused=True)
    ours = _prepared(copy.deepcopy(stock), graph=True).eval()
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    early = plans.Plans(copy.deepcopy(stock).cpu(), 16, 160, torch.device("cuda"), True) if in_plans_thread else None
    try:
        run = early.run if early is not None else (lambda fn, *a: fn(*a))
        assert run(graphed.capture_ahead, ours, 16, 160, torch.device("cuda"))
        assert early is None or early.early.done() and early.early_s is not None
    finally:
        if early is not None:
            early.close()
    assert not ours.training and all(p.grad is None for p in ours.parameters())
    assert all(torch.equal(before[k], v) for k, v in ours.state_dict().items())
    assert ours.__dict__["_graph"].shape == (16, 3, 160, 160)
    assert not graphed.capture_ahead(ours, 16, 160, torch.device("cuda"))  # made already: once
    ours.train()

    def check(n, r):
        assert abs(r["graphed"][0] - r["reference"][0]) <= 1e-5 * abs(r["reference"][0]), n
        _close(r["reference"][1], r["graphed"][1], 1e-3, n)

    _lockstep(eager, {"graphed": (ours, True)}, batches, check, loss="surrogate")


@pytest.mark.gpu
def test_a_capture_that_runs_out_of_memory_on_cuda_leaves_the_step_eager(monkeypatch):
    """A real out-of-memory error inside ``make_graphed_callables`` (the process held to the memory it has): one
    line says the step stays eager, every swapped layer is Ultralytics' path again, the batch-norm statistics are as
    before, the capture is not tried again, and once memory is back the step is the eager fused step's."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    stock, batches = _cuda_case(last=0)
    logs = []
    ours = _prepared(copy.deepcopy(stock), graph=True, log=logs.append)
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    # room for the blank batch (5 MB), not for the warm-up's activations
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + (16 << 20)) / total)
    try:
        assert not graphed.capture_ahead(ours, 16, 160, torch.device("cuda"))
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    graph = ours.__dict__["_graph"]
    assert graph.failed and graph.flat is None and len(logs) == 1, logs
    assert "stays eager" in logs[0] and "OutOfMemoryError" in logs[0], logs
    assert not any(m.fused for m in ours.modules() if isinstance(m, graphed._SWAPPED))
    assert all(torch.equal(before[k], v) for k, v in ours.state_dict().items())
    assert not graph.takes(batches[0]["img"])  # not tried again

    def check(n, r):  # both eager, Ultralytics' step: apart only by the loss's atomics
        assert abs(r["eager"][0] - r["reference"][0]) <= 1e-6 * abs(r["reference"][0]), n
        _close(r["reference"][1], r["eager"][1], 1e-4, n)

    _lockstep(_prepared(copy.deepcopy(stock)), {"eager": (ours, True)}, batches[:2], check)


@pytest.mark.gpu
def test_graphed_fused_steps_are_as_close_to_float32_as_stock_fp16_steps(monkeypatch):
    """Against Ultralytics' own eager step (cuDNN's batch norm, fp16 between batch norm and SiLU), both measured from
    the same step in float32 (TF32 off), each gradient and batch-norm statistic's error relative to its norm (and
    the loss's, a sum of terms of either sign: in fp16 a few % off in either step): over
    all of them the graphed, fused step's median error is at most 1.5 times stock's (plus 1e-4), and each one at most
    4 times stock's plus 1 % (a wrong term in one layer is an error of order 1). The short last batch runs eager:
    stock's."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    stock, batches = _cuda_case()
    logs = []
    ours = _prepared(copy.deepcopy(stock), graph=True, log=logs.append)

    def check(n, r):
        truth, stock_fp16 = r["truth"][1], r["reference"][1]
        loss_ours, loss_stock = (abs(r[k][0] - r["truth"][0]) for k in ("graphed", "reference"))
        assert loss_ours <= 4 * loss_stock + 1e-2 * abs(r["truth"][0]), (n, loss_ours, loss_stock)
        ours, theirs = [], []
        for k in truth:
            scale = truth[k].norm().clamp_min(1.0 if "running_var" in k else 1e-6).item()
            err_stock = (stock_fp16[k] - truth[k]).norm().item() / scale
            err_ours = (r["graphed"][1][k] - truth[k]).norm().item() / scale
            assert err_ours <= 4 * err_stock + 1e-2, (n, k, err_ours, err_stock, scale)
            ours.append(err_ours), theirs.append(err_stock)
        median_ours, median_stock = torch.tensor(ours).median().item(), torch.tensor(theirs).median().item()
        assert median_ours <= 1.5 * median_stock + 1e-4, (n, median_ours, median_stock)
        if n == len(batches) - 1:  # the short batch: the graph steps aside, the step is stock's
            _close(stock_fp16, r["graphed"][1], 1e-6, n)

    _lockstep(_prepared(stock), {"truth": (_prepared(copy.deepcopy(stock)), False), "graphed": (ours, True)},
              batches, check, loss="surrogate")
    assert ours.__dict__["_graph"].flat is not None, logs


@pytest.mark.gpu
def test_graphed_steps_take_ultralytics_loss(monkeypatch):
    """The whole training step, Ultralytics' loss on the graph's outputs: the losses the graph's forward gives are the
    eager fused step's (the assignment may flip an anchor on a rounding difference: 0.1 %), and every parameter that
    has a gradient eagerly has one from the graph."""
    stock, batches = _cuda_case(last=0)
    ours = _prepared(copy.deepcopy(stock), graph=True)

    def check(n, r):
        assert abs(r["graphed"][0] - r["reference"][0]) <= 1e-3 * abs(r["reference"][0]), n
        assert r["graphed"][1].keys() == r["reference"][1].keys()
        assert all(torch.isfinite(v).all() for v in r["graphed"][1].values())

    _lockstep(_prepared(copy.deepcopy(stock), fused=True), {"graphed": (ours, True)}, batches, check)


def test_the_capture_asks_for_thread_local_mode_where_torch_takes_it(monkeypatch):
    """Other threads (the loader's nvJPEG, the validations') keep working while the step's graph is captured: in the
    default global mode their CUDA calls would void the capture. Older torch has no such argument: nothing passed."""
    import inspect

    takes = "capture_error_mode" in inspect.signature(torch.cuda.make_graphed_callables).parameters
    assert graphed._THREAD_LOCAL == ({"capture_error_mode": "thread_local"} if takes else {})
    seen = {}
    monkeypatch.setattr(torch.cuda, "make_graphed_callables", lambda *a, **k: seen.update(k))
    model = _prepared(_model(), graph=True, log=lambda line: None)
    model.__dict__["_graph"]._capture(torch.zeros(2, 3, 32, 32))
    assert seen.get("capture_error_mode") == ("thread_local" if takes else None)


@pytest.mark.parametrize("batch, nbs, kept", [(16, 16, True), (8, 8, True), (8, 64, False)])
def test_a_batch_halved_after_running_out_of_memory_drops_the_old_graph(batch, nbs, kept, caplog, monkeypatch):
    """Ultralytics halves the batch after an out-of-memory error in the first epoch and builds the loaders again: a
    graph made for the old batch would never replay, its pool holding that batch's activations. It is dropped: a new
    one captures at the new size, or, where the smaller batch now accumulates gradients, the step stays eager and one
    line says why. The same batch leaves the graph as it is."""
    monkeypatch.setattr("yolofeed.ultralytics_seam.compiled", lambda t: False)
    model = _prepared(_model(), graph=True, log=lambda line: None)
    old = model.__dict__["_graph"]
    old.shape = (16, 3, 64, 64)
    trainer = _trainer(model=model, args=SimpleNamespace(nbs=nbs, multi_scale=0.0, time=None), epochs=3)
    closed = []
    short = SimpleNamespace(close=lambda: closed.append(1))  # the old batch's short batches' thread
    model.__dict__["_short"] = short
    with caplog.at_level("INFO"):
        graphed.drop_stale(trainer, batch, 100)
    graph = model.__dict__.get("_graph")
    if batch == 16:  # the same batch: its short batches are the same
        assert model.__dict__.get("_short") is short and closed == []
        model.__dict__.pop("_short")
    else:  # the old batch's short sizes: closed and dropped, whatever comes next
        assert "_short" not in model.__dict__ and closed == [1]
    if batch == 16:
        assert graph is old
    elif kept:
        assert graph is not old and graph.shape is None and isinstance(model, graphed.GraphedPredict)
    else:
        assert graph is None and type(model) is DetectionModel
        assert "stays eager after the batch was reduced (gradients now accumulate over 8 batches)" in caplog.text

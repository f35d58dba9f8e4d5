"""The graphed step (train/graphed.py): the swapped Conv computes Ultralytics' Conv, the swapped classes copy and
pickle as Ultralytics' own, and where the graph cannot serve the step stays eager with one line.

On CUDA (marked ``gpu``): training steps through the graph, batch norm and SiLU fused, follow the eager stock steps
within fp16 rounding (the losses, the parameters and the batch-norm statistics after them).
"""

from __future__ import annotations

import copy
import io
import pickle
from types import SimpleNamespace

import pytest
import torch

from yolofeed.train import graphed
from yolofeed.ultralytics_seam import Conv, DetectionModel


def _model(device="cpu"):
    torch.manual_seed(0)
    return DetectionModel("yolo11n.yaml", nc=8, verbose=False).to(device).train()


def _swapped(model):
    for m in graphed.fusable_convs(model):
        m.__class__ = graphed.FusedConv
    model.__class__ = graphed._graphed_class(type(model))
    return model


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
    assert not any(isinstance(m, graphed.FusedConv) for m in twin.modules())
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


def test_swapped_model_without_a_graph_predicts_as_ultralytics():
    stock = _model()
    ours = _swapped(copy.deepcopy(stock))
    x = torch.rand(2, 3, 64, 64)
    a, b = stock.predict(x), ours.predict(x)
    for p, q in zip(torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)):
        assert torch.equal(p, q)
    graphed.uninstall(ours)
    assert type(ours) is DetectionModel and not any(isinstance(m, graphed.FusedConv) for m in ours.modules())


def _trainer(**kw):
    args = SimpleNamespace(nbs=64)
    return SimpleNamespace(device=torch.device(kw.pop("device", "cuda")), world_size=kw.pop("world_size", 1),
                           model=kw.pop("model", None), accumulate=kw.pop("accumulate", 1), batch_size=16,
                           args=args, **kw)


@pytest.mark.parametrize("kw, why", [({"device": "cpu"}, "not on CUDA"), ({"world_size": 2}, "DDP"),
                                     ({"accumulate": 4}, "accumulate over 4 batches")])
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

    assert "graphed_step" in options.OPTIONS and FastDetectionTrainer.graphed_step is False  # until its GPU test holds
    assert FastDetectionTrainer.with_options(graphed_step=True).graphed_step is True
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


def _train(model, batches, graph: bool, log=print):
    """SGD steps under fp16 autocast, as Ultralytics' step (GradScaler's scale as a constant); the losses."""
    from ultralytics.cfg import get_cfg

    model.args = get_cfg()
    model = model.to(memory_format=torch.channels_last)
    if graph:
        _swapped(model)
        model.__dict__["_graph"] = graphed._Graph(model, {"enabled": True, "dtype": torch.float16}, log)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3, momentum=0.9)
    losses = []
    for batch in batches:
        with torch.autocast("cuda", dtype=torch.float16):
            loss, _ = model.loss(batch)
        (loss.sum() * 256.0).backward()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(256.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach().float().sum().item())
    return losses


@pytest.mark.gpu
def test_graphed_fused_steps_follow_eager_stock_steps():
    torch.backends.cudnn.deterministic = True
    stock = _model("cuda")
    ours = copy.deepcopy(stock)
    batches = [_batch(16, 160, "cuda", s) for s in range(6)] + [_batch(7, 160, "cuda", 99)]  # a short last batch
    a = _train(stock, batches, graph=False)
    logs = []
    b = _train(ours, batches, graph=True, log=logs.append)
    g = ours.__dict__["_graph"]
    assert g.flat is not None and g.shape == (16, 3, 160, 160), logs  # captured, at the full batch
    for x, y in zip(a, b):
        assert abs(x - y) <= 2e-2 * abs(x), (a, b)
    sa, sb = stock.state_dict(), ours.state_dict()
    for k in sa:
        if sa[k].is_floating_point():
            scale = sa[k].abs().max().clamp_min(1e-3)
            assert (sa[k] - sb[k]).abs().max() <= 2e-2 * scale, (k, float((sa[k] - sb[k]).abs().max()), float(scale))
        else:
            assert torch.equal(sa[k], sb[k]), (k, sa[k], sb[k])  # num_batches_tracked: a count a batch, as stock

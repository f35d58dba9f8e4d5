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
            if isinstance(m, graphed.FusedConv):
                m.fused = True
    return model


def _step(model, batch) -> float:
    """One training step's loss and gradients under fp16 autocast, as Ultralytics' (GradScaler's scale a constant)."""
    device = batch["img"].device.type
    with torch.autocast(device, dtype=torch.float16, enabled=device == "cuda"):
        loss, _ = model.loss(batch)
    (loss.sum() * 256.0).backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(256.0)
    return loss.detach().float().sum().item()


def _lockstep(reference, other, batches, loss_tol: float, grad_tol: float, stats_tol: float) -> None:
    """Each batch from the same state: ``other`` copies ``reference``'s parameters and buffers (in place: a graph's
    addresses stay), both take the step, their losses, gradients and batch-norm statistics are compared; then only
    ``reference`` moves on (SGD). A training run amplifies any rounding (the assignment flips), so one step at a time
    is what can be held to a bound."""
    opt = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=1e-3, momentum=0.9)
    for n, batch in enumerate(batches):
        with torch.no_grad():
            for p, q in zip(reference.parameters(), other.parameters()):
                q.copy_(p)
            for a, b in zip(reference.buffers(), other.buffers()):
                b.copy_(a)
        la, lb = _step(reference, batch), _step(other, batch)
        assert abs(la - lb) <= loss_tol * abs(la), (n, la, lb)
        for (k, p), q in zip(reference.named_parameters(), other.parameters()):
            assert (p.grad is None) == (q.grad is None), (n, k)
            if p.grad is not None:
                assert (p.grad - q.grad).norm() <= grad_tol * p.grad.norm() + 1e-8, (n, k)
        for (k, a), b in zip(reference.named_buffers(), other.buffers()):
            if a.is_floating_point():
                assert (a - b).abs().max() <= stats_tol * a.abs().max().clamp_min(1.0), (n, k)  # var starts at 1
            else:
                assert torch.equal(a, b), (n, k, a, b)  # num_batches_tracked: one count a training batch
        opt.step()
        opt.zero_grad(set_to_none=True)
        for q in other.parameters():
            q.grad = None


def test_a_whole_model_with_fused_convs_steps_as_ultralytics_on_the_cpu():
    """FusedConv fusing (its torch reference on the CPU) in yolo11n, step by step against the stock model: the
    lockstep harness the CUDA tests use, on arithmetic that differs only in float32 summation order."""
    stock = _model()
    batches = [_batch(2, 64, "cpu", s) for s in range(2)]
    _lockstep(_prepared(stock), _prepared(copy.deepcopy(stock), fused=True), batches, 1e-4, 1e-3, 1e-5)


def _cuda_case():
    stock = _model("cuda")
    batches = [_batch(16, 160, "cuda", s) for s in range(4)] + [_batch(7, 160, "cuda", 99)]  # a short last batch
    return stock, batches


@pytest.mark.gpu
def test_graphed_steps_equal_the_same_fused_steps_eager(monkeypatch):
    """The graph replays what the eager fused step computes: the replay, the batch-norm restore after the capture and
    the gradients handed out by the graph are exact, up to float32 rounding."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    stock, batches = _cuda_case()
    logs = []
    eager = _prepared(copy.deepcopy(stock), fused=True)
    ours = _prepared(copy.deepcopy(stock), graph=True, log=logs.append)
    _lockstep(eager, ours, batches, 1e-5, 1e-4, 1e-5)
    g = ours.__dict__["_graph"]
    assert g.flat is not None and g.shape == (16, 3, 160, 160), logs  # captured, at the full batch


@pytest.mark.gpu
def test_graphed_fused_steps_follow_eager_stock_steps(monkeypatch):
    """Against Ultralytics' own eager step (cuDNN's batch norm, fp16 between batch norm and SiLU): each step's loss,
    gradients and statistics within fp16 rounding's reach."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    stock, batches = _cuda_case()
    logs = []
    ours = _prepared(copy.deepcopy(stock), graph=True, log=logs.append)
    _lockstep(_prepared(stock), ours, batches, 1e-2, 3e-2, 1e-2)
    assert ours.__dict__["_graph"].flat is not None, logs

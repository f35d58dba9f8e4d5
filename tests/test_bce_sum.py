"""The detection loss's classification term as one pass each way (kernels/bce_sum.py) computes Ultralytics'
``self.bce(pred_scores, target_scores.to(dtype)).sum()``: the gradient element for element, the sum within float32
rounding of another order.

On CPU: where it applies (``takes``), the loss's own expression everywhere else, and the Triton passes under Triton's
interpreter (in a subprocess; approximate exp and division there, so held to a bound). On CUDA (marked ``gpu``):
the gradient bit for bit against ATen's under float16 autocast, the sum within float32 rounding, no host sync, and a
whole detection loss with and without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from yolofeed.kernels import bce_sum as op

_NONE = nn.BCEWithLogitsLoss(reduction="none")


@pytest.fixture(autouse=True)
def enabled(monkeypatch):
    """The pass switched on (``ENABLED``, the default: a test that turns it off does not leak)."""
    monkeypatch.setattr(op, "ENABLED", True)


def _case(shape=(3, 70, 11), dtype=torch.float16, device="cpu", seed=0):
    """Logits spread as a detector's (mostly very negative), targets as the assigner's: zeros, and a few scores in
    (0, 1] with more digits than half keeps."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 4 - 6).to(dtype)
    t = torch.rand(shape, generator=g) * (torch.rand(shape, generator=g) < 0.05)
    return x.to(device), t.to(device)


def _ultralytics(x, t):
    """Ultralytics' expression under the step's autocast, its loss and the gradient it gives x."""
    x = x.detach().clone().requires_grad_(True)
    with torch.autocast(x.device.type, dtype=torch.float16, enabled=x.dtype == torch.float16 and x.is_cuda):
        s = _NONE(x, t.to(x.dtype)).sum()
    (s * 0.37).backward()
    return s.detach(), x.grad


def test_takes_nothing_on_the_cpu():
    x, t = _case()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not op.takes(_NONE, x.bfloat16(), t)
    assert not op.takes(_NONE, x.float(), t)  # Ultralytics' expression


@pytest.mark.gpu
def test_takes_a_plain_bce_and_nothing_else(monkeypatch):
    x, t = _case(device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        assert op.takes(_NONE, x, t)
        assert not op.takes(nn.BCEWithLogitsLoss(), x, t)  # mean
        assert not op.takes(nn.BCEWithLogitsLoss(reduction="none", pos_weight=torch.ones(11, device="cuda")), x, t)
        assert not op.takes(nn.BCEWithLogitsLoss(reduction="none", weight=torch.ones(11, device="cuda")), x, t)
        assert not op.takes(_NONE, x.transpose(1, 2), t.transpose(1, 2))  # not dense
        assert not op.takes(_NONE, x, t.half())
        assert not op.takes(_NONE, x[:0], t[:0])
        assert not op.takes(_NONE, x.bfloat16(), t)  # the kernels take it; its bits are not tested on the GPU
    assert not op.takes(_NONE, x, t)  # half without autocast: ATen would compute in half
    assert not op.takes(_NONE, x.float(), t)  # float32 (amp=False): Ultralytics' expression
    monkeypatch.setattr(op, "ENABLED", False)
    with torch.autocast("cuda", dtype=torch.float16):
        assert not op.takes(_NONE, x, t)


def test_the_loss_takes_the_pass_where_it_applies_and_never_with_class_weights(monkeypatch):
    """The loss's dispatch, with ``takes`` said yes: the fused sum without class weights, Ultralytics' lines with them
    (a class-weighted term is not what the pass computes) and where the dtype asked is not the logits'."""
    from types import SimpleNamespace

    from yolofeed.train.loss.detect import SyncFreeLoss

    fused = torch.tensor(1.5)
    monkeypatch.setattr(op, "takes", lambda *a: True)
    monkeypatch.setattr(op, "bce_sum", lambda x, t: fused)
    x, t = _case(dtype=torch.float32)
    assert SyncFreeLoss.bce_sum(SimpleNamespace(bce=_NONE, class_weights=None), x, t, x.dtype) is fused
    weights = torch.rand(11)
    ours = SyncFreeLoss.bce_sum(SimpleNamespace(bce=_NONE, class_weights=weights), x, t, x.dtype)
    assert torch.equal(ours, (_NONE(x, t) * weights).sum())
    ours = SyncFreeLoss.bce_sum(SimpleNamespace(bce=_NONE, class_weights=None), x, t, torch.float64)
    assert torch.equal(ours, _NONE(x, t.double()).sum())


def test_the_loss_keeps_ultralytics_expression_where_the_pass_does_not_apply():
    """On the CPU (and with class weights anywhere) the detection loss's term is Ultralytics' lines exactly."""
    from types import SimpleNamespace

    from yolofeed.train.loss.detect import SyncFreeLoss

    x, t = _case(dtype=torch.float32)
    for weights in (None, torch.rand(11)):
        loss = SimpleNamespace(bce=_NONE, class_weights=weights)
        ours = SyncFreeLoss.bce_sum(loss, x, t, x.dtype)
        expected = _NONE(x, t.to(x.dtype)) * (1 if weights is None else weights)
        assert torch.equal(ours, expected.sum())


@pytest.mark.slow
def test_triton_passes_equal_the_formula_in_the_interpreter():
    """The forward's partial sums and the backward's gradient, run by Triton's interpreter (numpy's exp and division:
    a bound, not bits: each gradient within a unit of its dtype's last place), against ATen's on the same inputs;
    logits in half and float32, sizes off the tiles, the targets rounded to the logits' dtype first."""
    pytest.importorskip("triton")
    code = textwrap.dedent(f"""
        import json, sys; sys.path.insert(0, {os.path.dirname(__file__)!r})
        import torch
        import test_bce_sum as t
        from yolofeed.kernels import bce_sum as op
        out = []
        for shape, dtype in [((2, 700, 13), torch.float16), ((1, 8400, 3), torch.float32), ((5,), torch.float16)]:
            x, tg = t._case(shape, dtype)
            xr = x.detach().clone().requires_grad_(True)
            s = op._BCESum.apply(xr, tg)
            (s * 0.37).backward()
            xf = x.float().requires_grad_(True)
            ref = t._NONE(xf, tg.to(dtype).float()).sum()
            (ref * 0.37).backward()
            # in units of the spacing of the dtype's values at the gradient, or at 0.37 (sigmoid(x) - t cancels)
            near = torch.maximum(xf.grad.to(dtype).abs(), torch.tensor(0.37, dtype=dtype))
            ulp = (torch.nextafter(near, torch.tensor(float("inf"), dtype=dtype)) - near).float()
            ulps = float(((xr.grad - xf.grad.to(dtype)).float().abs() / ulp).max())
            out.append([abs(float(s - ref)) / float(ref), ulps, xr.grad.dtype == dtype, dtype == torch.float16])
        print(json.dumps(out))
    """)
    env = os.environ | {"TRITON_INTERPRET": "1", "YOLO_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for rel, ulps, same_dtype, half in json.loads(r.stdout.strip().splitlines()[-1]):
        # the interpreter's float32 exp and division against ATen's: a few float32 units in the last place, which
        # the rounding to half hides
        assert rel < 5e-7 and ulps <= (1 if half else 4) and same_dtype, (rel, ulps, half)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(128, 8400, 80), (16, 2100, 8), (3, 70, 11)])
def test_gradient_is_atens_bit_for_bit_and_the_sum_within_rounding_on_cuda(shape):
    """Under float16 autocast as the step runs it: the half gradient equals Ultralytics' expression's bit for bit (its
    float32 sigmoid, the targets rounded to half, one rounding to half); the sum within float32 rounding."""
    x, t = _case(shape, torch.float16, "cuda")
    s_ref, g_ref = _ultralytics(x, t)
    xr = x.detach().clone().requires_grad_(True)
    with torch.autocast("cuda", dtype=torch.float16):
        assert op.takes(_NONE, xr, t)
        s = op.bce_sum(xr, t)
    (s * 0.37).backward()
    assert s.dtype == torch.float32 and xr.grad.dtype == torch.float16
    assert torch.equal(xr.grad, g_ref)
    assert abs(float(s.detach() - s_ref)) <= 1e-6 * float(s_ref)


@pytest.mark.gpu
def test_makes_no_host_sync():
    from helpers import no_host_sync

    x, t = _case((16, 2100, 8), torch.float16, "cuda")
    xr = x.detach().clone().requires_grad_(True)
    with torch.autocast("cuda", dtype=torch.float16):
        op.bce_sum(xr, t).backward()  # Triton compiles on first use
    with no_host_sync(), torch.autocast("cuda", dtype=torch.float16):
        op.bce_sum(xr, t).backward()


@pytest.mark.gpu
def test_a_detection_loss_gives_the_same_gradients_with_it():
    """yolo11n's loss on CUDA under float16 autocast, with the fused term and with Ultralytics' expression: every
    gradient of the predictions bit for bit, the classification loss within float32 rounding, the others equal."""
    from ultralytics.cfg import get_cfg

    from yolofeed.train.loss import MAX_BOXES, install
    from yolofeed.ultralytics_seam import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolo11n.yaml", nc=8, verbose=False).cuda().train()
    model.args = get_cfg()
    install(model)
    g = torch.Generator().manual_seed(1)
    b, n = 8, 8 * 5
    wh = torch.rand(n, 2, generator=g) * 0.3 + 0.05
    batch = {"img": torch.rand(b, 3, 160, 160, generator=g).cuda(),
             "batch_idx": torch.arange(b).repeat_interleave(5).float().cuda(),
             "cls": torch.randint(0, 8, (n, 1), generator=g).float().cuda(),
             "bboxes": torch.cat([torch.rand(n, 2, generator=g) * (1 - wh) + wh / 2, wh], 1).cuda(),
             MAX_BOXES: 5}  # the sync-free loss's path, where the term is
    with torch.autocast("cuda", dtype=torch.float16):
        preds = model(batch["img"])
    calls = []
    real = op.bce_sum

    def op_sum(x, t):
        calls.append(1)
        return real(x, t)

    results = []
    for fused in (True, False):
        leaves = {k: v.detach().clone().requires_grad_(True) for k, v in preds.items() if k != "feats"}
        with torch.autocast("cuda", dtype=torch.float16):
            original = op.takes
            op.takes, op.bce_sum = (original if fused else (lambda *a: False)), op_sum
            try:
                loss, items = model.loss(batch, {**leaves, "feats": [f.detach() for f in preds["feats"]]})
            finally:
                op.takes, op.bce_sum = original, real
        loss.sum().backward()
        results.append((items, {k: v.grad for k, v in leaves.items()}))
    (a, ga), (b_, gb) = results
    assert calls == [1]  # the fused pass ran on the first side only
    assert all(torch.equal(ga[k], gb[k]) for k in ga)
    a, b_ = (list(v.values()) if isinstance(v, dict) else v for v in (a, b_))  # box, cls, dfl (a dict from 8.4.18x)
    assert torch.equal(a[0], b_[0]) and torch.equal(a[2], b_[2])
    assert abs(float(a[1] - b_[1])) <= 1e-6 * float(b_[1])

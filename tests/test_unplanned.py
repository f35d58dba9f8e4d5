"""The short batch's convolutions as GEMMs (train/unplanned.py): torch's convolution in another order of the same sums,
forward and backward, in the input's layout; what it does not take left to torch; routed by ``InPlace``."""

from __future__ import annotations

import contextlib
import copy
from concurrent.futures import Future

import pytest
import torch
import torch.nn.functional as F

from yolofeed.train import short_batches, unplanned
from yolofeed.train.unplanned import Unplanned

CASES = [  # channels in, out, kernel, stride, padding, dilation, groups, channels-last
    (8, 16, 1, 1, 0, 1, 1, True), (8, 16, 1, 1, 0, 1, 1, False), (8, 16, 1, 2, 0, 1, 1, True),
    (8, 16, 3, 2, 1, 1, 1, True), (8, 16, 3, 1, 1, 1, 1, False), (3, 16, 3, 2, 1, 1, 1, True),
    (8, 8, 3, 1, 1, 1, 8, True), (8, 8, 3, 2, 1, 1, 8, False), (8, 16, 3, 1, 2, 2, 1, True),
    (8, 16, 5, 1, 2, 1, 1, True), (6, 12, (1, 3), (1, 2), (0, 1), 1, 1, True),
]


def _args(c, k, ks, groups, last, dtype=torch.float64, n=5, h=13, w=11):
    ks = (ks, ks) if isinstance(ks, int) else ks
    x = torch.randn(n, c, h, w, dtype=dtype)
    weight = torch.randn(k, c // groups, *ks, dtype=dtype)
    if last:
        x, weight = (t.contiguous(memory_format=torch.channels_last) for t in (x, weight))
    return x.requires_grad_(), weight.requires_grad_(), torch.randn(k, dtype=dtype, requires_grad=True)


@pytest.mark.parametrize("slice_bytes", [1 << 30, 700])
@pytest.mark.parametrize("c, k, ks, stride, padding, dilation, groups, last", CASES)
def test_a_convolution_is_torchs_in_value_gradient_and_layout(monkeypatch, slice_bytes, c, k, ks, stride, padding,
                                                              dilation, groups, last):
    """In float64 every output and gradient (input, weight, bias) is torch's to its rounding, whether the batch's
    im2col is made at once or a slice of the batch (700 bytes: one image or less) at a time; the output is laid out
    as the input."""
    monkeypatch.setattr(unplanned, "SLICE_BYTES", slice_bytes)
    x, weight, bias = _args(c, k, ks, groups, last)
    want = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    with Unplanned():
        got = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.is_contiguous(memory_format=torch.channels_last if last else torch.contiguous_format)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(want)
    for g, w in zip(torch.autograd.grad(got, (x, weight, bias), grad),
                    torch.autograd.grad(want, (x, weight, bias), grad)):
        torch.testing.assert_close(g, w, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("form", ["a channel slice", "NCHW input, channels-last weight",
                                  "channels-last input, NCHW weight"])
@pytest.mark.parametrize("ks", [1, 3])
def test_the_output_is_laid_out_as_torchs_for_slices_and_mixed_layouts(form, ks):
    """A channel slice of a channels-last map (C2f's chunk), or input and weight in different layouts: the output in
    the layout torch gives, its values and gradients torch's."""
    base, weight, bias = _args(16, 8, ks, 1, True)
    x = base.detach()[:, 8:].requires_grad_() if form == "a channel slice" else base
    if form == "a channel slice":
        weight = torch.randn(8, 8, ks, ks, dtype=torch.float64).contiguous(
            memory_format=torch.channels_last).requires_grad_()
    elif form.startswith("NCHW input"):
        x = base.detach().contiguous().requires_grad_()
    else:
        weight = weight.detach().contiguous().requires_grad_()
    want = F.conv2d(x, weight, bias, 1, ks // 2)
    with Unplanned():
        got = F.conv2d(x, weight, bias, 1, ks // 2)
    fmt = torch.channels_last if want.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
    assert got.is_contiguous(memory_format=fmt), form
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(want)
    for g, w in zip(torch.autograd.grad(got, (x, weight, bias), grad),
                    torch.autograd.grad(want, (x, weight, bias), grad)):
        torch.testing.assert_close(g, w, rtol=1e-11, atol=1e-11)


def test_arguments_in_every_form_torch_takes():
    """One-element lists for stride and padding, the input by its keyword: torch's results; a float64 input under
    autocast stays float64, as autocast leaves it."""
    x, weight, bias = _args(8, 16, 3, 1, True)
    want = F.conv2d(x, weight, bias, [2], [1])
    with Unplanned():
        torch.testing.assert_close(F.conv2d(x, weight, bias, [2], [1]), want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(F.conv2d(input=x, weight=weight, bias=bias, stride=[2], padding=[1]), want,
                                   rtol=1e-12, atol=1e-12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = F.conv2d(x, weight, bias, 1, 1)
        with Unplanned():
            got = F.conv2d(x, weight, bias, 1, 1)
    assert got.dtype == want.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_what_it_does_not_take_is_torchs_own():
    """A padding given as a string, groups that are not depthwise, an unbatched input: torch's call, the same bits."""
    x, weight, _ = _args(8, 16, 3, 2, True)
    plain = torch.randn(8, 9, 9, dtype=torch.float64)
    w3 = torch.randn(4, 8, 3, 3, dtype=torch.float64)
    for args, kwargs in (((x, weight), {"groups": 2}), ((plain, w3), {"padding": 1}),
                         ((x.detach(), torch.randn(16, 8, 3, 3, dtype=torch.float64)), {"padding": "same"})):
        with Unplanned():
            got = F.conv2d(*args, **kwargs)
        assert torch.equal(got, F.conv2d(*args, **kwargs))
    assert unplanned.conv2d(x, weight, groups=2) is None and unplanned.conv2d(plain, w3) is None


@pytest.mark.parametrize("case", ["stride 0", "stride (0, 1)", "dilation 0", "padding -1", "bias float32",
                                  "bias (k, 1)", "weight float32"])
def test_what_torch_refuses_it_refuses_with_torchs_own_error(case):
    """Arguments no model's layer passes (found by an adversarial tester): a stride of 0 was a ZeroDivisionError, a
    bias of another dtype or shape a result torch would not give. Each is torch's call, and so torch's error."""
    x, weight, bias = _args(8, 16, 3, 1, True)
    kwargs = {"stride 0": {"stride": 0}, "stride (0, 1)": {"stride": (0, 1)}, "dilation 0": {"dilation": 0},
              "padding -1": {"padding": -1}, "bias float32": {"bias": bias.detach().float()},
              "bias (k, 1)": {"bias": bias.detach().view(-1, 1)}}.get(case, {})
    w = weight.detach().float() if case == "weight float32" else weight
    with pytest.raises(Exception) as torchs:
        F.conv2d(x, w, **kwargs)
    with Unplanned(), pytest.raises(type(torchs.value)) as ours:
        F.conv2d(x, w, **kwargs)
    assert str(ours.value) == str(torchs.value)


def test_under_autocast_it_casts_as_autocast_casts_a_convolution():
    """Autocast's dtype for the output (bfloat16 on the CPU), the values those casts give, a float32 weight's
    gradient in float32."""
    x, weight, bias = _args(8, 16, 3, 1, True, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = F.conv2d(x, weight, bias, 1, 1)
        with Unplanned():
            got = F.conv2d(x, weight, bias, 1, 1)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    (g,) = torch.autograd.grad(got.float().sum(), weight)
    assert g.dtype == torch.float32 and g.shape == weight.shape


def _model():
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    return DetectionModel("yolo11n.yaml", nc=4, verbose=False).train()


def _loss(preds: dict) -> torch.Tensor:
    return sum((t.float() ** 2).mean() for t in (preds["boxes"], preds["scores"]))


def test_a_training_pass_of_yolo11n_is_torchs_through_every_layer(monkeypatch):
    """yolo11n in training mode, float64, channels-last: every convolution it runs taken, and its outputs, every
    gradient and every batch-norm statistic as with torch's convolutions, to float64's rounding."""
    model = _model().double().to(memory_format=torch.channels_last)
    twin = copy.deepcopy(model)
    x = torch.rand(3, 3, 64, 64, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    taken, conv2d = [], unplanned.conv2d
    monkeypatch.setattr(unplanned, "conv2d", lambda *a, **k: taken.append(conv2d(*a, **k)) or taken[-1])
    with Unplanned():
        got = model.predict(x)
    want = twin.predict(x)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.weight.requires_grad]  # DFL's: not
    assert len(taken) == len(convs) > 80 and all(t is not None for t in taken)  # in a training pass
    _loss(got).backward()
    _loss(want).backward()
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-12, msg=name)
    for (name, a), b in zip(model.named_buffers(), twin.buffers()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


def test_in_place_takes_its_sizes_in_a_training_pass_and_runs_them_unplanned(monkeypatch):
    """``InPlace``: batches of its sizes under grad mode and no mode of the thread's own; the call runs under
    ``Unplanned`` in this thread; nothing to set up."""
    short = short_batches.InPlace([3])
    assert short.set_up.done() and short.set_up.result() is None
    assert short.takes(torch.zeros(3, 3, 8, 8)) and not short.takes(torch.zeros(4, 3, 8, 8))
    with torch.no_grad():
        assert not short.takes(torch.zeros(3, 3, 8, 8))
    with torch.device("cpu"):  # a function mode of this thread's own: stock's path
        assert not short.takes(torch.zeros(3, 3, 8, 8))
    seen = []
    monkeypatch.setattr(unplanned, "conv2d", lambda *a, **k: seen.append(a[0].shape) or None)
    x, weight, _ = _args(8, 16, 3, 1, True)
    assert torch.equal(short(F.conv2d, x, weight, padding=1), F.conv2d(x, weight, padding=1))
    assert seen == [x.shape]
    short.epoch_starts(100)  # no plan to make: none given
    short.close()


class _Planned:
    """A stand-in for the ``ShortBatches`` the plan makes: its set-up done or not, serving or not."""

    def __init__(self):
        self.set_up = Future()
        self.ok, self.calls, self.closed = True, [], False

    def serves(self):
        return self.ok

    def __call__(self, fn, *args, **kwargs):
        self.calls.append(fn)
        return "planned"

    def close(self):
        self.closed = True


def test_in_place_makes_the_plans_once_the_batches_left_would_cost_more_as_gemms(monkeypatch):
    """The first batch runs as GEMMs, its forward timed; at an epoch's start the batches left at ``GEMM_PER_FORWARD``
    forwards each are weighed against ``PLANS_COST_S``: few left, no plans; many, the plans made (once), which serve
    from the call after their set-up is done and while they serve; closed with it."""
    made = []
    short = short_batches.InPlace([3], plan=lambda: made.append(_Planned()) or made[-1])
    short.epoch_starts(10 ** 6)  # nothing timed yet: nothing to weigh
    assert made == []
    monkeypatch.setattr(short_batches, "PLANS_COST_S", 1.0)
    monkeypatch.setattr(short_batches, "GEMM_PER_FORWARD", 2.0)
    x, weight, _ = _args(8, 16, 3, 1, True)
    monkeypatch.setattr(short_batches.time, "perf_counter", iter([0.0, 5.0]).__next__)  # the first: cold, 5 s
    short(F.conv2d, x, weight, padding=1)
    short.epoch_starts(10 ** 6)  # not counted
    assert made == [] and short.forward_s is None
    monkeypatch.setattr(short_batches.time, "perf_counter", iter([10.0, 10.1]).__next__)  # a forward of 0.1 s
    short(F.conv2d, x, weight, padding=1)
    short.epoch_starts(5)  # 5 x 2 x 0.1 = 1.0 s: not more than the plans' 1.0 s
    assert made == [] and short.forward_s == pytest.approx(0.1)
    short.epoch_starts(6)  # 1.2 s
    assert len(made) == 1 and short.planned is made[0]
    monkeypatch.setattr(short_batches.time, "perf_counter", iter([20.0, 20.1]).__next__)
    assert short(F.conv2d, x, weight, padding=1).shape == (5, 16, 13, 11)  # its set-up not done: as GEMMs
    made[0].set_up.set_result(None)
    assert short(F.conv2d, x, weight, padding=1) == "planned"
    made[0].ok = False  # its worker failed: as GEMMs again
    monkeypatch.setattr(short_batches.time, "perf_counter", iter([30.0, 30.1]).__next__)
    assert short(F.conv2d, x, weight, padding=1).shape == (5, 16, 13, 11)
    short.epoch_starts(10 ** 6)
    assert len(made) == 1  # made once
    short.close()
    assert made[0].closed


def test_plans_that_cannot_start_leave_the_gemms_going_with_one_line(monkeypatch, caplog):
    """The planned worker's copy out of memory (or no thread to spare) at an epoch's start: one line, the GEMMs go on,
    no second try."""
    tries = []

    def out_of_memory():
        tries.append(1)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory.")

    short = short_batches.InPlace([3], plan=out_of_memory)
    short.forward_s = 1.0
    with caplog.at_level("WARNING"):
        short.epoch_starts(10 ** 6)
        short.epoch_starts(10 ** 6)
    assert tries == [1] and short.planned is None
    assert "cuDNN set-up not started (OutOfMemoryError: CUDA out of memory.)" in caplog.text
    x, weight, _ = _args(8, 16, 3, 1, True)
    torch.testing.assert_close(short(F.conv2d, x, weight, padding=1), F.conv2d(x, weight, padding=1))


def test_the_trainer_weighs_them_at_each_epochs_start_with_the_epochs_left():
    from types import SimpleNamespace

    from yolofeed.train import trainer as trainer_module

    got = []
    short = short_batches.InPlace([3])
    short.epoch_starts = got.append
    t = SimpleNamespace(model=_model(), epochs=10, epoch=3)
    t.model.__dict__["_short"] = short
    trainer_module.FastDetectionTrainer._short_batches_epoch(t)
    assert got == [7]


@pytest.mark.gpu
def test_cuda_a_short_batch_unplanned_is_as_close_to_float32_as_cudnns(monkeypatch):
    """On CUDA under float16 autocast, channels-last, with Ultralytics' deterministic cuDNN: yolo11n's training pass
    at a short batch with its convolutions as GEMMs, and cuDNN's, both measured against the float32 pass (TF32 off):
    each gradient and batch-norm statistic's error relative to its norm at most 4 times cuDNN's plus 1 %, the
    median at most 1.5 times cuDNN's plus 1e-4; the slices of the batch's im2col (a small bound) change nothing of
    that."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    dev = torch.device("cuda")
    base = _model().to(dev).to(memory_format=torch.channels_last)
    x = torch.rand(5, 3, 160, 160, device=dev).contiguous(memory_format=torch.channels_last)

    def run(fp16: bool, planless: bool) -> dict[str, torch.Tensor]:
        m = copy.deepcopy(base)
        with torch.autocast("cuda", dtype=torch.float16, enabled=fp16), \
                Unplanned() if planless else contextlib.nullcontext():
            out = m.predict(x)
        _loss(out).backward()
        got = {f"grad {k}": p.grad.float() for k, p in m.named_parameters() if p.grad is not None}  # DFL's: None
        got.update({k: b.float() for k, b in m.named_buffers() if b.is_floating_point()})
        return got

    truth, cudnn = run(False, False), run(True, False)
    for slice_bytes in (unplanned.SLICE_BYTES, 1 << 20):
        monkeypatch.setattr(unplanned, "SLICE_BYTES", slice_bytes)
        ours = run(True, True)
        errs = []
        for k in truth:
            scale = truth[k].norm().clamp_min(1.0 if "running_var" in k else 1e-6).item()
            err_cudnn = (cudnn[k] - truth[k]).norm().item() / scale
            err_ours = (ours[k] - truth[k]).norm().item() / scale
            assert err_ours <= 4 * err_cudnn + 1e-2, (k, err_ours, err_cudnn)
            errs.append((err_ours, err_cudnn))
        median_ours, median_cudnn = (torch.tensor(e).median().item() for e in zip(*errs))
        assert median_ours <= 1.5 * median_cudnn + 1e-4, (median_ours, median_cudnn)

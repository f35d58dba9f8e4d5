"""The fused batch norm + SiLU (kernels/bn_silu.py) computes what ``F.silu(F.batch_norm(..., training=True))`` does:
the output, the three gradients and the running statistics, within float32 rounding of another summation order.

On CPU the torch reference is held to PyTorch's ops, and the Triton kernels to PyTorch's ops under Triton's
interpreter (in a subprocess). On CUDA (marked ``gpu``) the Triton kernels are held to cuDNN's batch norm at the shapes
yolo11n trains with, in fp16 channels-last as under AMP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from yolofeed.kernels.bn_silu import bn_silu, bn_silu_halves, fusable, reference

MOMENTUM, EPS = 0.03, 1e-3  # Ultralytics' initialize_weights


def _case(shape, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    n, c, h, w = shape
    x = (torch.randn(shape, generator=g) * 2 + torch.randn(c, 1, 1, generator=g) * 3)  # a mean off zero per channel
    x = x.to(device, dtype).to(memory_format=torch.channels_last)
    return {"x": x, "w": (torch.rand(c, generator=g) + 0.5).to(device), "b": torch.randn(c, generator=g).to(device),
            "rm": torch.randn(c, generator=g).to(device), "rv": (torch.rand(c, generator=g) + 0.5).to(device),
            "dy": torch.randn(shape, generator=g).to(device, dtype).to(memory_format=torch.channels_last)}


def _run(fn, case):
    """Output, dx, dw, db, running mean and var after one training forward and backward of ``fn``."""
    x = case["x"].detach().clone().requires_grad_(True)
    w, b = case["w"].clone().requires_grad_(True), case["b"].clone().requires_grad_(True)
    rm, rv = case["rm"].clone(), case["rv"].clone()
    y = fn(x, w, b, rm, rv)
    y.backward(case["dy"])
    return [t.detach().float() for t in (y, x.grad, w.grad, b.grad, rm, rv)]


def _torch(x, w, b, rm, rv):
    return F.silu(F.batch_norm(x, rm, rv, w, b, True, MOMENTUM, EPS))


def _ours(x, w, b, rm, rv):
    return bn_silu(x, w, b, rm, rv, MOMENTUM, EPS)


def _worst(a, b):
    """The largest difference of each result, relative to that result's largest magnitude."""
    return [float((p - q).abs().max() / q.abs().max().clamp_min(1e-12)) for p, q in zip(a, b)]


def _halves_run(halves, case, split):
    """``_run`` of an op that returns its output as two halves (``bn_silu_halves``' form): the first half's gradient
    handed as a channel slice of a wider tensor (as a channel cat's backward hands it), the second's dense. Returns
    ``_run``'s six results (the halves joined) and whether both halves came dense channels-last."""
    x = case["x"].detach().clone().requires_grad_(True)
    w, b = case["w"].clone().requires_grad_(True), case["b"].clone().requires_grad_(True)
    rm, rv = case["rm"].clone(), case["rv"].clone()
    ya, yb = halves(x, w, b, rm, rv, split)
    dy = case["dy"]
    wide = torch.full_like(dy[:, :1], float("nan")).expand(-1, split + 3, -1, -1).contiguous(
        memory_format=torch.channels_last)  # what is around the slice is never read
    wide[:, 1:split + 1] = dy[:, :split]
    second = dy[:, split:].contiguous(memory_format=torch.channels_last)
    torch.autograd.backward([ya, yb], [wide[:, 1:split + 1], second])
    dense = all(t.is_contiguous(memory_format=torch.channels_last) for t in (ya, yb))
    return [t.detach().float() for t in (torch.cat([ya, yb], 1), x.grad, w.grad, b.grad, rm, rv)], dense


def _halves_exact(halves, whole, case, split) -> bool:
    """Whether the halves' six results equal the whole op's bit for bit, and the halves came dense."""
    ours, dense = _halves_run(halves, case, split)
    return dense and all(torch.equal(a, b) for a, b in zip(ours, _run(whole, case)))


def test_halves_are_the_whole_op_split_on_the_cpu():
    """``bn_silu_halves`` is ``bn_silu`` split at ``split``: the same values, gradients and statistics, each half
    dense; a split that leaves a half empty is refused."""
    case = _case((2, 12, 5, 6))

    def halves(x, w, b, rm, rv, split):
        return bn_silu_halves(x, w, b, rm, rv, MOMENTUM, EPS, split)
    assert all(_halves_exact(halves, _ours, case, split) for split in (6, 1, 11))
    for split in (0, 12):
        with pytest.raises(ValueError, match="split"):
            halves(*(case[k] for k in ("x", "w", "b", "rm", "rv")), split)


@pytest.mark.parametrize("shape", [(2, 16, 9, 7), (3, 80, 5, 5), (1, 130, 4, 3), (1, 8, 1, 2)])
def test_reference_equals_pytorch_batch_norm_and_silu(shape):
    case = _case(shape)
    assert max(_worst(_run(_ours, case), _run(_torch, case))) < 1e-5


def test_reference_moves_running_statistics_as_batch_norm():
    """The running variance takes the unbiased variance; a step with momentum 0 leaves both as they were."""
    case = _case((2, 4, 3, 3))
    ours, theirs = _run(_ours, case), _run(_torch, case)
    torch.testing.assert_close(ours[4], theirs[4])
    torch.testing.assert_close(ours[5], theirs[5])
    rm, rv = case["rm"].clone(), case["rv"].clone()
    bn_silu(case["x"], case["w"], case["b"], rm, rv, 0.0, EPS)
    assert torch.equal(rm, case["rm"]) and torch.equal(rv, case["rv"])


def test_fusable_takes_dense_channels_last_only():
    x = torch.randn(2, 8, 4, 4)
    assert not fusable(x)  # NCHW: the caller takes batch norm as it is
    assert fusable(x.to(memory_format=torch.channels_last))
    assert not fusable(x.to(memory_format=torch.channels_last)[:, :4])  # a channel slice: rows are not dense
    assert not fusable(torch.randn(1, 8, 1, 1).to(memory_format=torch.channels_last))  # one value a channel
    assert not fusable(torch.randn(2, 8, 4).float())


# launch configurations (kernels/bn_silu.py's knobs): the default, then several tiles a statistics iteration with
# programs of several iterations and a tail, and the configuration before the measured one
LAUNCHES = [{}, {"_UNROLL": 2}, {"_UNROLL": 4, "_TILE": 256, "_GROUPS": 2},
            {"_UNROLL": 1, "_TILE": 4096, "_WARPS": 4, "_GROUPS": 512, "_FLAT_TILE": 4096, "_FLAT_WARPS": 4}]


@pytest.mark.slow
def test_triton_kernels_equal_pytorch_in_the_interpreter():
    """Under every launch configuration in ``LAUNCHES``."""
    pytest.importorskip("triton")
    code = textwrap.dedent(f"""
        import json, sys; sys.path.insert(0, {os.path.dirname(__file__)!r})
        import test_bn_silu as t
        from yolofeed.kernels import bn_silu as op
        def triton(x, w, b, rm, rv):
            return op._TritonBNSiLU.apply(x, w, b, rm, rv, t.MOMENTUM, t.EPS)
        def halves(x, w, b, rm, rv, split):
            return op._TritonBNSiLUHalves.apply(x, w, b, rm, rv, t.MOMENTUM, t.EPS, split)
        out, exact = [], []
        for knobs in LAUNCHES:
            for k, v in knobs.items():
                setattr(op, k, v)
            op._plans.clear()
            for shape in [(2, 16, 9, 7), (3, 80, 5, 5), (1, 130, 4, 3), (2, 8, 37, 41)]:
                case = t._case(shape)
                out.append(t._worst(t._run(triton, case), t._run(t._torch, case)))
            exact += [t._halves_exact(halves, triton, t._case(shape), split)
                      for shape, split in [((2, 16, 9, 7), 8), ((1, 130, 4, 3), 67)]]
        print(json.dumps([out, exact]))
    """).replace("LAUNCHES", repr(LAUNCHES))
    env = os.environ | {"TRITON_INTERPRET": "1", "YOLO_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out, exact = json.loads(r.stdout.strip().splitlines()[-1])
    for worst in out:
        assert max(worst) < 1e-5, worst
    assert all(exact), exact  # the halves' kernels: the whole op's values bit for bit


# yolo11n's Conv activations at batch 8 of 640 px (the kernels' row groups and channel blocks as at batch 128)
SHAPES = [(8, 16, 320, 320), (8, 32, 160, 160), (8, 8, 160, 160), (8, 64, 80, 80), (8, 80, 80, 80),
          (8, 128, 40, 40), (8, 256, 20, 20)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
def test_triton_is_as_close_to_float64_as_cudnn_in_fp16_channels_last(shape):
    """fp16 in and out as under AMP, against the float64 arithmetic on the same fp16 inputs: each of the six results
    (output, dx, dw, db, running mean and var) within 1.5 times cuDNN's own error (cuDNN rounds the BN output and
    SiLU's gradient to fp16 between its two ops; the fused op keeps them in float32), or float32 rounding."""
    case = _case(shape, torch.float16, "cuda")
    wide = {k: v.double() if v.dtype != torch.float16 else v for k, v in case.items()}

    def truth(x, w, b, rm, rv):
        return reference(x.double(), w.double(), b.double(), rm, rv, MOMENTUM, EPS)
    exact = _run(truth, {**wide, "dy": case["dy"].double()})
    ours, cudnn = _worst(_run(_ours, case), exact), _worst(_run(_torch, case), exact)
    assert all(o <= 1.5 * t + 1e-6 for o, t in zip(ours, cudnn)), (ours, cudnn)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, split", [((8, 32, 160, 160), 16), ((8, 64, 80, 80), 32), ((8, 256, 20, 20), 128),
                                          ((8, 48, 40, 40), 20)])
def test_triton_halves_are_the_whole_op_bit_for_bit(shape, split):
    """The halves' kernels on CUDA in fp16 (C2f's cv1 at yolo11n's sizes, and a split off the channel blocks): the
    output, the three gradients and the running statistics equal the whole op's bit for bit, each half dense."""
    case = _case(shape, torch.float16, "cuda")

    def halves(x, w, b, rm, rv, split):
        return bn_silu_halves(x, w, b, rm, rv, MOMENTUM, EPS, split)
    assert _halves_exact(halves, _ours, case, split)


@pytest.mark.gpu
def test_triton_makes_no_host_sync():
    from helpers import no_host_sync

    case = _case((4, 32, 40, 40), torch.float16, "cuda")
    _run(_ours, case)  # Triton compiles on first use
    with no_host_sync():
        _run(_ours, case)

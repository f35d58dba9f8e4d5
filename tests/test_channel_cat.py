"""The channel concatenation of NHWC activations (kernels/channel_cat.py) is ``torch.cat``'s, bit for bit: the output,
its memory format and the inputs' gradients. On CPU the Triton copy runs under Triton's interpreter (in a subprocess);
on CUDA (marked ``gpu``) a yolo11n step with ``patched()`` is held to the stock step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from yolofeed.kernels import channel_cat


def _inputs(dtype=torch.float32, device="cpu", seed=0):
    """A C2f-like concatenation: both channel slices of a wider activation (``chunk``), then dense ones of odd
    widths, at a size whose rows are not a multiple of any tile."""
    g = torch.Generator().manual_seed(seed)

    def act(c, n=3, h=7, w=11):
        return torch.randn(n, c, h, w, generator=g).to(device, dtype).to(memory_format=torch.channels_last)
    a, b = act(2 * 40).chunk(2, 1)
    return [a, b, act(40), act(3), act(130)]


def test_calls_it_does_not_take_are_torch_cat():
    xs = _inputs()
    assert not channel_cat.takes(tuple(xs), 1)  # CPU tensors
    assert torch.equal(channel_cat.cat(xs, 1), torch.cat(xs, 1))
    assert torch.equal(channel_cat.cat(iter(xs[2:]), dim=1), torch.cat(xs[2:], 1))  # a generator, consumed once
    assert torch.equal(channel_cat.cat([torch.ones(2), torch.zeros(3)]), torch.cat([torch.ones(2), torch.zeros(3)]))


def test_patched_cat_hands_every_other_signature_to_torch_cat_as_made():
    """``axis=``, ``out=``, no dim, a tuple of one: what torch.cat accepts it still does inside ``patched()``."""
    xs = _inputs()[2:]
    stock = channel_cat._torch_cat
    with channel_cat.patched():
        assert torch.equal(torch.cat(xs, axis=1), stock(xs, 1))
        out = torch.empty(0)
        torch.cat(xs, 1, out=out)
        assert torch.equal(out, stock(xs, 1))
        assert torch.equal(torch.cat(xs[:1] * 2), stock(xs[:1] * 2))
        assert torch.equal(torch.cat(tensors=xs, dim=1), stock(xs, 1))
        with pytest.raises(TypeError):
            torch.cat(xs, 1, 2)  # torch.cat's own error


def test_patched_restores_torch_cat_on_error():
    stock = torch.cat
    with pytest.raises(RuntimeError), channel_cat.patched():
        assert torch.cat is not stock
        raise RuntimeError("inside")
    assert torch.cat is stock


def test_patched_takes_the_calls_of_the_thread_inside_it_only(monkeypatch):
    taken = []
    monkeypatch.setattr(channel_cat, "cat", lambda *a, **k: taken.append(threading.get_ident()) or stock(*a, **k))
    stock, xs = torch.cat, _inputs()
    with channel_cat.patched():
        other = threading.Thread(target=lambda: torch.cat(xs, 1))
        other.start()
        other.join()
        assert not taken  # another thread's call: torch.cat's
        assert torch.equal(torch.cat(xs, 1), stock(xs, 1))
    torch.cat(xs, 1)
    assert taken == [threading.get_ident()]


def _layouts():
    cl = torch.channels_last
    a = torch.randn(2, 8, 3, 5).to(memory_format=cl)
    return [a, a[:, :4], a[:, 4:], torch.randn(2, 8, 3, 5), torch.randn(2, 1, 3, 5),
            torch.randn(2, 1, 3, 5).to(memory_format=cl), torch.randn(1, 8, 3, 5)[:, :2],
            torch.randn(1, 8, 3, 5).to(memory_format=cl)[:, :2], torch.randn(2, 8, 5, 3).transpose(2, 3),
            torch.randn(2, 3, 1, 5).to(memory_format=cl), torch.randn(2, 5, 3, 8).permute(0, 3, 2, 1)]


@pytest.mark.parametrize("i", range(11))
def test_it_takes_only_what_torch_cat_makes_channels_last(i):
    """``suggests_channels_last`` is ATen's rule: where it says no, torch.cat's output is NCHW and the Triton copy,
    whose output is channels-last, must not take the call (a ``.view`` of the result would fail)."""
    t = _layouts()[i]
    out = torch.cat([t, t], 1)
    as_cl, as_nchw = out.contiguous(memory_format=torch.channels_last).stride(), out.contiguous().stride()
    assert channel_cat.suggests_channels_last(t) == (out.stride() == as_cl != as_nchw)


def test_patched_blocks_nest_and_threads_leave_each_other_patched():
    stock = torch.cat
    inside, left = threading.Event(), threading.Event()
    seen = {}

    def other():
        with channel_cat.patched():
            inside.set()
            left.wait(10)
            seen["other"] = torch.cat is not stock and channel_cat._inside.depth == 1

    with channel_cat.patched():
        with channel_cat.patched():
            pass
        assert torch.cat is not stock and channel_cat._inside.depth == 1  # the outer block still patched
        thread = threading.Thread(target=other)
        thread.start()
        inside.wait(10)
    assert torch.cat is not stock  # the other thread is still inside its block
    left.set()
    thread.join(10)
    assert seen == {"other": True} and torch.cat is stock


@pytest.mark.slow
def test_triton_copy_equals_torch_cat_in_the_interpreter():
    pytest.importorskip("triton")
    code = textwrap.dedent(f"""
        import json, sys; sys.path.insert(0, {os.path.dirname(__file__)!r})
        import torch
        import test_channel_cat as t
        from yolofeed.kernels.channel_cat import _ChannelCat, row_stride
        from yolofeed.kernels import channel_cat
        out = []
        for dtype, dense in ((torch.float32, False), (torch.float16, False), (torch.float16, True)):
            channel_cat._DENSE_GRADS = dense
            xs = t._inputs(dtype)
            assert row_stride(xs[0]) == 80 and not xs[0].is_contiguous(memory_format=torch.channels_last)
            ours = _ChannelCat.apply(*[x.requires_grad_(True) for x in xs])
            g = torch.randn(ours.shape).to(dtype).to(memory_format=torch.channels_last)
            our_grads = torch.autograd.grad(ours, xs, g)  # as the backward made them (no leaf's layout rule)
            theirs = torch.cat(xs, 1)
            their_grads = torch.autograd.grad(theirs, xs, g)
            out.append([torch.equal(ours, theirs), ours.is_contiguous(memory_format=torch.channels_last),
                        all(torch.equal(p, q) for p, q in zip(our_grads, their_grads)),
                        all(p.is_contiguous(memory_format=torch.channels_last) == dense for p in our_grads)])
        print(json.dumps(out))
    """)
    env = os.environ | {"TRITON_INTERPRET": "1", "YOLO_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [[True, True, True, True]] * 3


@pytest.mark.gpu
def test_cuda_step_with_the_patched_cat_is_the_stock_step_bit_for_bit(monkeypatch):
    """yolo11n's forward and backward in fp16 channels-last, with ``torch.cat`` patched and without: the same outputs
    and gradients, and the patched one takes the model's channel concatenations and makes no host sync."""
    from torch.utils import _pytree as pytree
    from ultralytics.nn.tasks import DetectionModel

    from helpers import no_host_sync

    torch.manual_seed(0)
    model = DetectionModel("yolo11n.yaml", nc=80, verbose=False).cuda().to(memory_format=torch.channels_last).train()
    img = torch.rand(4, 3, 256, 256, device="cuda").to(memory_format=torch.channels_last)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)

    def step():
        for p in model.parameters():
            p.grad = None
        with torch.autocast("cuda", dtype=torch.float16):
            out = [t for t in pytree.tree_leaves(model(img)) if isinstance(t, torch.Tensor) and t.requires_grad]
        sum(o.float().square().mean() for o in out).backward()
        return [o.detach().clone() for o in out], [p.grad.clone() for p in model.parameters() if p.grad is not None]

    state = {k: v.clone() for k, v in model.state_dict().items()}
    stock = step()
    model.load_state_dict(state)
    taken = []
    with channel_cat.patched():
        real = channel_cat._ChannelCat.apply
        channel_cat._ChannelCat.apply = lambda *xs: taken.append(len(xs)) or real(*xs)
        try:
            ours = step()
            model.load_state_dict(state)
            with no_host_sync():
                step()
        finally:
            channel_cat._ChannelCat.apply = real
    assert len(taken) >= 2 * 15  # C3k2, C3, SPPF, C2PSA, Concat and Detect's concatenations, in each step
    assert all(torch.equal(a, b) for a, b in zip(ours[0], stock[0]))
    assert len(ours[1]) == len(stock[1]) and all(torch.equal(a, b) for a, b in zip(ours[1], stock[1]))

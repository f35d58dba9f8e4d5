"""``torch.cat(xs, 1)`` of NHWC activations as one Triton copy an input (``channel_cat_triton.py``), with
``torch.cat``'s backward: each input's gradient is a channel slice of the output's (or, ``_DENSE_GRADS``, a dense
copy of it).

``cat(tensors, dim)`` stands in for ``torch.cat``. The calls it takes (CUDA tensors, 4-D, one dtype, one batch and
size, each dense channels-last or a channel slice of such a tensor, joined along the channels) go through the Triton
copy; every other call is ``torch.cat``'s own. The output is channels-last and holds the same values bit for bit: a
copy rounds nothing. ``patched()`` puts it in place of ``torch.cat`` for a block.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch import Tensor

from yolofeed.kernels.bn_silu import row_stride

_TILE = 2048  # elements of a program's tile
_WARPS = 4
# The backward: each input's gradient a channel slice of the output's (torch.cat's), or a dense copy of it, made
# by the same Triton copy. A slice costs nothing here, but a consumer that needs dense rows (a convolution's
# backward, an add beside a dense gradient) copies it one element a thread.
_DENSE_GRADS = False
_torch_cat = torch.cat


DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # an activation's


def suggests_channels_last(t: Tensor) -> bool:
    """ATen's ``is_channels_last_strides_2d`` for a 4-D tensor: whether ``suggest_memory_format`` is channels-last.
    ``torch.cat``'s output is channels-last exactly where every input's is (``compute_output_memory_format``); an
    ambiguous layout (one channel, NCHW strides) suggests the default, NCHW."""
    sizes, strides = t.shape, t.stride()
    if strides[1] == 0:
        return False
    low = 0
    for d in (1, 3, 2, 0):
        if sizes[d] == 0 or strides[d] < low or (d == 0 and low == strides[1]):
            return False
        low = strides[d] * (sizes[d] if sizes[d] > 1 else 1)
    return True


def takes(tensors: tuple, dim) -> bool:
    """Whether the Triton copy takes ``torch.cat(tensors, dim)``: the output torch.cat would make channels-last, each
    input (M, C) rows of unit channel stride."""
    if len(tensors) < 2 or not isinstance(dim, int) or dim not in (1, -3):
        return False
    x0 = tensors[0]
    if not isinstance(x0, Tensor) or not x0.is_cuda or x0.dim() != 4 or x0.dtype not in DTYPES:
        return False
    n, _, h, w = x0.shape
    return all(isinstance(t, Tensor) and t.dim() == 4 and t.device == x0.device and t.dtype == x0.dtype
               and t.shape[0] == n and t.shape[2] == h and t.shape[3] == w and t.numel() > 0
               and row_stride(t) is not None and suggests_channels_last(t) for t in tensors)


class _ChannelCat(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *xs: Tensor) -> Tensor:
        n, _, h, w = xs[0].shape
        widths = [x.shape[1] for x in xs]
        total = sum(widths)
        out = torch.empty((n, total, h, w), device=xs[0].device, dtype=xs[0].dtype, memory_format=torch.channels_last)
        at = 0
        for x, c in zip(xs, widths):
            _copy(x, row_stride(x), out[:, at:], total, n * h * w, c)
            at += c
        ctx.widths = widths
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        grads, at = [], 0
        stride = row_stride(grad) if _DENSE_GRADS else None
        for c in ctx.widths:
            part = grad.narrow(1, at, c)
            if stride is not None:
                n, _, h, w = grad.shape
                dense = torch.empty_like(part, memory_format=torch.channels_last)
                _copy(part, stride, dense, c, n * h * w, c)
                part = dense
            grads.append(part)
            at += c
        return tuple(grads)


def _copy(src: Tensor, src_stride: int, dst: Tensor, dst_stride: int, m: int, c: int) -> None:
    """The (m, c) rows of ``src`` into ``dst``'s first c channels, each side's rows the given stride apart."""
    import triton

    from yolofeed.kernels import channel_cat_triton as k

    block_c = min(triton.next_power_of_2(c), 256)
    block_m = max(_TILE // block_c, 1)
    k.copy_rows[(triton.cdiv(m, block_m), triton.cdiv(c, block_c))](
        src, src_stride, dst, dst_stride, m, c, BLOCK_M=block_m, BLOCK_C=block_c, num_warps=_WARPS)


def cat(tensors, *args, **kwargs) -> Tensor:
    """``torch.cat`` with the channel concatenation of NHWC activations on the GPU as the Triton copy: a call of
    ``(tensors, dim)`` or ``(tensors, dim=dim)``; any other (``axis=``, ``out=``) is ``torch.cat``'s as it was made."""
    dim = args[0] if len(args) == 1 and not kwargs else kwargs["dim"] if not args and kwargs.keys() == {"dim"} else None
    tensors = tuple(tensors)
    if dim is None or not takes(tensors, dim):
        return _torch_cat(tensors, *args, **kwargs)
    return _ChannelCat.apply(*tensors)


def _thread_cat(tensors, *args, **kwargs) -> Tensor:
    """``cat`` in a thread inside ``patched()``, ``torch.cat`` in any other."""
    if getattr(_inside, "depth", 0):
        return cat(tensors, *args, **kwargs)
    return _torch_cat(tensors, *args, **kwargs)


_inside = threading.local()  # depth: this thread's patched() blocks open
_open = [0]  # every thread's patched() blocks open: torch.cat is _thread_cat while there is one
_lock = threading.Lock()


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """``torch.cat`` is ``cat`` inside the block, for the thread that entered it: another thread's calls meanwhile
    (a validation beside a graph's capture) stay ``torch.cat``'s and load no Triton kernel. Blocks nest, and
    several threads may be inside at once: ``torch.cat`` is put back when the last one leaves."""
    with _lock:
        _open[0] += 1
        torch.cat = _thread_cat
    _inside.depth = getattr(_inside, "depth", 0) + 1
    try:
        yield
    finally:
        _inside.depth -= 1
        with _lock:
            _open[0] -= 1
            if not _open[0]:
                torch.cat = _torch_cat

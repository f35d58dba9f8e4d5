"""The epoch's short batch (its last, smaller one) through convolutions that need no cuDNN plan: GEMMs over the batch.

cuDNN builds a plan for each convolution the first time a thread meets its shape, forward and both backward passes:
yolo11n's first pass at batch 16 costs 5.3 s on an H100, and made beside the first epoch it holds that epoch back
3.5-6 s (BENCHMARKS.md, "First epoch", "The whole run"). With the graphed step (train/graphed.py) the full batch
replays a graph captured before the first epoch, and the short batch is the only one that runs eager.

``Unplanned`` (a torch function mode, this thread's only) runs that batch's ``torch.conv2d`` calls as matrix products,
which cuBLAS plans in microseconds:

* a 1x1 convolution of stride 1 without padding is one GEMM of the channels-last pixels by the weight
  (``F.linear``): the layout Ultralytics trains in on CUDA;
* any other of groups 1 is the batch's im2col (``F.unfold``) and one GEMM of the weight by it, and a depthwise one
  each channel's window by its weights (``_Im2col``): the im2col is made a slice of the batch at a time
  (``SLICE_BYTES`` at most) and made again in the backward, so that the pass holds no more than cuDNN's: the
  convolution's input;
* anything else (a padding given as a string, other groups, a 3-D input) is torch's own.

The same sums in another order: in float64 each output and gradient is torch's to its rounding
(tests/test_unplanned.py); under float16 autocast on CUDA, each gradient and batch-norm statistic of yolo11n's training
pass is within 4 times cuDNN's own error against the float32 pass, plus 1 %, the median within 1.5 times (its GPU test
there). Autocast casts a convolution's input and weight where ``torch.conv2d`` dispatches, after this mode, so
``Unplanned`` casts them as autocast would, and the GEMMs run in that dtype with float32 accumulation.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from yolofeed.kernels.channel_cat import suggests_channels_last

SLICE_BYTES = 256 << 20  # the largest im2col made at once: yolo11n's at batch 127 would be 9 times its 3x3 inputs


def _pair(v: Any) -> tuple[int, int] | None:
    """A stride, padding or dilation as torch takes it (an int, or a sequence of one or two); None for anything else."""
    try:
        values = [int(v)] if isinstance(v, int) else [int(i) for i in v]
    except (TypeError, ValueError):
        return None
    return (values[0], values[-1]) if len(values) in (1, 2) else None


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
           padding: Any = 0, dilation: Any = 1, groups: int = 1) -> torch.Tensor | None:
    """``torch.conv2d(x, weight, bias, stride, padding, dilation, groups)`` as matrix products (see the module's doc),
    its output laid out as torch's (channels-last where the input's or the weight's strides are); None where they do
    not serve."""
    if x.dim() != 4 or isinstance(padding, str) or not (x.is_floating_point() and weight.dim() == 4):
        return None
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    if stride is None or padding is None or dilation is None:
        return None
    c, k = x.shape[1], weight.shape[0]
    depthwise = groups > 1 and groups == c == k and weight.shape[1] == 1
    if groups != 1 and not depthwise:
        return None
    if torch.is_autocast_enabled(x.device.type):  # as autocast casts conv2d's arguments: floats, not float64
        dtype = torch.get_autocast_dtype(x.device.type)
        x, weight, bias = (t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t
                           for t in (x, weight, bias))
    if (min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or x.dtype != weight.dtype
            or bias is not None and (bias.shape != (k,) or bias.dtype != weight.dtype)):
        return None  # torch's own call: its error (or its rule) for what no layer of a model passes
    last = suggests_channels_last(x) or suggests_channels_last(weight)  # torch's rule for a convolution's output
    if not depthwise and weight.shape[2:] == (1, 1) and stride == (1, 1) and padding == (0, 0) and last:
        n, _, h, w = x.shape  # the channels-last pixels are the rows of one (n*h*w, c) matrix (a view where dense)
        rows = x.permute(0, 2, 3, 1).reshape(-1, c)
        return F.linear(rows, weight.reshape(k, c), bias).view(n, h, w, k).permute(0, 3, 1, 2)
    y = _Im2col.apply(x, weight, stride, padding, dilation, depthwise)
    if bias is not None:
        y = y + bias.view(1, k, 1, 1)
    return y.contiguous(memory_format=torch.channels_last if last else torch.contiguous_format)


def _out_side(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


class _Im2col(torch.autograd.Function):
    """A convolution of groups 1 (or depthwise) as im2col and GEMMs, a slice of the batch at a time; its backward
    makes each slice's im2col again rather than keep it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, stride: tuple[int, int], padding: tuple[int, int],
                dilation: tuple[int, int], depthwise: bool) -> torch.Tensor:
        n, c, h, w = x.shape
        k, kernel = weight.shape[0], tuple(weight.shape[2:])
        oh, ow = (_out_side(s, kk, st, p, d) for s, kk, st, p, d in zip((h, w), kernel, stride, padding, dilation))
        ctx.save_for_backward(x, weight)
        ctx.conf = kernel, stride, padding, dilation, depthwise, (oh, ow)
        out = x.new_empty((n, k, oh, ow))
        for i, part in _slices(x, kernel, oh * ow):
            cols = F.unfold(part, kernel, dilation=dilation, padding=padding, stride=stride)  # (m, c*kh*kw, oh*ow)
            out[i:i + len(part)] = _apply(weight, cols, depthwise).view(len(part), k, oh, ow)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        kernel, stride, padding, dilation, depthwise, (oh, ow) = ctx.conf
        n, c, h, w = x.shape
        k = weight.shape[0]
        need_x, need_w = ctx.needs_input_grad[:2]
        grad_x = torch.empty_like(x, memory_format=torch.contiguous_format) if need_x else None
        wide = torch.promote_types(weight.dtype, torch.float32)  # the slices summed as cuDNN sums the batch
        grad_w = torch.zeros(weight.shape, dtype=wide, device=weight.device) if need_w else None
        for i, part in _slices(x, kernel, oh * ow):
            g = grad[i:i + len(part)].reshape(len(part), k, oh * ow)
            if need_w:
                cols = F.unfold(part, kernel, dilation=dilation, padding=padding, stride=stride)
                if depthwise:  # each channel's window times its gradient, summed over the slice's pixels
                    grad_w += torch.einsum("mckl,mcl->ck", cols.view(len(part), c, -1, oh * ow), g).view(
                        weight.shape).to(wide)
                else:
                    grad_w += torch.einsum("mkl,mjl->kj", g, cols).view(weight.shape).to(wide)
                del cols
            if need_x:
                if depthwise:
                    cols = (g.unsqueeze(2) * weight.reshape(1, c, -1, 1)).view(len(part), -1, oh * ow)
                else:
                    cols = torch.matmul(weight.reshape(k, -1).t(), g)  # (m, c*kh*kw, oh*ow)
                grad_x[i:i + len(part)] = F.fold(cols, (h, w), kernel, dilation=dilation, padding=padding,
                                                 stride=stride)
        return grad_x, grad_w.to(weight.dtype) if need_w else None, None, None, None, None


def _apply(weight: torch.Tensor, cols: torch.Tensor, depthwise: bool) -> torch.Tensor:
    """A slice's output from its im2col ``cols`` (m, c*kh*kw, pixels)."""
    k = weight.shape[0]
    if depthwise:
        m, _, pixels = cols.shape
        return torch.einsum("mckl,ck->mcl", cols.view(m, k, -1, pixels), weight.reshape(k, -1))
    return torch.matmul(weight.reshape(k, -1), cols)


def _slices(x: torch.Tensor, kernel: tuple[int, int], pixels: int):
    """(first image, the batch's slice) so that a slice's im2col stays within ``SLICE_BYTES``."""
    per_image = x.shape[1] * kernel[0] * kernel[1] * pixels * x.element_size()
    step = max(1, SLICE_BYTES // max(1, per_image))
    for i in range(0, x.shape[0], step):
        yield i, x[i:i + step]


class Unplanned(TorchFunctionMode):
    """Within it, this thread's ``torch.conv2d`` calls run as ``conv2d`` (see the module's doc); every other call is
    torch's own."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.conv2d:
            if "input" in kwargs:  # torch's name for the first argument
                args, kwargs = (kwargs["input"], *args), {k: v for k, v in kwargs.items() if k != "input"}
            out = conv2d(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)

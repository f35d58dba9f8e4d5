"""The detection loss's classification term, ``BCEWithLogitsLoss(reduction="none")(x, t.to(x.dtype)).sum()``, as one
pass forward and one backward (``bce_sum_triton.py``).

Ultralytics' expression on a step's (batch, anchors, classes) scores, under float16 autocast: the targets rounded to
half (a copy), both cast to float32 by autocast (two more), the loss written in float32, read by the sum; backward,
the gradient written in float32 and cast to half. At yolo11n's batch of 128 at 640 px that is 86 M values a map and
about 4.8 GB of memory traffic. Here the forward reads the logits and the targets once and sums per program (the
partials are summed by torch: the same order every run), and the backward reads them again and writes the half
gradient: about 1.2 GB.

The same arithmetic:

* the gradient is ATen's element for element: ``(sigmoid(x) - t) * g`` in float32 with ATen's float32 sigmoid
  (``1 / (1 + expf(-x))``, IEEE division) and t rounded to x's dtype first, then rounded once to x's dtype, as
  autocast's cast back rounds it. One exception, below float16's reach: Triton links libdevice flushing subnormals,
  so where sigmoid(x) is a float32 subnormal (x below about -87.3) it is 0 here; a float16 gradient rounds such a
  value to 0 either way;
* the loss is ATen's elementwise formula, ``(1 - t) x - log_sigmoid(x)``, summed in another order: float32 rounding
  of the reported ``cls_loss`` (``tests/test_bce_sum.py`` bounds it).

``takes(bce, x, t)`` says where it applies (with ``ENABLED``): NVIDIA's CUDA with Triton, a plain
``BCEWithLogitsLoss(reduction="none")`` (no weight, no pos_weight), x float16 under autocast, t float32 of x's shape,
both dense. The caller keeps Ultralytics' own expression everywhere else (the CPU among them).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

ENABLED = True  # False: Ultralytics' expression everywhere (tools/device/swap_ab.py off=bce_sum measures it)
_BLOCK = 1024  # elements of a program's tile
_ITERS = 8  # tiles a forward program sums: 86 M values make about 10,500 partials
_WARPS = 4


@functools.cache
def _triton() -> bool:
    """Whether Triton imports here, asked once: ``takes`` runs every loss call, and a failed import is not cached."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def takes(bce: nn.Module, x: Tensor, t: Tensor) -> bool:
    """Whether ``bce_sum(x, t)`` stands in for ``bce(x, t.to(x.dtype)).sum()`` here: float16 logits under CUDA's
    autocast (Ultralytics' AMP, the case its GPU tests hold to ATen's bits; the kernels take bfloat16 and float32
    too, untested there, so those keep Ultralytics' expression), NVIDIA's CUDA (libdevice)."""
    return (ENABLED and type(bce) is nn.BCEWithLogitsLoss and bce.reduction == "none" and bce.weight is None
            and bce.pos_weight is None and x.is_cuda and torch.version.hip is None and t.device == x.device
            and x.dtype == torch.float16 and torch.is_autocast_enabled("cuda")
            and t.dtype == torch.float32 and x.shape == t.shape and x.numel() > 0
            and x.is_contiguous() and t.is_contiguous() and _triton())


class _BCESum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, t: Tensor) -> Tensor:
        import triton

        from yolofeed.kernels import bce_sum_triton as k

        n = x.numel()
        part = torch.empty(triton.cdiv(n, _BLOCK * _ITERS), device=x.device, dtype=torch.float32)
        k.partials[(part.numel(),)](x, t, part, n, BLOCK=_BLOCK, ITERS=_ITERS, num_warps=_WARPS)
        ctx.save_for_backward(x, t)
        return part.sum()

    @staticmethod
    def backward(ctx, g: Tensor):
        import triton

        from yolofeed.kernels import bce_sum_triton as k

        x, t = ctx.saved_tensors
        n = x.numel()
        dx = torch.empty_like(x)
        g = g.detach().to(torch.float32).reshape(1)
        k.grad[(triton.cdiv(n, _BLOCK),)](x, t, g, dx, n, BLOCK=_BLOCK, num_warps=_WARPS)
        return dx, None


def bce_sum(x: Tensor, t: Tensor) -> Tensor:
    """``BCEWithLogitsLoss(reduction="none")(x, t.to(x.dtype)).sum()`` (float32, 0-d) in one pass each way; only
    where ``takes`` says so."""
    return _BCESum.apply(x, t)

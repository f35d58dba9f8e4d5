"""Training-mode batch norm followed by SiLU, as one autograd op on an NHWC (channels-last) activation.

``bn_silu(x, weight, bias, running_mean, running_var, momentum, eps)`` is ``F.silu(F.batch_norm(x, ..., True,
momentum, eps))``: the same per-channel statistics (biased variance to normalise, unbiased into ``running_var``),
the same running-statistics update, the same gradients. What differs is where the time goes: the BN output is never
stored (the backward recomputes it from x), and each direction is two passes over the activation instead of cuDNN's
batch norm plus SiLU's (``bn_silu_triton.py`` says how many). Sums are float32 in both; the results differ from
cuDNN's by float32 rounding of another summation order, which ``tests/test_bn_silu.py`` bounds.

``fusable(x)`` says whether an activation can take it: a channels-last 4-D tensor with more than one value per
channel. The torch path (``Reference``) runs the same arithmetic on any device; the Triton path runs on CUDA.
"""

from __future__ import annotations

import torch
from torch import Tensor

_GROUPS = 512  # row groups of the statistics passes: about four programs per SM of an H100/H200
_FLAT = 2048  # elements per program of the elementwise passes


def fusable(x: Tensor) -> bool:
    """Whether ``x`` is an activation the fused op takes: 4-D, channels-last dense, more than one value a channel."""
    return (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
            and x.shape[0] * x.shape[2] * x.shape[3] > 1 and x.dtype in (torch.float16, torch.bfloat16, torch.float32))


def _rows(x: Tensor) -> Tensor:
    """The (M, C) row view of a channels-last (N, C, H, W) tensor (no copy)."""
    n, c, h, w = x.shape
    return x.permute(0, 2, 3, 1).reshape(n * h * w, c)


def _blocks(m: int, c: int) -> tuple[int, int, int, int]:
    """BLOCK_C, BLOCK_M, rows per program and the number of row groups G for an (m, c) activation."""
    import triton

    block_c = min(triton.next_power_of_2(c), 64)
    block_m = max(4096 // block_c, 16)
    c_blocks = triton.cdiv(c, block_c)
    groups = max(1, min(triton.cdiv(m, block_m), triton.cdiv(_GROUPS, c_blocks)))
    rows = triton.cdiv(triton.cdiv(m, groups), block_m) * block_m
    return block_c, block_m, rows, triton.cdiv(m, rows)


class _TritonBNSiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor,
                momentum: float, eps: float) -> Tensor:
        import triton

        from yolofeed.kernels import bn_silu_triton as k

        rows = _rows(x)
        m, c = rows.shape
        block_c, block_m, per, groups = _blocks(m, c)
        part = torch.empty(groups, 2, c, device=x.device, dtype=torch.float32)
        save = torch.empty(6, c, device=x.device, dtype=torch.float32)
        k.stats[(groups, triton.cdiv(c, block_c))](rows, part, m, c, per, BLOCK_M=block_m, BLOCK_C=block_c)
        k.finalize[(triton.cdiv(c, block_c),)](part, groups, m, c, per, weight, bias, running_mean, running_var,
                                                save, momentum, eps, BLOCK_G=64, BLOCK_C=block_c)
        y = torch.empty_like(x)  # channels-last, as x
        k.apply[(triton.cdiv(m * c, _FLAT),)](rows, _rows(y), save, m * c, c, BLOCK=_FLAT)
        ctx.save_for_backward(x, save)
        ctx.blocks = block_c, block_m, per, groups
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        import triton

        from yolofeed.kernels import bn_silu_triton as k

        x, save = ctx.saved_tensors
        block_c, block_m, per, groups = ctx.blocks
        dy = dy.contiguous(memory_format=torch.channels_last)
        rows, drows = _rows(x), _rows(dy)
        m, c = rows.shape
        part = torch.empty(groups, 2, c, device=x.device, dtype=torch.float32)
        k.grad_stats[(groups, triton.cdiv(c, block_c))](rows, drows, save, part, m, c, per, BLOCK_M=block_m,
                                                         BLOCK_C=block_c)
        dw = torch.empty(c, device=x.device, dtype=torch.float32)
        db = torch.empty(c, device=x.device, dtype=torch.float32)
        k.grad_finalize[(triton.cdiv(c, block_c),)](part, groups, m, c, save, dw, db, BLOCK_G=64, BLOCK_C=block_c)
        dx = torch.empty_like(x)
        k.grad_apply[(triton.cdiv(m * c, _FLAT),)](rows, drows, _rows(dx), save, m * c, c, BLOCK=_FLAT)
        return dx, dw, db, None, None, None, None


def reference(x: Tensor, weight: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor, momentum: float,
              eps: float) -> Tensor:
    """The same arithmetic in torch ops (float32 statistics, the BN output recomputed in the backward by autograd's
    own formulas): the CPU path, and the yardstick the Triton path is tested against."""
    xf = x.float()
    dims = (0, 2, 3)
    m = x.numel() // x.shape[1]
    with torch.no_grad():
        mean = xf.mean(dims)
        var = xf.var(dims, unbiased=False)
        running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
        running_var.mul_(1 - momentum).add_(var * (m / max(m - 1, 1)), alpha=momentum)
    mean = xf.mean(dims, keepdim=True)
    var = xf.var(dims, unbiased=False, keepdim=True)
    z = (xf - mean) * torch.rsqrt(var + eps) * weight.float()[None, :, None, None] + bias.float()[None, :, None, None]
    return torch.nn.functional.silu(z).to(x.dtype)


def bn_silu(x: Tensor, weight: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor, momentum: float,
            eps: float) -> Tensor:
    """silu(batch_norm(x, training=True)) with the running statistics updated in place (not num_batches_tracked:
    the caller's module counts). Triton on CUDA, the torch reference elsewhere; ``x`` must be ``fusable``."""
    if x.is_cuda:
        return _TritonBNSiLU.apply(x, weight, bias, running_mean, running_var, float(momentum), float(eps))
    return reference(x, weight, bias, running_mean, running_var, momentum, eps)

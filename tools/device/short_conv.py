"""What the epoch's short batch costs with cuDNN's plans and without them (train/unplanned.py): each case in a
fresh process.

    python -m tools.device.short_conv [model=yolo11n.yaml] [imgsz=640] [short=16] [out=DIR]

A case: yolo11n (Ultralytics' DetectionModel, 80 classes) in training mode under Ultralytics' deterministic cuDNN
and float16 autocast; its cold forward and backward at batch 128 (the warm-up's), then at the short batch (cold),
then the short batch's steady forward and backward (the mean of 5 after 2) and the full batch's. ``unplanned`` runs
the short batch's passes under ``Unplanned``; it then compares the short batch's output and weight gradients with
cuDNN's on the same input and weights.

``Unplanned`` below (a torch function mode) routes the short batch's convolutions to torch's own CUDA kernels:
``thnn_conv2d`` (im2col and a GEMM an image) for groups 1, im2col and a weighted sum for a depthwise one (torch's
depthwise kernel has no backward of its own). Measured (BENCHMARKS.md, "First epoch") and not kept in the library:
its set-up is gone, its every pass at batch 16 is 6-8 times cuDNN's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


def _pair(v: Any) -> list[int]:
    return [int(v), int(v)] if isinstance(v, int) else [int(i) for i in v]


def unplanned_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
                     padding: Any = 0, dilation: Any = 1, groups: int = 1) -> torch.Tensor | None:
    """``torch.conv2d``'s result through torch's own CUDA kernels, or None where they do not serve (a padding given
    as a string, a dilation with groups, grouped convolutions that are not depthwise, a 3-D input)."""
    if x.device.type != "cuda" or isinstance(padding, str) or x.dim() != 4:
        return None
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    depthwise = groups > 1 and groups == x.shape[1] == weight.shape[0] and weight.shape[1] == 1
    if not (groups == 1 and dilation == [1, 1]) and not depthwise:
        return None
    if torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cuda")
        x, weight = x.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    kernel = list(weight.shape[2:])
    x, weight = x.contiguous(), weight.contiguous()
    if depthwise:
        return _depthwise(x, weight, bias, kernel, stride, padding, dilation)
    return torch._C._nn.thnn_conv2d(x, weight, kernel, bias, stride, padding)


def _depthwise(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, kernel: list[int], stride: list[int],
               padding: list[int], dilation: list[int]) -> torch.Tensor:
    """A depthwise convolution as im2col and each channel's weighted sum of its window."""
    n, c, h, w = x.shape
    oh, ow = ((size + 2 * p - d * (k - 1) - 1) // s + 1
              for size, p, d, k, s in zip((h, w), padding, dilation, kernel, stride))
    cols = F.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride)  # (n, c * kh * kw, oh * ow)
    y = (cols.view(n, c, kernel[0] * kernel[1], oh * ow) * weight.view(1, c, -1, 1)).sum(2).view(n, c, oh, ow)
    return y if bias is None else y + bias.view(1, c, 1, 1)


class Unplanned(TorchFunctionMode):
    """Within it, this thread's ``torch.conv2d`` calls on CUDA tensors run as ``unplanned_conv2d`` (see the module's
    doc); every other call is torch's own."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.conv2d:
            out = unplanned_conv2d(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def one(model_yaml: str, imgsz: int, short: int, unplanned: bool) -> dict:
    import torch
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.torch_utils import init_seeds

    init_seeds(0, deterministic=True)
    model = DetectionModel(model_yaml, nc=80, verbose=False).cuda().train()
    got: dict = {"unplanned": unplanned}

    def passes(n: int, plain: bool = True, x=None) -> tuple[float, float, list]:
        x = torch.zeros(n, 3, imgsz, imgsz, device="cuda") if x is None else x
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.float16), (nullcontext() if plain else Unplanned()):
            out = model(x)
        values = out.values() if isinstance(out, dict) else out
        loss = sum(v.float().sum() for v in values if isinstance(v, torch.Tensor))
        torch.cuda.synchronize()
        f = time.perf_counter() - t
        t = time.perf_counter()
        loss.backward()
        torch.cuda.synchronize()
        grads = [p.grad.float().clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad(set_to_none=True)
        return f, time.perf_counter() - t, [loss.detach().float()] + grads

    f, b, _ = passes(128)
    got["cold_128"] = [round(f, 3), round(b, 3)]
    f, b, _ = passes(short, plain=not unplanned)
    got[f"cold_{short}"] = [round(f, 3), round(b, 3)]
    steady = [passes(short, plain=not unplanned)[:2] for _ in range(7)][2:]
    got[f"steady_{short}_ms"] = [round(1000 * sum(s[0] for s in steady) / 5, 1),
                                 round(1000 * sum(s[1] for s in steady) / 5, 1)]
    steady = [passes(128)[:2] for _ in range(7)][2:]
    got["steady_128_ms"] = [round(1000 * sum(s[0] for s in steady) / 5, 1),
                            round(1000 * sum(s[1] for s in steady) / 5, 1)]
    if unplanned:
        torch.manual_seed(0)
        x = torch.rand(short, 3, imgsz, imgsz, device="cuda")
        a = passes(short, plain=False, x=x)[2]
        c = passes(short, plain=True, x=x)[2]
        got["loss"] = [a[0].item(), c[0].item()]
        rel = [((g1 - g2).norm() / g2.norm().clamp_min(1e-12)).item() for g1, g2 in zip(a[1:], c[1:])]
        got["grad_rel_err_max"] = max(rel)
        got["grad_rel_err_median"] = sorted(rel)[len(rel) // 2]
    return got


def main(argv: list[str]) -> None:
    args = dict(a.split("=", 1) for a in argv)
    model, imgsz, short = args.get("model", "yolo11n.yaml"), int(args.get("imgsz", 640)), int(args.get("short", 16))
    if "case" in args:
        print(json.dumps(one(model, imgsz, short, args["case"] == "unplanned")))
        return
    out = Path(args.get("out", "."))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for case in ("cudnn", "unplanned", "cudnn", "unplanned"):
        done = subprocess.run([sys.executable, "-m", "tools.device.short_conv", f"case={case}", f"model={model}",
                               f"imgsz={imgsz}", f"short={short}"], capture_output=True, text=True, timeout=300)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        got = json.loads(lines[-1]) if lines else {"error": done.stderr[-2000:]}
        row = {"case": case, "rc": done.returncode, **got}
        results.append(row)
        print(json.dumps(row), flush=True)
    (out / "short_conv.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])

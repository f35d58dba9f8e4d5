"""What the epoch's short batch costs with cuDNN's plans and with its convolutions as GEMMs (train/unplanned.py's
``Unplanned``, as the trainer runs it): each case in a fresh process.

    python -m tools.device.short_conv [model=yolo11n.yaml] [imgsz=640] [short=16] [cases=cudnn,gemm,...] [last=1]
        [out=DIR]

A case: yolo11n (Ultralytics' DetectionModel, 80 classes) in training mode, channels-last (``last=0``: not), under
Ultralytics' deterministic cuDNN and float16 autocast; its cold forward and backward at batch 128 (the warm-up's),
then at the short batch (cold), then the short batch's steady forward and backward (the mean of 5 after 2) and the
full batch's. ``gemm`` runs the short batch's passes under ``Unplanned``; it then compares the short batch's loss and
weight gradients with cuDNN's on the same input and weights. (torch's own per-image kernels, ``thnn_conv2d``, were
measured by the tree of c2b8d85's version of this tool: 6-8 times cuDNN's every pass.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path


def one(model_yaml: str, imgsz: int, short: int, case: str, last: bool) -> dict:
    import torch
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.torch_utils import init_seeds

    from yolofeed.train.unplanned import Unplanned

    init_seeds(0, deterministic=True)
    model = DetectionModel(model_yaml, nc=80, verbose=False).cuda().train()
    layout = torch.channels_last if last else torch.contiguous_format
    model = model.to(memory_format=layout)
    unplanned = case != "cudnn"
    got: dict = {"case": case, "channels_last": last}

    def passes(n: int, plain: bool = True, x=None) -> tuple[float, float, list]:
        x = torch.zeros(n, 3, imgsz, imgsz, device="cuda") if x is None else x
        x = x.contiguous(memory_format=layout)
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.float16), (nullcontext() if plain else Unplanned()):
            out = model(x)
        values = out.values() if isinstance(out, dict) else out
        loss = sum(v.float().mean() for v in values if isinstance(v, torch.Tensor))
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
    torch.cuda.reset_peak_memory_stats()
    f, b, _ = passes(short, plain=not unplanned)
    got[f"cold_{short}"] = [round(f, 3), round(b, 3)]
    steady = [passes(short, plain=not unplanned)[:2] for _ in range(7)][2:]
    got[f"steady_{short}_ms"] = [round(1000 * sum(s[0] for s in steady) / 5, 1),
                                 round(1000 * sum(s[1] for s in steady) / 5, 1)]
    got[f"peak_{short}_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
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
        print(json.dumps(one(model, imgsz, short, args["case"], args.get("last", "1") == "1")))
        return
    out = Path(args.get("out", "."))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for case in args.get("cases", "cudnn,gemm,cudnn,gemm").split(","):
        done = subprocess.run([sys.executable, "-m", "tools.device.short_conv", f"case={case}", f"model={model}",
                               f"imgsz={imgsz}", f"short={short}", f"last={args.get('last', '1')}"],
                              capture_output=True, text=True, timeout=300)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        got = json.loads(lines[-1]) if lines else {"error": done.stderr[-2000:]}
        row = {"case": case, "rc": done.returncode, **got}
        results.append(row)
        print(json.dumps(row), flush=True)
    (out / "short_conv.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])

"""The fused batch norm + SiLU's four kernels on a model's activations (batch 128 at 640 px), under several launch
configurations: each kernel's GPU time summed over the activations, and the bytes it moves a second.

    python -m tools.device.bn_silu_tune model=yolo11n.yaml stats=4096:4:512,2048:8:2048 flat=4096:4,8192:8

``stats`` lists TILE:WARPS:GROUPS[:UNROLL[:STAGES]] of the statistics passes (``stats``, ``grad_stats``),
``flat`` TILE:WARPS of the elementwise passes (``apply``, ``grad_apply``); the first of each is the baseline the
others are run with. Each activation has tensors of its own, as in a step, so that one's data does not sit in L2
for the next. Each configuration's results are checked against the first's: the same arithmetic, another summation
order.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

KERNELS = ("stats", "apply", "grad_stats", "grad_apply")
PASSES = {"stats": 1, "apply": 2, "grad_stats": 2, "grad_apply": 3}  # reads and writes of the activation


def _shapes(cfg: str, batch: int, imgsz: int) -> list[tuple[int, int, int, int]]:
    """(N, C, H, W) of the batch norm input of every Conv the fused op takes, in forward order."""
    from ultralytics.nn.tasks import DetectionModel

    from yolofeed.train.graphed import fusable_convs

    model = DetectionModel(cfg, nc=80, verbose=False).eval()
    shapes = []
    for m in fusable_convs(model):
        m.bn.register_forward_hook(lambda mod, inp, out: shapes.append((batch, *inp[0].shape[1:])))
    with torch.no_grad():
        model(torch.zeros(1, 3, imgsz, imgsz))
    return shapes


def _cases(shapes: list, device: str) -> list[dict]:
    g = torch.Generator(device=device).manual_seed(0)
    out = []
    for n, c, h, w in shapes:
        def t(*s, scale=1.0, shift=0.0):
            return torch.randn(*s, generator=g, device=device) * scale + shift
        out.append({"x": t(n, c, h, w, scale=2.0, shift=0.5).half().to(memory_format=torch.channels_last),
                    "dy": t(n, c, h, w).half().to(memory_format=torch.channels_last),
                    "w": t(c, scale=0.2, shift=1.0), "b": t(c), "rm": torch.zeros(c, device=device),
                    "rv": torch.ones(c, device=device)})
    return out


def _step(cases: list[dict], keep: bool = False) -> list:
    from yolofeed.kernels.bn_silu import bn_silu

    kept = []
    for k in cases:
        x = k["x"].requires_grad_(True)
        w, b = k["w"].requires_grad_(True), k["b"].requires_grad_(True)
        y = bn_silu(x, w, b, k["rm"], k["rv"], 0.03, 1e-3)
        y.backward(k["dy"])
        if keep:
            kept.append([y.detach().float(), x.grad.float(), w.grad.clone(), b.grad.clone()])
        x.grad = w.grad = b.grad = None
    return kept


def stats_knobs(text: str) -> tuple[int, int, int, int, int]:
    """TILE:WARPS:GROUPS[:UNROLL[:STAGES]] as the five values (UNROLL 1 and STAGES 3 where not given)."""
    values = [int(v) for v in text.split(":")]
    return tuple(values + [1, 3][len(values) - 3:])[:5]


def _configure(stats: str, flat: str) -> None:
    from yolofeed.kernels import bn_silu as op

    op._TILE, op._WARPS, op._GROUPS, op._UNROLL, op._STAGES = stats_knobs(stats)
    op._FLAT_TILE, op._FLAT_WARPS = (int(v) for v in flat.split(":"))
    op._plans.clear()


def _time(cases: list[dict], steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            _step(cases)
        torch.cuda.synchronize()
    ms = defaultdict(float)
    for e in prof.key_averages():
        name = e.key.split("(")[0].split()[-1]
        if name in KERNELS:
            ms[name] += (getattr(e, "self_device_time_total", None) or e.self_cuda_time_total) / steps / 1e3
    return dict(ms)


def _per_shape(cases: list[dict], shapes: list) -> dict:
    """Each kernel's time summed by (C, H, W): the launches come in the activations' order, four an activation."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _step(cases)
        torch.cuda.synchronize()
    times = [(e.name.split("(")[0].split()[-1], e.device_time) for e in prof.events()
             if e.device_type.name == "CUDA" and e.name.split("(")[0].split()[-1] in KERNELS]
    out: dict = defaultdict(lambda: defaultdict(float))
    for i, (name, us) in enumerate(times):
        n, c, h, w = shapes[i // 4]
        out[f"{c}x{h}x{w}"][name] += us / 1e3
    return {k: dict(v) for k, v in out.items()}


def best(report: dict) -> tuple[str, str]:
    """The statistics passes' and the elementwise passes' fastest configurations in a report."""
    runs = report["runs"]
    stats = min(runs, key=lambda r: r["ms"]["stats"] + r["ms"]["grad_stats"])["stats"]
    flat = min(runs, key=lambda r: r["ms"]["apply"] + r["ms"]["grad_apply"])["flat"]
    return stats, flat


def main(argv: list[str]) -> None:
    args = dict(a.split("=", 1) for a in argv)
    cfg, batch, imgsz = args.get("model", "yolo11n.yaml"), int(args.get("batch", 128)), int(args.get("imgsz", 640))
    stats = args.get("stats", "4096:4:512").split(",")
    flat = args.get("flat", "4096:4").split(",")
    out = Path(args.get("out", "/tmp/bn_silu_tune"))
    out.mkdir(parents=True, exist_ok=True)
    shapes = _shapes(cfg, batch, imgsz)
    cases = _cases(shapes, "cuda")
    gb = sum(n * c * h * w for n, c, h, w in shapes) * 2 / 1e9
    print(f"{cfg}: {len(shapes)} activations, {gb:.2f} GB of fp16 activation in all", flush=True)
    report = {"model": cfg, "batch": batch, "imgsz": imgsz, "activations": len(shapes), "activation_gb": gb,
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": []}
    configs = [(stats[0], f) for f in flat] + [(s, flat[0]) for s in stats[1:]]
    base = None
    for s, f in configs:
        _configure(s, f)
        for _ in range(2):  # compile, then warm
            _step(cases)
        got = _step(cases[:3] + cases[-3:], keep=True)
        if base is None:
            base = got
        worst = max(float((p - q).abs().max() / q.abs().max().clamp_min(1e-12))
                    for a, b in zip(got, base) for p, q in zip(a, b))
        fastest = {}
        for _ in range(3):  # best of three, each the mean of 5 steps
            for name, ms in _time(cases, 5).items():
                fastest[name] = min(fastest.get(name, ms), ms)
        run = {"stats": s, "flat": f, "ms": fastest, "total_ms": sum(fastest.values()), "worst_vs_first": worst,
               "tb_per_s": {k: PASSES[k] * gb / fastest[k] for k in fastest}}
        report["runs"].append(run)
        print(f"stats={s:<12} flat={f:<8} total {run['total_ms']:6.2f} ms  "
              + "  ".join(f"{k} {fastest.get(k, 0):5.2f} ({run['tb_per_s'].get(k, 0):.2f} TB/s)" for k in KERNELS)
              + f"  worst {worst:.1e}", flush=True)
        (out / f"{Path(cfg).stem}.json").write_text(json.dumps(report, indent=1))
    for s, f in dict.fromkeys([configs[0], best(report)]):
        _configure(s, f)
        rows = _per_shape(cases, shapes)
        report.setdefault("per_shape", {})[f"{s} {f}"] = rows
        print(f"by activation (C x H x W, each kernel summed over its activations), stats={s} flat={f}:")
        for key, ms in sorted(rows.items(), key=lambda kv: -sum(kv[1].values())):
            print(f"  {key:<12} " + "  ".join(f"{k} {ms.get(k, 0):6.3f}" for k in KERNELS), flush=True)
    (out / f"{Path(cfg).stem}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])

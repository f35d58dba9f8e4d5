"""The training step alone, on one GPU-resident batch: where its kernels' time goes, and what each lever saves.

    python -m tools.step_levers model=yolo11n.yaml batch=128 imgsz=640 out=$OUT/levers
    python -m tools.step_levers model=yolo11n.yaml base=fused_eager copies=1 levers= out=$OUT/levers_fused

The step is the ceiling's (yolofeed's sync-free loss, Ultralytics' model, fp16 autocast, channels-last), without
the optimiser: forward, loss, backward. Each lever is timed against the plain step in the same process, alternating,
so the GPU's clock and temperature are shared. The batch is random boxes on noise: the kernels' cost depends on
shapes and box counts, not on content.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F


def _batch(b: int, imgsz: int, boxes: int, device: str, generator: torch.Generator) -> dict:
    """Ultralytics' collated batch: ``boxes`` boxes in each image, normalised xywh."""
    n = b * boxes
    wh = torch.rand(n, 2, generator=generator) * 0.3 + 0.02
    xy = torch.rand(n, 2, generator=generator) * (1 - wh) + wh / 2
    return {"img": torch.rand(b, 3, imgsz, imgsz, generator=generator).to(device),
            "batch_idx": torch.arange(b).repeat_interleave(boxes).float().to(device),
            "cls": torch.randint(0, 80, (n, 1), generator=generator).float().to(device),
            "bboxes": torch.cat([xy, wh], 1).to(device)}


def _model(cfg: str, device: str):
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel(cfg, nc=80, verbose=False).to(device).to(memory_format=torch.channels_last)
    model.args = get_cfg()
    return model.train()


def _with_counts(model, batch: dict) -> dict:
    """The sync-free loss's two counts for ``batch``, as the ceiling reads them once per replayed batch."""
    from yolofeed.train import loss as train_loss
    from yolofeed.train.step import counts_for_ultralytics_batch

    train_loss.install(model)
    trainer = SimpleNamespace(sync_free_loss=True, args=SimpleNamespace(multi_scale=0), model=model)
    counts = counts_for_ultralytics_batch(trainer, batch) or {}
    with torch.autocast("cuda", dtype=torch.float16):
        model.loss({**batch, **counts}, model(batch["img"]))  # given max_boxes, it makes the anchors
    return {**batch, **(counts_for_ultralytics_batch(trainer, batch) or counts)}


def _step(model, batch: dict, forward=None) -> None:
    forward = forward or model
    with torch.autocast("cuda", dtype=torch.float16):
        preds = forward(batch["img"])
        loss, _ = model.loss(batch, preds)
    (loss.sum() * 1024.0).backward()  # a GradScaler's scale: one multiply
    for p in model.parameters():
        p.grad = None


def _time(fn, n: int) -> float:
    """Mean ms of ``fn`` over ``n`` calls, by CUDA events (the queue is full: the GPU's time)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


CATEGORIES = (  # kernel name pattern -> what it is (first match wins)
    ("batch norm", r"bn_|batch_norm|batchnorm|welford|cudnn::bn"),
    ("convolution", r"conv|implicit|gemm|xmma|cutlass|sm90|sm80|wgrad|dgrad|fprop|nhwc|winograd|cudnn"),
    ("SiLU", r"silu"),
    ("copy/cat", r"copy|cat|transpose|permute|index|gather|scatter|upsample|nearest"),
    ("reduction", r"reduce|sum|max|min|topk|sort|radix|scan|argmax"),
    ("elementwise", r"elementwise|vectorized|unrolled|pointwise|triton"),
)


def _breakdown(model, batch: dict, steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            _step(model, batch)
        torch.cuda.synchronize()
    kernels, by_cat = [], defaultdict(float)
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if us <= 0 or e.key.startswith(("ProfilerStep", "cuda")):
            continue
        cat = next((c for c, rx in CATEGORIES if re.search(rx, e.key, re.I)), "other")
        by_cat[cat] += us / steps / 1e3
        kernels.append((us / steps / 1e3, e.count // steps, cat, e.key[:110]))
    kernels.sort(reverse=True)
    return {"by_category_ms": dict(sorted(by_cat.items(), key=lambda kv: -kv[1])),
            "kernels_per_step": sum(k[1] for k in kernels), "top": kernels[:40]}


def _phases(model, batch: dict, n: int) -> dict:
    """Forward, loss and backward apart (a sync between them: for the split, not the sum)."""
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    out = defaultdict(float)
    for _ in range(n):
        torch.cuda.synchronize()
        ev[0].record()
        with torch.autocast("cuda", dtype=torch.float16):
            preds = model(batch["img"])
            ev[1].record()
            loss, _ = model.loss(batch, preds)
        ev[2].record()
        (loss.sum() * 1024.0).backward()
        ev[3].record()
        torch.cuda.synchronize()
        for p in model.parameters():
            p.grad = None
        for k, (a, b) in {"forward": (0, 1), "loss": (1, 2), "backward": (2, 3)}.items():
            out[k] += ev[a].elapsed_time(ev[b]) / n
    return dict(out)


# ---- levers: each returns a forward to use in place of the model's, or changes the model in place ----

def _bn_silu(x, w, b, rm, rv, momentum: float, eps: float):
    return F.silu(F.batch_norm(x, rm, rv, w, b, True, momentum, eps))


def lever_compiled_bn_silu(model):
    """Every Conv's batch norm and SiLU as one inductor kernel (forward and backward); the convolution stays cuDNN's."""
    from ultralytics.nn.modules.conv import Conv

    fused = torch.compile(_bn_silu, dynamic=True)
    for m in model.modules():
        if type(m) is Conv and isinstance(m.act, torch.nn.SiLU) and isinstance(m.bn, torch.nn.BatchNorm2d):
            def forward(x, m=m):
                bn = m.bn
                bn.num_batches_tracked.add_(1)
                return fused(m.conv(x), bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.momentum, bn.eps)
            m.forward = forward
    return None


def _swap_bn_silu(model, fused) -> int:
    """Every Conv with batch norm and SiLU: its convolution as it is, then ``fused(x, bn)``. Returns how many."""
    from ultralytics.nn.modules.conv import Conv

    n = 0
    for m in model.modules():
        if type(m) is Conv and type(m.act) is torch.nn.SiLU and type(m.bn) is torch.nn.BatchNorm2d:
            def forward(x, m=m):
                m.bn.num_batches_tracked.add_(1)
                return fused(m.conv(x), m.bn)
            m.forward = forward
            n += 1
    return n


def lever_triton_bn_silu(model):
    """Every Conv's batch norm and SiLU as yolofeed's Triton op (kernels/bn_silu.py), forward and backward."""
    from yolofeed.kernels.bn_silu import bn_silu, fusable

    def fused(x, bn):
        if not fusable(x):
            return F.silu(bn(x))
        return bn_silu(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.momentum, bn.eps)
    _swap_bn_silu(model, fused)
    return None


def lever_triton_bn_silu_narrow(model):
    """The Triton op only where an activation has at most 32 channels (the early, large layers); cuDNN elsewhere."""
    from yolofeed.kernels.bn_silu import bn_silu, fusable

    def fused(x, bn):
        if x.shape[1] > 32 or not fusable(x):
            return F.silu(bn(x))
        return bn_silu(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.momentum, bn.eps)
    _swap_bn_silu(model, fused)
    return None


def lever_graphed(model, without: tuple = ()):
    """yolofeed's graphed step (train/graphed.py) as its trainer installs it: forward and backward replayed as CUDA
    graphs, batch norm and SiLU fused, the head's upsamples in half and its outputs cells-major, the channel
    concatenations as the Triton copy, the weights cast at once, C2f/C3k2's cv1 output as two dense halves; the loss
    eager. ``without``: swapped classes put
    back to torch's or Ultralytics' before the capture."""
    from yolofeed.train import graphed

    graphed.swap(model)
    for m in model.modules():
        if isinstance(m, without):
            m.__class__ = m._stock
    model.__dict__["_graph"] = graphed._Graph(model, {"enabled": True, "dtype": torch.float16}, print)
    return None


def lever_graphed_stock_layout(model):
    """The graphed step without its layout swaps: Ultralytics' float32 upsamples and channels-major head outputs."""
    from yolofeed.train import graphed

    return lever_graphed(model, without=(graphed.HalfUpsample, graphed.TokenMajorDetect))


def lever_graphed_uncast(model):
    """The graphed step with every convolution's weight cast by autocast at its use, not at once (no ``CastConv2d``)."""
    from yolofeed.train import graphed

    return lever_graphed(model, without=(graphed.CastConv2d,))


def lever_graphed_chunked(model):
    """The graphed step with C2f/C3k2's cv1 output chunked as Ultralytics chunks it, not written as two dense halves
    (no ``HalvesC2f`` / ``HalvesC3k2``)."""
    from yolofeed.train import graphed

    return lever_graphed(model, without=(graphed.HalvesC2f, graphed.HalvesC3k2))


def lever_fused_eager(model):
    """The graphed step's kernels launched eagerly: every fusable Conv's batch norm and SiLU as the Triton op, as
    inside the graph's capture (``base=fused_eager`` profiles the step the graph replays, its copies among them)."""
    from yolofeed.train import graphed

    graphed.swap(model)  # without a graph, predict is Ultralytics'
    for m in model.modules():
        if isinstance(m, graphed._SWAPPED):
            m.fused = True
    return None


def lever_triton_cat(model):
    """The model's channel concatenations of NHWC activations as yolofeed's Triton copy (kernels/channel_cat.py),
    ``torch.cat`` patched around each forward (a graph captured in it records the copies); with ``graphed``:
    ``graphed+triton_cat``."""
    from yolofeed.kernels import channel_cat

    def forward(img):
        with channel_cat.patched():
            return model(img)
    return forward


def lever_triton_cat_dense(model):
    """``triton_cat`` whose backward hands each input a dense gradient (kernels/channel_cat.py's ``_DENSE_GRADS``),
    set for the rest of the process: list it after the levers without it."""
    from yolofeed.kernels import channel_cat

    channel_cat._DENSE_GRADS = True
    return lever_triton_cat(model)


def lever_graphed_unfused(model):
    """The graphed step with Ultralytics' batch norm and SiLU (what the graph alone gives)."""
    from yolofeed.train import graphed

    model.__class__ = graphed._graphed_class(type(model))
    model.__dict__["_graph"] = graphed._Graph(model, {"enabled": True, "dtype": torch.float16}, print)
    return None


def lever_native_bn(model):
    """Every Conv's batch norm through ATen's own channels-last kernels (``native_batch_norm``), not cuDNN's."""
    def fused(x, bn):
        return F.silu(torch.native_batch_norm(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, True,
                                              bn.momentum, bn.eps)[0])
    _swap_bn_silu(model, fused)
    return None


def _kernel_ms(fn, n: int) -> float:
    """The GPU's kernel time of one call of ``fn`` (the profiler's device time, summed), ms."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    return sum(getattr(e, "self_device_time_total", 0) for e in prof.key_averages()) / n / 1e3


def _bn_shapes(model, batch: dict, n: int) -> list:
    """Each distinct Conv activation of one forward: cuDNN's batch norm + SiLU against the Triton op, forward and
    backward, ms (the same tensors, alternately)."""
    from ultralytics.nn.modules.conv import Conv

    from yolofeed.kernels.bn_silu import bn_silu

    shapes = defaultdict(int)  # shape -> Convs of that shape in one forward

    def count(mod, inp, out):
        shapes[tuple(inp[0].shape)] += 1
    hooks = [m.bn.register_forward_hook(count) for m in model.modules() if type(m) is Conv]
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        model(batch["img"])
    for h in hooks:
        h.remove()
    rows = []
    for shape, count in shapes.items():
        x = torch.randn(shape, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        x.requires_grad_(True)
        bn = torch.nn.BatchNorm2d(shape[1], eps=1e-3, momentum=0.03).cuda()
        g = torch.randn_like(x)

        def cudnn(x=x, bn=bn, g=g):
            y = F.silu(bn(x))
            y.backward(g)

        def triton(x=x, bn=bn, g=g):
            y = bn_silu(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.momentum, bn.eps)
            y.backward(g)
        out = {"shape": list(shape), "convs": count}
        for name, fn in (("cudnn", cudnn), ("triton", triton)):
            fn()
            out[f"{name}_ms"] = round(min(_time(fn, n) for _ in range(3)), 4)  # the pace: GPU or host, the slower
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            out[f"{name}_host_ms"] = round((time.perf_counter() - t0) / n * 1e3, 4)  # the host's cost, queued ahead
            torch.cuda.synchronize()
            out[f"{name}_gpu_ms"] = round(_kernel_ms(fn, n), 4)
        out["speedup"] = round(out["cudnn_ms"] / out["triton_ms"], 3)
        out["gpu_speedup"] = round(out["cudnn_gpu_ms"] / out["triton_gpu_ms"], 3)
        rows.append(out)
        print("bn_silu", json.dumps(out), flush=True)
    return rows


def lever_compiled_blocks(model):
    """Every top-level layer compiled on its own (regional compile, inductor), the loss and the head eager."""
    for i, m in enumerate(model.model[:-1]):
        model.model[i] = torch.compile(m, dynamic=False)
    return None


class _Flat(torch.nn.Module):
    """The model's training output as a flat tuple (what a graphed callable may return)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, img):
        with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
            p = self.model(img)
        return (p["boxes"], p["scores"], *p["feats"])


def lever_cuda_graph(model, batch: dict):
    """The forward and backward of the model (not the loss) captured as CUDA graphs (static shapes)."""
    graphed = torch.cuda.make_graphed_callables(_Flat(model), (batch["img"].clone(),), num_warmup_iters=3)

    def forward(img):
        out = graphed(img)
        return {"boxes": out[0], "scores": out[1], "feats": list(out[2:])}
    return forward


def lever_split_cv1(model):
    """C2f/C3k2's first convolution as two half convolutions (the same weight, sliced), so that neither half is a
    strided channel slice of an NHWC tensor: the bottlenecks' inputs need no contiguous copy, forward or backward."""
    from ultralytics.nn.modules.block import C2f

    def half(cv, x, s):
        conv, bn = cv.conv, cv.bn
        z = F.conv2d(x, conv.weight[s], None, conv.stride, conv.padding, conv.dilation, conv.groups)
        z = F.batch_norm(z, bn.running_mean[s], bn.running_var[s], bn.weight[s], bn.bias[s], True, bn.momentum, bn.eps)
        return cv.act(z)

    for m in model.modules():
        if isinstance(m, C2f) and type(m).forward is C2f.forward:
            def forward(x, m=m):
                m.cv1.bn.num_batches_tracked.add_(1)
                y = [half(m.cv1, x, slice(0, m.c)), half(m.cv1, x, slice(m.c, 2 * m.c))]
                y.extend(b(y[-1]) for b in m.m)
                return m.cv2(torch.cat(y, 1))
            m.forward = forward
    return None


def lever_nchw(model):
    """Not a lever of ours: Ultralytics' ``channels_last=False``, for scale."""
    model.to(memory_format=torch.contiguous_format)
    return None


def _copies(model, batch: dict) -> list:
    """The copying ops of one step (copy_, cat, clone, fill), by device time, with their shapes and callers."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, with_stack=True) as prof:
        _step(model, batch)
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages(group_by_input_shape=True, group_by_stack_n=4):
        us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if us > 0 and e.key in ("aten::copy_", "aten::cat", "aten::fill_", "aten::zero_", "aten::add_",
                                "aten::upsample_nearest2d", "aten::_to_copy", "aten::index", "aten::index_put_"):
            stack = [f for f in (e.stack or []) if "site-packages/torch" not in f][:3]
            rows.append((round(us / 1e3, 3), e.count, e.key, str(e.input_shapes)[:90], stack))
    rows.sort(key=lambda r: -r[0])
    return rows[:30]


COPYING = ("aten::copy_", "aten::cat", "aten::fill_", "aten::zero_", "aten::add_", "aten::add", "aten::clone",
           "aten::upsample_nearest2d", "aten::upsample_nearest2d_backward", "aten::_to_copy", "aten::index",
           "aten::index_put_", "aten::contiguous")


def _layer_of(e, seq_layer: dict) -> tuple[str, str] | None:
    """(layer, forward/backward) of a profiler event: its enclosing ``layer`` range, or the layer whose forward op
    made the autograd node it runs under; None for the loss and the rest."""
    node = e
    while node is not None:
        if node.name.startswith("layer "):
            return node.name, "forward"
        if node.name.startswith("autograd::engine::evaluate_function") and node.sequence_nr in seq_layer:
            return seq_layer[node.sequence_nr], "backward"
        node = node.cpu_parent
    return None


def copies_by_layer(model, step, time_of=None) -> list:
    """The copying ops' time of one ``step()`` by the model's layer (``model.model``'s children, as Ultralytics
    numbers them) and direction: a forward op by the layer it runs in, a backward op by the layer whose forward made
    its autograd node (the profiler's sequence numbers). ``time_of(event)`` is the time counted (the GPU's
    by default, the CPU's where there is no GPU)."""
    from torch.profiler import ProfilerActivity, profile

    time_of = time_of or (lambda e: getattr(e, "self_device_time_total", None) or e.self_cuda_time_total)
    ranges, hooks = {}, []
    for i, layer in enumerate(model.model):
        name = f"layer {i} {type(layer).__name__}"

        def enter(mod, inp, name=name):
            ranges[name] = torch.autograd.profiler.record_function(name).__enter__()

        def leave(mod, inp, out, name=name):
            ranges.pop(name).__exit__(None, None, None)
        hooks += [layer.register_forward_pre_hook(enter), layer.register_forward_hook(leave)]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    try:
        with profile(activities=activities) as prof:
            step()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
    finally:
        for h in hooks:
            h.remove()
    events = prof.events()
    seq_layer = {}
    for e in events:
        if e.sequence_nr >= 0 and not e.name.startswith("autograd::"):
            where = _layer_of(e, {})
            if where:
                seq_layer.setdefault(e.sequence_nr, where[0])
    rows = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.name in COPYING:
            where = _layer_of(e, seq_layer) or ("loss and the rest", "")
            row = rows[(*where, e.name)]
            row[0] += time_of(e) / 1e3
            row[1] += 1
    return sorted(([round(ms, 3), n, layer, way, op] for (layer, way, op), (ms, n) in rows.items() if ms > 0),
                  key=lambda r: -r[0])


def lever_bf16(model):
    """Not a lever of ours: Ultralytics' ``amp=bf16`` key, for scale."""
    return "bf16"


def _lever(name: str, cfg: str, model, batch: dict, n: int) -> dict:
    """One lever on a copy of ``model``, timed against ``model`` itself, alternately."""
    torch.manual_seed(0)
    other = _model(cfg, "cuda")
    other.load_state_dict(model.state_dict())
    obatch = _with_counts(other, batch)
    t0 = time.perf_counter()
    try:
        fwd = None
        for part in name.split("+"):  # levers together: a+b
            made = lever_cuda_graph(other, obatch) if part == "cuda_graph" else globals()[f"lever_{part}"](other)
            fwd = made or fwd
        if fwd == "bf16":
            def run():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss, _ = other.loss(obatch, other(obatch["img"]))
                loss.sum().backward()
                for p in other.parameters():
                    p.grad = None
        else:
            def run():
                _step(other, obatch, fwd)
        for _ in range(5):
            run()
        torch.cuda.synchronize()
        ready = time.perf_counter() - t0
        base, lev = [], []
        for _ in range(3):  # alternate: shared clocks
            base.append(_time(lambda: _step(model, batch), n))
            lev.append(_time(run, n))
        return {"base_ms": min(base), "lever_ms": min(lev), "speedup": min(base) / min(lev), "ready_s": ready,
                "base_kernels_ms": _kernel_ms(lambda: _step(model, batch), 3), "lever_kernels_ms": _kernel_ms(run, 3)}
    except Exception as e:  # a lever that cannot run is a finding, not a crash
        return {"error": f"{type(e).__name__}: {str(e)[:400]}"}


def main(argv: list[str]) -> None:
    args = dict(a.split("=", 1) for a in argv)
    cfg, b, imgsz = args.get("model", "yolo11n.yaml"), int(args.get("batch", 128)), int(args.get("imgsz", 640))
    n, out = int(args.get("n", 20)), Path(args.get("out", "/tmp/levers"))
    levers = [x for x in args.get("levers", "compiled_bn_silu,compiled_blocks,cuda_graph").split(",") if x]
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.deterministic = True  # Ultralytics' deterministic=True default
    g = torch.Generator().manual_seed(0)
    report = {"model": cfg, "batch": b, "imgsz": imgsz, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(), "levers": {}}
    model = _model(cfg, "cuda")
    if "base" in args:  # the plain step with a lever in it (e.g. fused_eager): what the breakdown and copies profile
        report["base"] = args["base"]
        globals()[f"lever_{args['base']}"](model)
    batch = _with_counts(model, _batch(b, imgsz, 24, "cuda", g))
    for _ in range(5):
        _step(model, batch)
    report["base_ms"] = _time(lambda: _step(model, batch), n)
    report["phases_ms"] = _phases(model, batch, 5)
    report["breakdown"] = _breakdown(model, batch, 3)
    report["copies"] = _copies(model, batch) if "copies" in args else []
    report["copies_by_layer"] = copies_by_layer(model, lambda: _step(model, batch)) if "copies" in args else []
    report["bn_shapes"] = _bn_shapes(model, batch, n) if "bn_shapes" in args else []
    print(json.dumps({k: report[k] for k in ("base_ms", "phases_ms")}), flush=True)
    for ms, count, layer, way, op in report["copies_by_layer"][:40]:
        print(f"  {ms:7.3f} ms {count:4d}x {layer:<22} {way:<9} {op}", flush=True)
    for c, ms in report["breakdown"]["by_category_ms"].items():
        print(f"  {c:<14}{ms:8.2f} ms", flush=True)
    (out / f"{Path(cfg).stem}.json").write_text(json.dumps(report, indent=1))
    for name in levers:
        res = _lever(name, cfg, model, batch, n)
        report["levers"][name] = res
        print(name, json.dumps(res), flush=True)
        (out / f"{Path(cfg).stem}.json").write_text(json.dumps(report, indent=1))
        torch.cuda.empty_cache()
    (out / f"{Path(cfg).stem}.json").write_text(json.dumps(report, indent=1))
    top = "\n".join(f"{ms:8.3f} ms {cnt:5d}x {cat:<12} {name}" for ms, cnt, cat, name in report["breakdown"]["top"])
    (out / f"{Path(cfg).stem}_kernels.txt").write_text(top + "\n")
    print(top)


if __name__ == "__main__":
    main(sys.argv[1:])

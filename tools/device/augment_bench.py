"""What the GPU augmentation costs per batch, per op, and in memory.

Ultralytics' default hyperparameters unless named, on a pack of DATA_YAML's training split; every call
gets one of up to 8 different batches in turn. On CUDA: CUDA-event medians after 10 warm-up calls, the
pipeline eager and replayed as a CUDA graph (with the partner pool, as training runs it), the warp
kernel's block sizes, and the peak memory. On the CPU (``--device cpu``, a smoke run): wall-clock medians
of the eager pipeline and the ops, nothing CUDA-only. Writes ``$OUT/augment_bench.json``.

Usage: python -m tools.device.augment_bench DATA_YAML [--device cuda] [--batch 128] [--imgsz 640] [--iters 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import torch

from yolofeed.augment import AugmentHyp, GpuAugment, SourceBatch, color, geometry, mix
from yolofeed.augment.pipeline import compose
from yolofeed.augment.pool import PartnerPool, ultralytics_capacity
from yolofeed.augment.warp import triton_kernels, warp
from yolofeed.loader import TrainLoader
from yolofeed.pack import Pack, open_or_build


def loaded_batches(pack: Pack, batch: int, device: torch.device, n: int = 8) -> list[SourceBatch]:
    """The first ``n`` batches the training loader delivers, copied out of its reused buffers."""
    batches = []
    for b in TrainLoader(pack, batch, device, seed=0, sync=True):
        if len(batches) == n or len(b["im_file"]) < batch:
            break
        s = b["source"]
        batches.append(SourceBatch(*(t.clone() for t in (s.images, s.hw, s.cls, s.boxes, s.valid))))
    return batches


def timer(device: torch.device, iters: int) -> Callable[[Callable, list], float]:
    """``timed(fn, batches)``: the median milliseconds of ``fn(batch)`` over ``iters`` calls, after 10 warm-up calls
    (CUDA events on CUDA; wall clock after a synchronize elsewhere)."""

    def timed(fn: Callable, batches: list) -> float:
        for k in range(min(10, iters)):
            fn(batches[k % len(batches)])
        times = []
        for k in range(iters):
            if device.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn(batches[k % len(batches)])
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn(batches[k % len(batches)])
                times.append(1e3 * (time.perf_counter() - t0))
        return round(statistics.median(times), 3)

    return timed


def bench(data: str, device: str, batch: int, imgsz: int, iters: int) -> dict:
    """Every figure of the benchmark, as a dict."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("augment_bench: --device cuda, but torch sees no CUDA device: use --device cpu")
    pack = open_or_build(data, "train", imgsz, rebuild="auto", progress=False)
    if len(pack) < batch:
        raise SystemExit(f"augment_bench: {data} has {len(pack)} training images, fewer than --batch {batch}")
    B, S = batch, imgsz
    timed = timer(dev, iters)
    g = torch.Generator(device=dev).manual_seed(0)
    batches = loaded_batches(pack, B, dev)
    res: dict = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "batch": B,
                 "imgsz": S, "iters": iters}

    aug = GpuAugment(AugmentHyp(imgsz=S))
    capacity = ultralytics_capacity(len(pack), B)
    pool = PartnerPool(capacity, B)
    res["pool_images"] = capacity
    res["full_default_ms"] = timed(lambda sb: aug(sb, g, pool), batches)
    res["full_default_plus_to_ultralytics_ms"] = timed(lambda sb: aug(sb, g, pool).to_ultralytics(), batches)
    res["full_default_no_pool_ms"] = timed(lambda sb: aug(sb, g), batches)
    if dev.type == "cuda":
        from yolofeed.augment.graphs import GraphedAugment

        graphed = GraphedAugment(aug, seed=0, device=dev, pool=PartnerPool(capacity, B))
        res["graphed_default_ms"] = timed(graphed, batches)  # includes the batch's copy into the pool's ring
        res["graphed_default_plus_to_ultralytics_ms"] = timed(lambda sb: graphed(sb).to_ultralytics(), batches)
        res["graphs_captured"] = graphed.captured
        res["graphed_default_no_pool_ms"] = timed(GraphedAugment(aug, seed=0, device=dev), batches)  # batch copied in

    # per op, on fixed parameters of the first batch (partners within the batch)
    sb = batches[0]
    p = aug.sample(B, g, dev)
    layout = geometry.mosaic_layout(p.mosaic, sb.hw, S)
    M, scale = geometry.perspective_matrix(p.perspective, layout.canvas_hw, S)
    res["op_sample_params_ms"] = timed(lambda _: aug.sample(B, g, dev), batches)
    res["op_layout_matrix_ms"] = timed(lambda b: geometry.perspective_matrix(
        p.perspective, geometry.mosaic_layout(p.mosaic, b.hw, S).canvas_hw, S), batches)
    res["op_boxes_ms"] = timed(lambda b: geometry.flip_boxes(geometry.warp_boxes(*geometry.mosaic_boxes(
        layout, b.boxes, b.valid, b.hw), M, scale, S, False)[0], p.flips, S), batches)
    res["op_warp_fused_ms"] = timed(lambda b: warp(b.images, layout, M, p.flips, S, False), batches)
    if dev.type == "cuda" and (warp_triton := triton_kernels()) is not None:  # block sizes: Triton's kernel only
        for blk, nw in ((64, 2), (128, 2), (128, 4), (256, 4), (256, 8)):
            res[f"op_warp_fused_block{blk}_warps{nw}_ms"] = timed(
                lambda b, blk=blk, nw=nw: warp_triton.warp(b.images, layout, M, p.flips, S, False, 114, blk, nw),
                batches)
    # the alternative to the fused warp: paste a 2S canvas (the same kernel, M = identity), then warp the canvas
    ident = torch.eye(3, device=dev).repeat(B, 1, 1)
    no = torch.zeros(B, dtype=torch.bool, device=dev)
    cs = 2 * S
    whole = torch.tensor([0, 0, cs, cs], device=dev).repeat(B, 1, 1)  # each canvas is one tile
    single = geometry.Layout(torch.arange(B, device=dev)[:, None], whole,
                             torch.zeros(B, 1, 2, dtype=torch.long, device=dev), torch.full((B, 2), cs, device=dev), no)

    def two_pass(b: SourceBatch) -> torch.Tensor:
        canvas = warp(b.images, layout, ident, geometry.FlipParams(no, no), cs, False).permute(0, 2, 3, 1).contiguous()
        return warp(canvas, single, M, p.flips, S, False)

    res["op_warp_two_pass_ms"] = timed(two_pass, batches)
    warped = warp(sb.images, layout, M, p.flips, S, False)
    luts = color.hsv_luts(p.hsv)
    res["op_compose_hsv_ms"] = timed(lambda _: compose(warped, None, None, luts, None), batches)
    res["op_hsv_luts_ms"] = timed(lambda _: color.hsv_luts(p.hsv), batches)
    partner = torch.arange(B, device=dev).roll(1)  # each sample blends with its neighbour's warped row
    mp = mix.sample_mixup(partner, AugmentHyp(imgsz=S, mixup=1.0), g)
    res["op_compose_mixup_hsv_ms"] = timed(lambda _: compose(warped, mp, None, luts, None), batches)

    for name, kw in (("mixup_cutmix", {"mixup": 0.5, "cutmix": 0.5}),
                     ("perspective", {"perspective": 0.0005, "degrees": 10.0, "shear": 2.0}),
                     ("mosaic9", {"mosaic_grid": 9}), ("closed_mosaic", {"mosaic": 0.0})):
        a2 = GpuAugment(AugmentHyp(imgsz=S, **kw))
        res[f"full_{name}_ms"] = timed(lambda b, a2=a2: a2(b, g, PartnerPool(capacity, B)), batches)
        if dev.type == "cuda":
            from yolofeed.augment.graphs import GraphedAugment

            res[f"graphed_{name}_ms"] = timed(GraphedAugment(a2, seed=0, device=dev, pool=PartnerPool(capacity, B)),
                                              batches)

    if dev.type == "cuda":  # what the pipeline allocates beyond its input batch (the pool's ring not included)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = aug(sb, g)
        torch.cuda.synchronize()
        res["peak_extra_mb"] = round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)
        res["output_mb"] = round(out.img.numel() / 2**20, 1)
        res["input_batch_mb"] = round(sb.images.numel() / 2**20, 1)
        res["pool_mb"] = round(pool.nbytes(S) / 2**20, 1)
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", help="Ultralytics data yaml; its training split is packed at --imgsz if needed")
    ap.add_argument("--device", default="cuda", help="cuda (the figures) or cpu (a smoke run)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--iters", type=int, default=60, help="timed calls per figure, after up to 10 warm-up calls")
    a = ap.parse_args(argv)
    res = bench(a.data, a.device, a.batch, a.imgsz, a.iters)
    print(json.dumps(res, indent=1))
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "augment_bench.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

"""Issue 3 on the device machine: GPU augmentation cost per batch, per op, and its memory.

Default Ultralytics hyperparameters, batch 128, imgsz 640, a pack of the synthetic dataset.
Times with CUDA events after warm-up; medians of many batches (each a different set of images).
Also: fused mosaic+warp (one sampling pass) vs two passes (paste a 2s canvas, then warp it), and
configurations with MixUp/CutMix, perspective and the 9-grid. Writes JSON to $OUT/augment_bench.json.

Usage: python3 scripts/device/augment_bench.py DATA_YAML
"""

import json
import os
import statistics
import sys

import torch

sys.path.insert(0, "tests")
from helpers import source_batch  # noqa: E402
from yolofeed.augment import AugmentHyp, GpuAugment, color, geometry, mix  # noqa: E402
from yolofeed.augment.pipeline import compose  # noqa: E402
from yolofeed.augment.warp import warp  # noqa: E402
from yolofeed.pack import open_or_build  # noqa: E402

B, S, ITERS = 128, 640, 60


def timed(fn, batches, iters=ITERS):
    """Median milliseconds of fn(batch) over iters calls, after 10 warm-up calls."""
    for k in range(10):
        fn(batches[k % len(batches)])
    times = []
    for k in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(batches[k % len(batches)])
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return round(statistics.median(times), 3)


def main():
    pack = open_or_build(sys.argv[1], "train", S, rebuild="auto", progress=False)
    g = torch.Generator(device="cuda").manual_seed(0)
    order = torch.randperm(len(pack)).tolist()
    batches = [source_batch(pack, order[k * B:(k + 1) * B], "cuda") for k in range(min(8, len(pack) // B))]
    res = {"device": torch.cuda.get_device_name(), "batch": B, "imgsz": S, "iters": ITERS}

    hyp = AugmentHyp(imgsz=S)
    aug = GpuAugment(hyp)
    res["full_default_ms"] = timed(lambda sb: aug(sb, g), batches)
    res["full_default_plus_to_ultralytics_ms"] = timed(lambda sb: aug(sb, g).to_ultralytics(), batches)
    from yolofeed.augment.graphs import GraphedAugment
    graphed = GraphedAugment(aug, seed=0)
    res["graphed_default_ms"] = timed(graphed, batches)  # includes copying the batch into the graph's inputs
    res["graphed_default_plus_to_ultralytics_ms"] = timed(lambda sb: graphed(sb).to_ultralytics(), batches)
    res["graphs_captured"] = graphed.captured

    # per op, on fixed parameters
    sb = batches[0]
    p = aug.sample(B, g, "cuda")
    layout = geometry.mosaic_layout(p.mosaic, sb.hw, S)
    M, scale = geometry.perspective_matrix(p.perspective, layout.canvas_hw, S)
    res["op_sample_params_ms"] = timed(lambda _: aug.sample(B, g, "cuda"), batches)
    res["op_layout_matrix_ms"] = timed(lambda b: geometry.perspective_matrix(
        p.perspective, geometry.mosaic_layout(p.mosaic, b.hw, S).canvas_hw, S), batches)
    res["op_boxes_ms"] = timed(lambda b: geometry.flip_boxes(geometry.warp_boxes(*geometry.mosaic_boxes(
        layout, b.boxes, b.valid, b.hw), M, scale, S, False)[0], p.flips, S), batches)
    res["op_warp_fused_ms"] = timed(lambda b: warp(b.images, layout, M, p.flips, S, False), batches)
    from yolofeed.augment import warp_triton
    for blk, nw in ((64, 2), (128, 2), (128, 4), (256, 4), (256, 8)):
        res[f"op_warp_fused_block{blk}_warps{nw}_ms"] = timed(
            lambda b: warp_triton.warp(b.images, layout, M, p.flips, S, False, 114, blk, nw), batches)
    # the alternative: paste a 2s canvas (the same kernel with M = identity), then warp the canvas
    ident = torch.eye(3, device="cuda").repeat(B, 1, 1)
    no_flip = geometry.FlipParams(torch.zeros(B, dtype=torch.bool, device="cuda"), torch.zeros(B, dtype=torch.bool, device="cuda"))
    cs = 2 * S
    single = geometry.Layout(torch.arange(B, device="cuda")[:, None],
                             torch.tensor([0, 0, cs, cs], device="cuda").repeat(B, 1, 1),
                             torch.zeros(B, 1, 2, dtype=torch.long, device="cuda"),
                             torch.full((B, 2), cs, device="cuda"), torch.zeros(B, dtype=torch.bool, device="cuda"))

    def two_pass(b):
        canvas = warp(b.images, layout, ident, no_flip, cs, False).permute(0, 2, 3, 1).contiguous()
        return warp(canvas, single, M, p.flips, S, False)

    res["op_warp_two_pass_ms"] = timed(two_pass, batches)
    warped = warp(sb.images, layout, M, p.flips, S, False)
    luts = color.hsv_luts(p.hsv)
    res["op_compose_hsv_ms"] = timed(lambda _: compose(warped, None, None, luts, None), batches)
    res["op_hsv_luts_ms"] = timed(lambda _: color.hsv_luts(p.hsv), batches)
    mp = mix.sample_mixup(B, AugmentHyp(mixup=1.0), g, torch.device("cuda"))
    res["op_compose_mixup_hsv_ms"] = timed(lambda _: compose(warped, mp, None, luts, None), batches)

    for name, kw in (("mixup_cutmix", {"mixup": 0.5, "cutmix": 0.5}), ("perspective", {"perspective": 0.0005,
                     "degrees": 10.0, "shear": 2.0}), ("mosaic9", {"mosaic_grid": 9}), ("closed_mosaic", {"mosaic": 0.0})):
        a2 = GpuAugment(AugmentHyp(imgsz=S, **kw))
        res[f"full_{name}_ms"] = timed(lambda b: a2(b, g), batches)
        g2 = GraphedAugment(a2, seed=0)
        res[f"graphed_{name}_ms"] = timed(g2, batches)

    # memory: what the pipeline allocates beyond its input batch and output
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = aug(sb, g)
    torch.cuda.synchronize()
    res["peak_extra_mb"] = round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)
    res["output_mb"] = round(out.img.numel() / 2**20, 1)
    res["input_batch_mb"] = round(sb.images.numel() / 2**20, 1)
    print(json.dumps(res, indent=1))
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "augment_bench.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

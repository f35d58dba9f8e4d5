"""Where the segment task's GPU augmentation spends its time, per batch: the polygons through the ops, then the masks.

On a segment pack of DATA_YAML's training split, Ultralytics' default hyperparameters, batch B at imgsz S. Prints,
and writes to ``$OUT/seg_profile.json``:

* the shapes that set the cost: the loader's label width L and polygon width P, the augmented batch's slots K and
  points W, and how many of the B x K slots hold an instance;
* CUDA-event medians of the augmentation replayed as a CUDA graph: without masks, with masks of every padded slot,
  and with masks of ``mask_capacity``'s bound (the trainer's);
* with partners from a full ``PartnerPool`` of Ultralytics' size, as the trainer draws them: the batch's push and
  the graph's replay, without and with masks; and the ops on the ring (graphed, no masks, the same draws) reading its
  polygons resampled as each row entered it (the pool's way) against resampling every row of the ring;
* the masks alone (``with_masks``, eager and graphed) over every padded slot, and ``fill_polygons`` over the valid
  slots only, packed to the front, in chunks of 128, 256 and 512 polygons;
* with ``--copy-paste P``: the augmentation with masks of the trainer's bound and copy-paste at P (flip mode),
  graphed, and its instances;
* the 25 CUDA kernels that take the most time in one eager masked call (``torch.profiler``; with copy-paste where
  ``--copy-paste`` is given).

Usage: python -m tools.device.seg_profile DATA_YAML [--batch 128] [--imgsz 640] [--iters 20] [--copy-paste P]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

import torch

from yolofeed.augment import AugmentHyp, GpuAugment
from yolofeed.augment.graphs import GraphedAugment
from yolofeed.augment.masks import MaskedAugment, mask_capacity, with_masks
from yolofeed.augment.pool import PartnerPool, ultralytics_capacity
from yolofeed.kernels.polyfill import fill_polygons
from yolofeed.loader import TrainLoader
from yolofeed.pack import open_or_build


def median_ms(fn, iters: int) -> float:
    """Median CUDA-event milliseconds of ``fn()`` after 3 warm-up calls (wall clock without CUDA: a smoke run)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        if not torch.cuda.is_available():
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return round(statistics.median(times), 2)


def graphed(fn):
    """``fn`` captured into one CUDA graph: its replay (``fn`` itself without CUDA)."""
    if not torch.cuda.is_available():
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def pool_ring(source, hyp: AugmentHyp, labels: tuple, capacity: int, iters: int, g: torch.Generator) -> dict:
    """The augmentation with partners from a full pool of ``capacity`` images (``source`` pushed until it is full),
    as the trainer runs it; and the ops on its ring with the pool's resampled polygons against resampling them all."""
    n, dev, res = len(source.valid), source.images.device, {"pool_rows": 0}
    for name, aug in (("plain", GpuAugment(hyp)), ("masked", MaskedAugment(hyp, labels=labels))):
        pool = PartnerPool(capacity, n + 1)
        run = GraphedAugment(aug, seed=1, pool=pool) if dev.type == "cuda" else (lambda s, a=aug, p=pool: a(s, g, p))
        for _ in range(-(-pool.rows // n)):  # fill the ring
            run(source)
        res["pool_rows"] = pool.rows
        res[f"graphed_pool_{name}_ms"] = median_ms(lambda run=run: run(source), iters)
    ring = pool.sources
    aug = GpuAugment(hyp)
    params = aug.sample(n, g, dev, pool.partners(pool.loaded - n, n))
    # the ring with its rows' polygons as stored (it keeps them resampled only): row r holds the source row pushed
    # there last, load position r + rows * k below ``loaded``
    rows = torch.arange(pool.rows)
    held = (rows + pool.rows * ((pool.loaded - 1 - rows) // pool.rows)) % n
    slots = ring.valid.shape[1] - source.valid.shape[1]
    every_row = dataclasses.replace(
        ring, resampled_polygons=None, resampled_points=None,
        polygons=torch.nn.functional.pad(source.polygons[held.to(dev)], (0, 0, 0, 0, 0, slots)),
        polygon_lengths=torch.nn.functional.pad(source.polygon_lengths[held.to(dev)], (0, slots)))
    assert torch.equal(every_row.valid, torch.nn.functional.pad(source.valid[held.to(dev)], (0, slots)))
    res["graphed_ops_on_ring_resampled_ahead_ms"] = median_ms(graphed(lambda: aug.apply(ring, params)), iters)
    res["graphed_ops_on_ring_resampling_every_row_ms"] = median_ms(graphed(lambda: aug.apply(every_row, params)),
                                                                   iters)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--copy-paste", type=float, default=0.0)
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    pack = open_or_build(a.data, "train", a.imgsz, rebuild="auto", progress=False, task="segment")
    loader = TrainLoader(pack, a.batch, dev, seed=0, sync=True)
    source = next(iter(loader))["source"]
    source = type(source)(*(None if t is None else t.clone() for t in (
        source.images, source.hw, source.cls, source.boxes, source.valid, source.keypoints, source.corners,
        source.polygons, source.polygon_lengths)))
    loader.close()
    hyp = AugmentHyp(imgsz=a.imgsz)
    res: dict = {"batch": a.batch, "imgsz": a.imgsz, "L": source.valid.shape[1], "P": source.polygons.shape[2],
                 "source_instances_per_image": round(source.valid.sum().item() / a.batch, 2)}

    g = torch.Generator(device=dev).manual_seed(0)
    plain = GpuAugment(hyp)
    out = plain(source, g)
    b, k, w, _ = out.segments.shape
    res.update(K=k, W=w, valid_slots=int(out.valid.sum()), slots=b * k)
    print(json.dumps(res), flush=True)

    counts = pack.index["label_count"].astype("float64")
    labels = (float(counts.mean()), float(counts.std()), float(counts.max()))
    res["capacity"] = mask_capacity(b, k // source.valid.shape[1], *labels)

    def graph_of(aug):
        return GraphedAugment(aug, seed=1) if dev.type == "cuda" else (lambda s: aug(s, g))

    gp, gm, gc = graph_of(plain), graph_of(MaskedAugment(hyp)), graph_of(MaskedAugment(hyp, labels=labels))
    res["graphed_plain_ms"] = median_ms(lambda: gp(source), a.iters)
    res["graphed_masked_every_slot_ms"] = median_ms(lambda: gm(source), a.iters)
    res["graphed_masked_ms"] = median_ms(lambda: gc(source), a.iters)
    res["eager_plain_ms"] = median_ms(lambda: plain(source, g), max(3, a.iters // 4))
    res["eager_masks_only_ms"] = median_ms(lambda: with_masks(out, 4, True), max(3, a.iters // 4))
    res["graphed_masks_only_ms"] = median_ms(graphed(lambda: with_masks(out, 4, True)), a.iters)
    res.update(pool_ring(source, hyp, labels, ultralytics_capacity(len(pack), a.batch), a.iters, g))
    print(json.dumps(res), flush=True)
    hyp_cp = dataclasses.replace(hyp, copy_paste=a.copy_paste)
    if a.copy_paste > 0:
        cp = MaskedAugment(hyp_cp, labels=labels)
        gcp = graph_of(cp)
        res["copy_paste"] = a.copy_paste
        res["copy_paste_valid_slots"] = int(cp(source, g).valid.sum())
        res["graphed_masked_copy_paste_ms"] = median_ms(lambda: gcp(source), a.iters)
    print(json.dumps(res), flush=True)

    # the valid slots only, packed to the front: what rasterising the instances alone would cost
    segs = out.segments[out.valid].contiguous()
    ones = torch.ones(len(segs), dtype=torch.bool, device=dev)
    res["graphed_fill_valid_only_ms"] = median_ms(graphed(lambda: fill_polygons(segs, ones, a.imgsz, a.imgsz, 4)),
                                                  a.iters)
    allsegs, allvalid = out.segments.reshape(b * k, w, 2), out.valid.reshape(-1)
    res["graphed_fill_all_slots_ms"] = median_ms(
        graphed(lambda: fill_polygons(allsegs, allvalid, a.imgsz, a.imgsz, 4)), a.iters)
    for chunk in (256, 512):
        res[f"graphed_fill_valid_only_chunk{chunk}_ms"] = median_ms(
            graphed(lambda chunk=chunk: fill_polygons(segs, ones, a.imgsz, a.imgsz, 4, chunk=chunk)), a.iters)
    print(json.dumps(res), flush=True)

    masked = MaskedAugment(hyp_cp, labels=labels) if a.copy_paste > 0 else MaskedAugment(hyp)
    cuda = dev.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + [torch.profiler.ProfilerActivity.CUDA] * cuda
    with torch.profiler.profile(activities=activities) as prof:
        masked(source, g)
        if cuda:
            torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=25,
                                      max_name_column_width=60)
    print(table)
    os.makedirs(os.environ.get("OUT", "/tmp/out"), exist_ok=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp/out"), "seg_profile.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(os.environ.get("OUT", "/tmp/out"), "seg_profile.txt"), "w") as f:
        f.write(table)


if __name__ == "__main__":
    main()

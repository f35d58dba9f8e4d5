"""The augmentation of a detection batch on polygon labels, with and without the perspective's bound on the polygons
it moves (``GpuAugment(polygon_capacity=)``, the trainer's ``mask_capacity`` of the labels), and where its time goes.

On the detection pack of DATA_YAML's training split (it keeps the polygons where every label row is one), Ultralytics'
default hyperparameters, batch B at imgsz S, partners from a full ``PartnerPool`` of Ultralytics' size, as the trainer
draws them. Prints, and writes to ``$OUT/polygon_bound.json``:

* the shapes: slots (rows x label slots), the valid slots entering the perspective, the bound, the valid slots after;
* CUDA-event medians of the augmentation replayed as a CUDA graph (push and replay), every slot against the bound,
  in turns (``--turns``), and the boxes alone (the polygons dropped) for scale;
* the 25 CUDA kernels that take the most time in one eager bounded call (``torch.profiler``).

Usage: python -m tools.device.polygon_bound DATA_YAML [--batch 128] [--imgsz 640] [--iters 20] [--turns 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import torch

from tools.device.seg_profile import median_ms
from yolofeed.augment import AugmentHyp, GpuAugment
from yolofeed.augment.graphs import GraphedAugment
from yolofeed.augment.masks import mask_capacity
from yolofeed.augment.pool import PartnerPool, ultralytics_capacity
from yolofeed.loader import TrainLoader
from yolofeed.pack import open_or_build


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--turns", type=int, default=3)
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    pack = open_or_build(a.data, "train", a.imgsz, rebuild="auto", progress=False)
    if pack.polygon_lengths is None:
        raise SystemExit(f"{a.data}: its detection pack keeps no polygons (a split of polygon rows only keeps them)")
    loader = TrainLoader(pack, a.batch, dev, seed=0, sync=True)
    source = next(iter(loader))["source"]
    source = dataclasses.replace(source, **{f.name: getattr(source, f.name).clone() for f in
                                            dataclasses.fields(source) if isinstance(getattr(source, f.name),
                                                                                     torch.Tensor)})
    loader.close()
    hyp = AugmentHyp(imgsz=a.imgsz)
    counts = pack.index["label_count"].astype("float64")
    bound = mask_capacity(a.batch, 4, float(counts.mean()), float(counts.std()), float(counts.max()))
    res: dict = {"batch": a.batch, "imgsz": a.imgsz, "L": source.valid.shape[1], "P": source.polygons.shape[2],
                 "labels_mean_std_most": [round(float(counts.mean()), 2), round(float(counts.std()), 2),
                                          int(counts.max())], "bound": bound}
    g = torch.Generator(device=dev).manual_seed(0)
    aug = GpuAugment(hyp, polygon_capacity=0)  # past = the valid slots entering the perspective
    out = aug(source, g)
    res.update(slots=out.valid.numel(), valid_in=int(out.polygons_past),
               valid_out=int(GpuAugment(hyp)(source, g).valid.sum()))
    print(json.dumps(res), flush=True)

    capacity = ultralytics_capacity(len(pack), a.batch)
    runs = {}
    for name, made in (("every_slot", GpuAugment(hyp)), ("bounded", GpuAugment(hyp, polygon_capacity=bound))):
        pool = PartnerPool(capacity, a.batch + 1)
        run = (GraphedAugment(made, seed=1, pool=pool) if dev.type == "cuda"
               else (lambda s, m=made, p=pool: m(s, g, p)))
        for _ in range(-(-pool.rows // a.batch)):  # fill the ring
            run(source)
        runs[name] = run
    boxes = dataclasses.replace(source, polygons=None, polygon_lengths=None)
    pool = PartnerPool(capacity, a.batch + 1)
    plain = GraphedAugment(GpuAugment(hyp), seed=1, pool=pool) if dev.type == "cuda" else (
        lambda s: GpuAugment(hyp)(s, g, pool))
    for _ in range(-(-pool.rows // a.batch)):
        plain(boxes)
    for _ in range(a.turns):  # in turns: the GPU's clock shared
        for name, run in runs.items():
            res.setdefault(f"graphed_pool_{name}_ms", []).append(median_ms(lambda run=run: run(source), a.iters))
        res.setdefault("graphed_pool_boxes_only_ms", []).append(median_ms(lambda: plain(boxes), a.iters))
    print(json.dumps(res), flush=True)

    bounded = GpuAugment(hyp, polygon_capacity=bound)
    cuda = dev.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + [torch.profiler.ProfilerActivity.CUDA] * cuda
    bounded(source, g)
    with torch.profiler.profile(activities=activities) as prof:
        bounded(source, g)
        if cuda:
            torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=25,
                                      max_name_column_width=60)
    print(table)
    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "polygon_bound.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

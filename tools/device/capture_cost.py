"""What the augmentation's one-off costs are, call by call, as the first epoch of a training meets them.

Pure torch (no Ultralytics, no dataset): random source batches on the device, the augmentation as training runs
it (``GraphedAugment`` with a ``PartnerPool``), Ultralytics' default hyperparameters. Each call's wall time,
synchronised, in the order an epoch makes them: the first batch (Triton compiles, warm-up, capture), steady
replays, the epoch's short last batch (a new shape: a new capture), again, and a batch of B + 1 (a DDP rank's
last). Then a second ``GraphedAugment`` in the same process: a capture without compiles. Writes
``$OUT/capture_cost.json`` after every step, so a cut run still reports what it measured.

Usage: python tools/device/capture_cost.py [--batch 128] [--imgsz 640] [--last 16] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))  # runs without installing yolofeed

from yolofeed.augment import AugmentHyp, GpuAugment, SourceBatch  # noqa: E402
from yolofeed.augment.pool import PartnerPool, ultralytics_capacity  # noqa: E402


def random_batch(n: int, side: int, width: int, device: torch.device, seed: int) -> SourceBatch:
    """``n`` random images of random sizes (longest side ``side``) with up to ``width`` random boxes each."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, side, side, 3), generator=g, dtype=torch.uint8)
    short = torch.randint(side // 2, side + 1, (n,), generator=g)
    hw = torch.stack([short, torch.full((n,), side)], 1)
    valid = torch.arange(width)[None] < torch.randint(1, width + 1, (n, 1), generator=g)
    xy = torch.rand(n, width, 2, generator=g) * 0.6 + 0.2
    wh = torch.rand(n, width, 2, generator=g) * 0.2 + 0.02
    cls = torch.randint(0, 80, (n, width), generator=g).float()
    batch = SourceBatch(images, hw, cls, torch.cat([xy, wh], -1), valid)
    return SourceBatch(*(t.to(device) for t in (batch.images, batch.hw, batch.cls, batch.boxes, batch.valid)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--last", type=int, default=16, help="the epoch's last batch (10,000 images at 128: 16)")
    ap.add_argument("--width", type=int, default=32, help="label slots per image (the pack's most labels)")
    ap.add_argument("--steady", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    dev = torch.device(a.device)
    out_file = Path(os.environ.get("OUT", "/tmp")) / "capture_cost.json"
    report: dict = {"batch": a.batch, "imgsz": a.imgsz, "last": a.last, "width": a.width, "device": str(dev),
                    "torch": torch.__version__, "calls_ms": []}
    if dev.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(dev)

    def save() -> None:
        out_file.write_text(json.dumps(report, indent=1))

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    t0 = time.perf_counter()
    batches = {n: random_batch(n, a.imgsz, a.width, dev, seed=n) for n in {a.batch, a.last, a.batch + 1}}
    sync()
    report["make_batches_s"] = round(time.perf_counter() - t0, 3)
    save()

    def augmenter(seed: int):
        aug = GpuAugment(AugmentHyp(imgsz=a.imgsz))
        pool = PartnerPool(ultralytics_capacity(10_000, a.batch), a.batch + 1)
        if dev.type == "cuda":
            from yolofeed.augment.graphs import GraphedAugment

            return GraphedAugment(aug, seed=seed, device=dev, pool=pool)
        gen = torch.Generator(device=dev).manual_seed(seed)
        return lambda b: aug(b, gen, pool)

    def timed(label: str, fn, batch: SourceBatch) -> float:
        sync()
        t = time.perf_counter()
        fn(batch)
        sync()
        ms = (time.perf_counter() - t) * 1e3
        report["calls_ms"].append([label, round(ms, 2)])
        save()
        return ms

    run = augmenter(0)
    timed("first batch (compiles, warm-up, capture)", run, batches[a.batch])
    steady = [timed("steady", run, batches[a.batch]) for _ in range(a.steady)]
    report["steady_median_ms"] = round(statistics.median(steady), 2)
    timed(f"last batch of {a.last}, first time", run, batches[a.last])
    timed(f"last batch of {a.last}, again", run, batches[a.last])
    timed("full batch after it", run, batches[a.batch])
    timed(f"batch of {a.batch + 1}, first time", run, batches[a.batch + 1])
    fresh = augmenter(1)
    timed("second augmenter, first batch (capture, no compiles)", fresh, batches[a.batch])
    timed(f"second augmenter, batch of {a.last}", fresh, batches[a.last])
    if dev.type == "cuda":
        report["peak_memory_gb"] = round(torch.cuda.max_memory_allocated(dev) / 1e9, 2)
    report["total_s"] = round(time.perf_counter() - t0, 2)
    save()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

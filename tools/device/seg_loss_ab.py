"""The segment loss alone, forward and backward: Ultralytics' ``v8SegmentationLoss`` against yolofeed's
``SyncFreeSegmentLoss`` (its mask loss batched over the images), side by side on the same batch and predictions.

One augmented batch of DATA_YAML's segment pack (Ultralytics' default hyperparameters, its masks as the trainer makes
them), yolo11n-seg's training predictions for it under autocast (detached: only the loss is timed), then in turns the
loss and its backward pass on each side, the host waiting for the GPU at the end of each: wall milliseconds (median),
the losses (which must agree to float32 rounding), and the foreground rows. Prints, and writes
``$OUT/seg_loss_ab.json``.

Usage: python -m tools.device.seg_loss_ab DATA_YAML [--model yolo11n-seg.yaml] [--batch 128] [--imgsz 640]
       [--iters 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def wall_ms(fn, iters: int) -> float:
    """Median wall milliseconds of ``fn()`` to the GPU's end, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - t0))
    return round(statistics.median(times), 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--model", default="yolo11n-seg.yaml")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import SegmentationModel

    from yolofeed.augment import AugmentHyp
    from yolofeed.augment.masks import MaskedAugment
    from yolofeed.loader import TrainLoader
    from yolofeed.pack import open_or_build
    from yolofeed.train import loss as sfl

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    pack = open_or_build(a.data, "train", a.imgsz, rebuild="auto", progress=False, task="segment")
    loader = TrainLoader(pack, a.batch, dev, seed=0, sync=True)
    try:
        source = next(iter(loader))["source"]
    finally:
        loader.close()
    counts = pack.index["label_count"].astype("float64")
    aug = MaskedAugment(AugmentHyp(imgsz=a.imgsz), labels=(counts.mean(), counts.std(), counts.max()))
    out = aug(source, torch.Generator(device=dev).manual_seed(0))
    batch = {k: v for k, v in out.to_ultralytics().items() if isinstance(v, torch.Tensor)}
    batch["img"] = batch["img"].float() / 255

    torch.manual_seed(0)
    model = SegmentationModel(a.model, nc=len(pack.header.get("names", {})) or 80, verbose=False).to(dev).train()
    model.args = get_cfg()
    with torch.autocast(dev.type, enabled=dev.type == "cuda"):
        preds = model(batch["img"])
    preds = {k: v.detach().requires_grad_() if isinstance(v, torch.Tensor) else v for k, v in preds.items()}
    stock = model.init_criterion()
    model.criterion = model.init_criterion()
    (ours,) = sfl.install(model)
    ours.loss(preds, {**batch, sfl.MAX_BOXES: int(out.valid.sum(1).max())})  # caches the anchors
    given = {**batch, sfl.MAX_BOXES: int(out.valid.sum(1).max()),
             sfl.CANDIDATES: sfl.early_candidates_for(ours, out)}

    def step(loss, b):
        def run():
            with torch.autocast(dev.type, enabled=dev.type == "cuda"):
                total, items = loss.loss(preds, b)
            total.sum().backward()
            return items
        return run

    res = {"batch": a.batch, "imgsz": a.imgsz, "instances": int(out.valid.sum())}
    want, got = step(stock, batch)(), step(ours, given)()
    res["stock_items"] = {k: round(float(v), 6) for k, v in want.items()}
    res["yolofeed_items"] = {k: round(float(v), 6) for k, v in got.items()}
    key = next(k for k in want if "seg" in k)
    res["mask_loss_relative_difference"] = float((got[key] - want[key]).abs() / want[key].abs().clamp(min=1e-12))
    for _ in range(2):  # in turns: neither side gets a warmer GPU
        res.setdefault("stock_ms", []).append(wall_ms(step(stock, batch), a.iters))
        res.setdefault("yolofeed_ms", []).append(wall_ms(step(ours, given), a.iters))
    print(json.dumps(res), flush=True)
    os.makedirs(os.environ.get("OUT", "/tmp/out"), exist_ok=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp/out"), "seg_loss_ab.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

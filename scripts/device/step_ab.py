"""Side by side (issue 4): Ultralytics' step against yolofeed's sync-free step (train/step.py), same process.

Usage: python3 scripts/device/step_ab.py DATA_YAML MODEL VARIANT[,VARIANT...]
    VARIANT: ceiling or yolofeed, alone or with _stock_step (Ultralytics' step), _sync_free_loss or _stock_loss
    (Ultralytics' loss; the sync-free one is the default since 2026-11-30).
    Batch 128, imgsz 640, 100 steps after a 30-step warm-up (the bench's settings; AB_BATCH, AB_IMGSZ,
    AB_STEPS change them for a CPU smoke run). Prints one line per variant; writes $OUT/step_ab_<model>.json.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import yolofeed.doctor.profile as prof


def trainer_class(variant: str):
    """``<mode>``, ``<mode>_stock_step`` (Ultralytics' step), ``<mode>_sync_free_loss`` (train/loss.py on) or
    ``<mode>_stock_loss`` (off)."""
    for suffix, options in (("_stock_step", {"sync_free_step": False}), ("_sync_free_loss", {"sync_free_loss": True}),
                            ("_stock_loss", {"sync_free_loss": False})):
        if variant.endswith(suffix):
            cls = prof.TRAINER_CLASS(variant.removesuffix(suffix))
            return type(cls.__name__, (cls,), options)
    return prof.TRAINER_CLASS(variant)


def main() -> None:
    data, model, variants = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    prof.TRAINER_CLASS, prof.trainer_class = prof.trainer_class, trainer_class
    out, rows = os.environ.get("OUT", "/tmp"), []
    with tempfile.TemporaryDirectory() as tmp:
        for v in variants:
            args = {"model": model, "data": data, "imgsz": int(os.environ.get("AB_IMGSZ", 640)),
                    "batch": int(os.environ.get("AB_BATCH", 128)), "workers": 16, "project": tmp}
            p = prof.profile(v, args, steps=int(os.environ.get("AB_STEPS", 100)), warmup=30)
            rows.append({"variant": v, "images_per_s": p.images_per_s, "gpu_util": p.gpu_util,
                         "step_ms": p.step_ms, "optimizer": p.optimizer, "phases_ms": p.phases_ms,
                         "own_cores_busy": p.own_cores_busy})
            print(f"STEP_AB {model} {v:<22} {p.images_per_s:8.0f} img/s  GPU {p.gpu_util or 0:5.1f} %  "
                  f"step {p.step_ms:6.1f} ms  {p.optimizer}  {p.phases_ms}", flush=True)
    with open(os.path.join(out, f"step_ab_{model.removesuffix('.yaml')}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

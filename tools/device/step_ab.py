"""Training variants side by side in one process: Ultralytics' step or loss against yolofeed's sync-free ones.

Usage: python -m tools.device.step_ab DATA_YAML MODEL VARIANT[,VARIANT...] [--batch 128] [--imgsz 640] [--steps 100]

VARIANT: a ``yolofeed bench`` mode (``ceiling``, ``yolofeed``, ...), alone or with a suffix: ``_stock_step``
(Ultralytics' optimiser step, which reads the loss items on the host after the backward pass), ``_stock_loss``
(Ultralytics' detection loss, 16 host syncs a step) or ``_sync_free_loss`` (yolofeed's, the default); then
optionally ``_unstaged`` (a jpeg pack's files handed to nvJPEG as fresh pageable copies, not staged in one
pinned buffer).
Each variant runs in turn, ``--steps`` measured steps after a 30-step warm-up (the bench's settings): one line
each, and ``$OUT/step_ab_<model>.json``. Run the variants in both orders to see the drift between runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import tempfile

from yolofeed.bench.modes import trainer_class as mode_class
from yolofeed.monitor.profile import profile

SUFFIXES = {"_stock_step": {"sync_free_step": False}, "_stock_loss": {"sync_free_loss": False},
            "_sync_free_loss": {"sync_free_loss": True}}
# Suffixes that change yolofeed's code for the variant, not an option: (class, attribute, replacement).
# _unstaged: a jpeg pack's loader hands nvJPEG one fresh pageable copy of each file, not views of one pinned buffer.
PATCHES = {"_unstaged": ("yolofeed.pack.codecs.jpeg:Jpeg", "staging_bytes", lambda self, pack, batch: 0)}


def trainer_class(variant: str) -> type:
    """The trainer class of ``variant``: a bench mode, with the options its suffix names as class attributes."""
    variant = next((variant.removesuffix(s) for s in PATCHES if variant.endswith(s)), variant)
    for suffix, options in SUFFIXES.items():
        if variant.endswith(suffix):
            cls = mode_class(variant.removesuffix(suffix))
            return type(cls.__name__, (cls,), options)
    return mode_class(variant)


@contextlib.contextmanager
def patched(variant: str):
    """The code change ``variant``'s suffix names (``PATCHES``), undone on leaving."""
    suffix = next((s for s in PATCHES if variant.endswith(s)), None)
    if suffix is None:
        yield
        return
    where, attr, value = PATCHES[suffix]
    module, name = where.split(":")
    owner = getattr(importlib.import_module(module), name)
    old = getattr(owner, attr)
    setattr(owner, attr, value)
    try:
        yield
    finally:
        setattr(owner, attr, old)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("model", help="e.g. yolo11n.yaml")
    ap.add_argument("variants", help="comma-separated, e.g. yolofeed_stock_step,yolofeed")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=30)
    a = ap.parse_args(argv)
    variants = a.variants.split(",")
    for v in variants:
        trainer_class(v)  # an unknown variant stops here, before any training
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for v in variants:
            args = {"model": a.model, "data": a.data, "imgsz": a.imgsz, "batch": a.batch, "workers": 16,
                    "project": tmp}
            with patched(v):
                p = profile(v, trainer_class(v), args, steps=a.steps, warmup=a.warmup)
            rows.append({"variant": v, "images_per_s": p.images_per_s, "gpu_util": p.gpu_util,
                         "step_ms": p.step_ms, "optimizer": p.optimizer, "phases_ms": p.phases_ms,
                         "own_cores_busy": p.own_cores_busy})
            print(f"STEP_AB {a.model} {v:<22} {p.images_per_s:8.0f} img/s  GPU {p.gpu_util or 0:5.1f} %  "
                  f"step {p.step_ms:6.1f} ms  {p.optimizer}  {p.phases_ms}", flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), f"step_ab_{a.model.removesuffix('.yaml')}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""``yolofeed pack``: build or check the packs of every requested split, and print what each build did."""

from __future__ import annotations

import dataclasses
import logging

from yolofeed.config import PackConfig
from yolofeed.errors import ConfigError
from yolofeed.pack.rebuild import check_splits, ensure_split
from yolofeed.pack.source import load_data_yaml
from yolofeed.pack.summary import BuildResult, summary
from yolofeed.ultralytics_seam import train_side

LOGGER = logging.getLogger(__name__)


def run(cfg: PackConfig) -> list[BuildResult]:
    """``yolofeed pack``: build or check the packs of every requested split and print a summary."""
    splits = list(dict.fromkeys(s.strip() for s in cfg.splits.split(",") if s.strip()))
    if not splits:
        raise ConfigError(f"splits={cfg.splits}: names no split; list the data yaml's splits to pack, comma-separated, "
                          "e.g. splits=train,val")
    side, p6 = train_side(cfg.imgsz), train_side(cfg.imgsz, 64)
    if side != cfg.imgsz:  # yolo train rounds it so (check_imgsz): a pack at the size given would never be opened
        LOGGER.warning(f"pack: imgsz={cfg.imgsz} is not a multiple of 32, the models' stride: yolo train and yolofeed "
                       f"train round it up to {side}, so the packs are built for imgsz={side}"
                       + (f" (a P6 model, stride 64, trains at {p6})" if p6 != side else ""))
        cfg = dataclasses.replace(cfg, imgsz=side)
    d = load_data_yaml(cfg.data)
    if cfg.rebuild != "never":  # every pack to build must fit, together, before the first is written
        check_splits(d, splits, cfg.imgsz, cfg.format, cfg.out, cfg.rebuild, cfg.task)
    results = []
    for split in splits:
        r = ensure_split(d, split, cfg.imgsz, cfg.format, cfg.out, cfg.rebuild, cfg.workers, sync=cfg.sync,
                         verify=cfg.verify, task=cfg.task)
        print(summary(r), flush=True)
        results.append(r)
    return results

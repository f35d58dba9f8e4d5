"""``yolofeed train``: ``YOLO(model).train(trainer=FastDetectionTrainer, ...)`` with a speed summary."""

from __future__ import annotations

import json
import time
from pathlib import Path

from yolofeed.config import TrainConfig
from yolofeed.errors import ConfigError


SPEED_FILE = "yolofeed_speed.json"  # in the run folder: how a DDP launch's rank 0 reports back to the launcher


class _Throughput:
    """Training images per second over the training steps only (validation and saving excluded).

    Counts the whole job's images (``trainer.batch_size`` is the batch across all GPUs under DDP).
    Under DDP these callbacks run in the worker processes Ultralytics launches, not in ours: rank 0
    writes the figures to ``SPEED_FILE`` at the end, and the launcher reads them from there.
    """

    def __init__(self):
        self.images, self.seconds, self._t0 = 0, 0.0, None

    def epoch_start(self, trainer) -> None:
        self._t0 = time.perf_counter()

    def batch_end(self, trainer) -> None:
        self.images += trainer.batch_size

    def epoch_end(self, trainer) -> None:
        if self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0

    def train_end(self, trainer) -> None:
        (Path(trainer.save_dir) / SPEED_FILE).write_text(json.dumps({"images": self.images, "seconds": self.seconds}))

    def load(self, save_dir: Path) -> None:
        """Take the figures a DDP rank 0 wrote, when this process trained nothing itself."""
        f = Path(save_dir) / SPEED_FILE
        if not self.images and f.is_file():
            d = json.loads(f.read_text())
            self.images, self.seconds = d["images"], d["seconds"]

    @property
    def rate(self) -> float:
        return self.images / self.seconds if self.seconds else 0.0


def run(cfg: TrainConfig) -> Path:
    """Train; returns the path of the best weights."""
    from ultralytics import YOLO

    from yolofeed.train.trainer import FastDetectionTrainer

    reserved = {"trainer", "model"} & set(cfg.extra)
    if reserved:
        raise ConfigError(f"{', '.join(sorted(reserved))}= cannot be passed here: yolofeed train sets the trainer")
    trainer = FastDetectionTrainer.with_options(pack_format=cfg.pack_format, pack_rebuild=cfg.pack_rebuild,
                                                pack_dir=cfg.pack_dir)
    if cfg.resume:
        if not Path(cfg.resume).is_file():
            raise ConfigError(f"resume={cfg.resume}: no such checkpoint; point it at a run's weights/last.pt")
        model, kwargs = YOLO(cfg.resume), {"resume": True}
    else:
        if not cfg.data:
            raise ConfigError("yolofeed train needs data=path/to/data.yaml (or resume=.../last.pt)")
        model, kwargs = YOLO(cfg.model), {"data": cfg.data, **cfg.extra}
    from yolofeed.monitor.live import attach, options_from

    monitor = options_from(cfg)
    if monitor is not None:
        attach(model, **monitor)
    speed = _Throughput()
    model.add_callback("on_train_epoch_start", speed.epoch_start)
    model.add_callback("on_train_batch_end", speed.batch_end)
    model.add_callback("on_train_epoch_end", speed.epoch_end)
    model.add_callback("on_train_end", speed.train_end)
    model.train(trainer=trainer, **kwargs)
    tr = model.trainer
    speed.load(tr.save_dir)
    best = tr.best if tr.best.exists() else tr.last
    gpus = f"{tr.world_size} GPUs" if tr.world_size > 1 else str(tr.device)
    print(f"yolofeed train: {speed.images:,} images in {speed.seconds:.1f} s of training steps "
          f"({speed.rate:,.0f} img/s on {gpus}); weights: {best}", flush=True)
    return best

"""``yolofeed train``: ``YOLO(model).train(trainer=FastDetectionTrainer, ...)`` with a speed summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from yolofeed.config import TrainConfig, fields_of
from yolofeed.errors import ConfigError
from yolofeed.train import keys


def resume_checkpoint(cfg: TrainConfig) -> str | None:
    """The checkpoint to continue from, read as ``yolo train`` reads ``resume``; None to start a new run.

    ``resume=path/to/last.pt``, or ``resume=True`` (a bare ``resume`` on the command line) with
    ``model=path/to/last.pt``; ``resume=False`` starts a new run.

    Raises:
        ConfigError: resume=True without model=, or no file at the checkpoint's path.
    """
    value = cfg.resume
    if value is None or str(value).lower() == "false":
        return None
    path = cfg.model if str(value).lower() == "true" else value
    if not path:
        raise ConfigError("resume needs the checkpoint to continue: resume=path/to/last.pt, or "
                          "model=path/to/last.pt resume")
    if not Path(path).is_file():
        raise ConfigError(f"resume: no checkpoint at {path}; point at a run's weights/last.pt")
    return str(path)


def load_model(name: str) -> Any:
    """``YOLO(name)``, with a missing file reported in one line.

    Raises:
        ConfigError: neither a file nor a model Ultralytics knows by name.
    """
    from yolofeed.ultralytics_seam import YOLO

    try:
        return YOLO(name)
    except FileNotFoundError:
        raise ConfigError(f"model={name}: no such file, and not a model Ultralytics knows by name. Pass the path of "
                          "a model .yaml or .pt, or a name such as model=yolo11n.yaml") from None
    except ConnectionError:  # Ultralytics' weights by name (yolo11n.pt) are downloaded on first use
        raise ConfigError(f"model={name}: not on this machine, and its download failed (offline?). Download it once "
                          "with network access, pass the path of a local .pt, or train from scratch with a yaml "
                          "such as model=yolo11n.yaml") from None


def run(cfg: TrainConfig) -> Path:
    """Train; returns the path of the best weights."""
    from yolofeed.train.trainer import FastDetectionTrainer

    reserved = {"trainer", "model"} & set(cfg.extra)
    if reserved:
        raise ConfigError(f"{', '.join(sorted(reserved))}= cannot be passed here: yolofeed train sets the trainer")
    keys.check_overrides(cfg.extra, own=[f.name for f in fields_of(TrainConfig)])
    if cfg.pack_dir and Path(cfg.pack_dir).exists() and not Path(cfg.pack_dir).is_dir():
        raise ConfigError(f"pack_dir={cfg.pack_dir} is a file; pack_dir= names the folder packs go to (made if "
                          "missing)")
    trainer = FastDetectionTrainer.with_options(pack_format=cfg.pack_format, pack_rebuild=cfg.pack_rebuild,
                                                pack_dir=cfg.pack_dir, partner_pool=cfg.partner_pool)
    checkpoint = resume_checkpoint(cfg)
    if checkpoint:
        model = load_model(checkpoint)
        if model.ckpt.get("epoch", -1) < 0 or model.ckpt.get("optimizer") is None:
            raise ConfigError(f"{checkpoint} is the checkpoint of a finished run (no epoch or optimizer state left): "
                              f"nothing to resume. Start a new run from it with model={checkpoint} and no resume")
        kwargs = {**cfg.extra, "resume": checkpoint, **({"data": cfg.data} if cfg.data else {})}
    else:
        if not cfg.model:
            raise ConfigError("yolofeed train needs model=... (a model yaml such as yolo11n.yaml, or weights), or "
                              "resume=.../last.pt")
        if not cfg.data:
            raise ConfigError("yolofeed train needs data=path/to/data.yaml (or resume=.../last.pt)")
        model, kwargs = load_model(cfg.model), {"data": cfg.data, **cfg.extra}
    from yolofeed.monitor.live import attach, options_from
    from yolofeed.monitor.throughput import RunThroughput

    monitor = options_from(cfg)
    if monitor is not None:
        attach(model, **monitor)
    speed = RunThroughput()  # under DDP its callbacks run in the ranks, which report back (monitor/throughput.py)
    for event, fn in speed.callbacks().items():
        model.add_callback(event, fn)
    model.train(trainer=trainer, **kwargs)
    tr = model.trainer
    best = tr.best if tr.best.exists() else tr.last
    gpus = f"{tr.world_size} GPUs" if tr.world_size > 1 else str(tr.device)
    if speed.learn_from_ranks(tr.save_dir):
        print(f"yolofeed train: {speed.images:,} images in {speed.seconds:.1f} s of training steps "
              f"({speed.rate:,.0f} img/s on {gpus}); weights: {best}", flush=True)
    else:
        print(f"yolofeed train: the DDP ranks reported no speed; weights: {best}", flush=True)
    return best

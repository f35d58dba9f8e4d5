"""yolofeed's own options of a training run: checked, kept in the run folder, and restored when the run resumes.

Ultralytics keeps a run's training keys in ``args.yaml`` and in every checkpoint (``train_args``) and restores them on
resume, but refuses keys it does not know, so ``FastDetectionTrainer``'s options (``with_options``: where the packs
go and how they are stored, the partner pool, val_period, the step's switches, the live monitor) cannot ride there.
The trainer writes them to ``<run>/yolofeed.yaml`` beside args.yaml when it makes the run folder (atomically, as the
checkpoints), and reads them back when the run resumes, through ``yolofeed train resume=...`` and through
``YOLO(".../last.pt").train(resume=True, trainer=FastDetectionTrainer)`` alike. A run without one (trained by stock
Ultralytics, or by an older yolofeed) resumes with the defaults and what is given, and the log says so.

On resume an option given again (on the command line, or to ``with_options``) wins over the recorded one, and the log
names both; yolofeed.yaml then records it for the next resume. Every option here says how the run is fed and watched,
not what it learns, like the keys Ultralytics lets a resume change (batch, workers, device, cache, val...).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from yolofeed import __version__
from yolofeed.atomic import read_back
from yolofeed.errors import ConfigError
from yolofeed.pack import codecs

FILE = "yolofeed.yaml"
# FastDetectionTrainer's options, as with_options takes them (the monitor: None, or MonitorConfig's keyword arguments)
OPTIONS = ("pack_format", "pack_rebuild", "pack_dir", "augment_ahead", "partner_pool", "warm_up", "validate_beside",
           "val_overlap", "val_period", "batched_val_metrics", "save_process", "mask_room", "sync_free_step",
           "sync_free_loss", "fast_musgd", "graphed_step", "half_input", "monitor")
SWITCHES = ("augment_ahead", "warm_up", "validate_beside", "val_overlap", "batched_val_metrics", "save_process",
            "sync_free_step", "sync_free_loss", "fast_musgd", "graphed_step", "half_input")
AUTO = ("val_overlap", "save_process")  # switches whose None (the default) the run decides
# options a yolofeed.yaml of an earlier yolofeed may name that change only where time goes: read, and dropped
RETIRED = ("save_beside",)
REBUILDS = ("auto", "check", "always", "never")
MASK_ROOM_MOST = 64  # mask_room's largest: the rasteriser's slots grow with it (memory a batch)


def plain(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with numpy's scalars (the monitor's dict's too) made Python's, as the checks below and
    yolofeed.yaml take them: ``val_period=np.int64(2)`` is 2, where YAML could not write the numpy one."""
    def one(value: Any) -> Any:
        return value.item() if isinstance(value, np.generic) else value

    return {k: {m: one(v) for m, v in value.items()} if k == "monitor" and isinstance(value, dict) else one(value)
            for k, value in options.items()}


def check(options: dict[str, Any], where: str = "FastDetectionTrainer") -> None:
    """Refuse an unknown option or a value of the wrong kind, in one line.

    Args:
        where: what holds them, for the message: "FastDetectionTrainer" (``with_options``), or a yolofeed.yaml.

    Raises:
        ConfigError: naming the option, its value and what is expected.
    """
    unknown = set(options) - set(OPTIONS)
    if unknown:
        newer = " (written by a newer yolofeed?)" if where != "FastDetectionTrainer" else ""
        raise ConfigError(f"{where}: unknown options {sorted(unknown)}{newer}; expected {', '.join(OPTIONS)}")
    period = options.get("val_period", 1)
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise ConfigError(f"{where} option val_period={period!r}: expected a whole number of epochs, 1 or more (1 "
                          "validates every epoch, as Ultralytics does)")
    room = options.get("mask_room", 1)
    if isinstance(room, bool) or not isinstance(room, int) or not 1 <= room <= MASK_ROOM_MOST:
        raise ConfigError(f"{where} option mask_room={room!r}: expected a whole number from 1 to {MASK_ROOM_MOST} (the "
                          "segment mask rasteriser's slots in multiples of its default; a run doubles it after an "
                          "overflow)")
    for name in SWITCHES:  # the string "False" would be True
        if name in options and not isinstance(options[name], bool) and not (name in AUTO and options[name] is None):
            raise ConfigError(f"{where} option {name}={options[name]!r}: expected True or False"
                              + (" (or None: the default, decided by the run)" if name in AUTO else ""))
    for name in ("pack_format", "pack_dir"):
        if options.get(name) is not None and not isinstance(options[name], (str, os.PathLike)):
            raise ConfigError(f"{where} option {name}={options[name]!r}: expected a string")
    fmt = options.get("pack_format")
    if fmt is not None and fmt != codecs.AUTO and codecs.find(str(fmt)) is None:
        raise ConfigError(f"{where} option pack_format={fmt!r}: expected one of {', '.join(codecs.choices())}")
    if "pack_rebuild" in options and options["pack_rebuild"] not in REBUILDS:
        raise ConfigError(f"{where} option pack_rebuild={options['pack_rebuild']!r}: expected one of "
                          f"{', '.join(REBUILDS)}")
    try:
        partner_pool_size(options.get("partner_pool", "auto"))
    except ConfigError as e:
        raise ConfigError(f"{where} option {e}") from None
    monitor = options.get("monitor")
    if monitor is not None:
        from yolofeed.monitor.live import MonitorConfig

        if not isinstance(monitor, dict):
            raise ConfigError(f"{where} option monitor={monitor!r}: expected None (off) or a dict of the monitor's "
                              "keys, e.g. monitor={'prometheus_port': 9400}")
        try:
            MonitorConfig(**monitor)
        except TypeError as e:  # a key MonitorConfig does not have
            raise ConfigError(f"{where} option monitor={monitor!r}: {e}; the keys are "
                              "yolofeed.monitor.MonitorConfig's") from None
        except ConfigError as e:  # a value it refuses
            raise ConfigError(f"{where} option monitor: {e}") from None


def partner_pool_size(value: Any) -> int | str:
    """``partner_pool`` as the trainer uses it: "auto", or a number of images (0: partners from the batch itself);
    the command line's strings ("auto", "12", with spaces) too.

    Raises:
        ConfigError: anything else, in one line.
    """
    if isinstance(value, str):
        text = value.strip()
        if text == "auto":
            return text
        if text.isascii() and text.isdigit():
            return int(text)
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ConfigError(f"partner_pool={value!r}: expected 'auto' (Ultralytics' buffer, min(n, 8 x batch, 1000)), a "
                      "number of images, or 0 (partners from the batch itself)")


def normal(name: str, value: Any) -> Any:
    """A value as recorded: ``pack_dir`` as an absolute path (a resume from another folder finds the same packs)."""
    if name == "pack_dir" and value is not None:
        return str(Path(value).expanduser().resolve())
    return value


def record(save_dir: str | os.PathLike, options: dict[str, Any]) -> Path:
    """Write ``<save_dir>/yolofeed.yaml`` (atomically: a resume never finds half of it)."""
    from yolofeed.train.checkpoints import write_run_file

    path = Path(save_dir) / FILE
    body = yaml.safe_dump({k: normal(k, options[k]) for k in OPTIONS if k in options}, sort_keys=False)
    write_run_file(path, (f"# yolofeed {__version__}: the trainer's options of this run, restored when it "
                          "resumes (an option given again then wins)\n" + body).encode())
    return path


def file_for(checkpoint: str | os.PathLike, save_dir: str | os.PathLike | None = None) -> Path:
    """Where a checkpoint's run keeps its yolofeed.yaml: the run folder it lies in (``<run>/weights/last.pt``), else
    the ``save_dir`` its training arguments name."""
    beside = Path(checkpoint).expanduser().resolve().parent
    if beside.name == "weights" and (beside.parent / FILE).exists() or not save_dir:
        return (beside.parent if beside.name == "weights" else beside) / FILE
    return Path(save_dir) / FILE


def read(path: str | os.PathLike) -> dict[str, Any] | None:
    """The options recorded in ``path``; None when there is no such file.

    Raises:
        ConfigError: the file is not a yolofeed.yaml (broken YAML, not a mapping, unknown options or values).
    """
    path = Path(path)
    try:
        text = read_back(path).decode("utf-8")
    except FileNotFoundError:
        return None
    except ValueError as e:  # a FIFO, a device, a link to one (UnicodeDecodeError is one too): never read whole
        raise ConfigError(f"{path}: not this run's yolofeed options ({e}); delete it to resume with yolofeed's "
                          "defaults and the options given") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read this run's yolofeed options ({e.strerror or e}); fix its permissions, "
                          "or delete it to resume with yolofeed's defaults") from None
    try:
        options = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is damaged ({' '.join(str(e).split())}); delete it to resume with yolofeed's "
                          "defaults and the options given") from None
    if not isinstance(options, dict):
        raise ConfigError(f"{path} is damaged (it holds a {type(options).__name__}, not yolofeed's options); delete it "
                          "to resume with yolofeed's defaults and the options given")
    options = {k: v for k, v in options.items() if k not in RETIRED}
    try:
        check(options, where=str(path))
    except ConfigError as e:
        raise ConfigError(f"{e}. Fix {path}, or delete it to resume with yolofeed's defaults and the options given") \
            from None
    return options


def python_route(name: str, value: Any) -> str | None:
    """Where a key of ``yolofeed train`` that Ultralytics does not know goes when passed to ``YOLO(...).train()``
    (the trainer's options, the live monitor's keys); None for any other key."""
    from yolofeed.monitor.live import TRAIN_KEYS

    if name == "monitor":
        call = "monitor={}" if value else "monitor=None"  # {}: on, with the monitor's defaults
    elif name in TRAIN_KEYS:
        call = f"monitor={{{name!r}: {value!r}}}"
    elif name in OPTIONS:
        call = f"{name}={value!r}"
    else:
        return None
    trainer = "FastSegmentationTrainer" if name == "mask_room" else "FastDetectionTrainer"  # or the task's own
    return (f"'{name}' is a key of 'yolofeed train', not of Ultralytics' train(): from Python it goes through the "
            f"trainer, YOLO(...).train(trainer={trainer}.with_options({call}), ...)")

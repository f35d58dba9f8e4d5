"""A run's arguments as Ultralytics takes them: the names of the optimisers it builds (``OPTIMIZERS``), the side it
trains at for an ``imgsz`` (``train_side``), the weights a name stands for (``weights_name``) and those it finds or
fetches by name or address (``downloads_weights``, ``remote_model``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from yolofeed.ultralytics_seam.names import (
    GITHUB_ASSETS_NAMES,
    LOGGER,
    REMOTE_FILE_PREFIXES,
    SETTINGS,
    attempt_download_asset,
    check_imgsz,
    check_model_file_from_stem,
    get_cfg,
    parse_device,
)

# BaseTrainer.build_optimizer's names (matched without case); any other raises NotImplementedError after the model is
# built. tests/test_seam.py reads them from the installed source.
OPTIMIZERS = ("Adam", "Adamax", "AdamW", "NAdam", "RAdam", "RMSprop", "SGD", "MuSGD", "auto")


class _QuietHere(logging.Filter):
    """Drops the records of the thread that made it (``check_imgsz``'s warnings, which the run makes again itself)."""

    def __init__(self):
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread


def args_ahead(cfg: Any, overrides: dict[str, Any] | None) -> Any:
    """Ultralytics' ``get_cfg(cfg, overrides)`` before the trainer reads them itself, its warnings (a deprecated key)
    left out in this thread: the trainer says them once."""
    quiet = _QuietHere()
    LOGGER.addFilter(quiet)
    try:
        return get_cfg(cfg, overrides)
    finally:
        LOGGER.removeFilter(quiet)


def train_side(imgsz: Any, stride: int = 32) -> int:
    """The square side Ultralytics trains at: ``_setup_train``'s ``check_imgsz(imgsz, stride, floor=stride,
    max_dim=1)`` (the largest of a list, rounded up to a multiple of the model's stride, at least one stride), its
    warnings left out in this thread. Every detection model's stride is 32, a P6 model's 64.

    Raises:
        ValueError: a value ``check_imgsz`` refuses (Ultralytics raises it after the model and data are built), in
            its words.
    """
    quiet = _QuietHere()
    LOGGER.addFilter(quiet)
    try:
        side = check_imgsz(imgsz, stride, floor=stride, max_dim=1)
    except (TypeError, ValueError, ArithmeticError) as e:
        raise ValueError(" ".join(str(e).split())) from None
    finally:
        LOGGER.removeFilter(quiet)
    if not isinstance(side, int):  # an empty list
        raise ValueError(f"imgsz={imgsz} is not a valid image size")
    return side


def weights_name(name: str) -> str:
    """The name ``YOLO(name)`` loads for a ``model=`` that is no yaml: Ultralytics' ``check_model_file_from_stem``
    (``Model._load``) gives a bare name of its models its ``.pt`` (yolo11n is yolo11n.pt); any other name as it is."""
    return str(check_model_file_from_stem(str(name)))


def downloads_weights(name: str) -> bool:
    """Whether Ultralytics' ``attempt_download_asset`` may find or fetch ``name`` where no file is: a URL, an asset
    name of its releases (a path ending in yolo11n.pt is downloaded there; a yolov5 or yolov3 name is first renamed
    to its u version), or a name in its weights folder. Any other missing .pt it looks up on GitHub (two requests,
    YOLO_OFFLINE set too) before it fails."""
    text = str(name).strip()
    return (text.lower().startswith(("http:/", "https:/")) or Path(text).name in GITHUB_ASSETS_NAMES
            or "yolov5" in text or "yolov3" in text or (Path(SETTINGS["weights_dir"]) / text).exists())


def fetch_weights(name: str) -> str:
    """Ultralytics' weights by name (``yolo11n.pt``) fetched as ``YOLO()`` fetches them (``attempt_download_asset``,
    which ``Model._load`` reaches through ``torch_safe_load``), now rather than at a run's start; the local path.

    Raises:
        ConnectionError: the download failed (offline)."""
    return str(attempt_download_asset(name))


def remote_model(name: str) -> bool:
    """Whether ``model=name`` is one ``Model._load`` fetches before it loads it (``REMOTE_FILE_PREFIXES``: a URL, an
    ``ul://`` platform name), whatever its ending (a signed URL's query, a platform path without one)."""
    return str(name).strip().lower().startswith(REMOTE_FILE_PREFIXES)


def deterministic_ahead(deterministic: bool, seed: int) -> Callable[[], None]:
    """What Ultralytics' ``init_seeds`` (RELIED_ON) sets for cuDNN, cuBLAS and the environment under ``deterministic``
    for a single-process run of ``seed``, set before the trainer calls it, for cuDNN's plans made before
    (train/plans.py: a plan is made for one setting of ``cudnn.deterministic``; cuBLAS reads its workspace setting
    once): ``CUBLAS_WORKSPACE_CONFIG``, ``PYTHONHASHSEED`` (set now, init_seeds only rewrites them: a variable added to
    the environment while another thread reads it can move the environment under it) and
    ``torch.backends.cudnn.deterministic``. Its seeds and ``use_deterministic_algorithms`` are left to it.

    Returns a function that sets the three back as they were (a trainer whose build failed leaves the process as it
    found it)."""
    import os

    import torch

    keys = ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED")
    was = {k: os.environ.get(k) for k in keys}, torch.backends.cudnn.deterministic
    if deterministic:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        os.environ["PYTHONHASHSEED"] = str(seed)  # BaseTrainer: init_seeds(seed + 1 + RANK), RANK -1 here
    else:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        os.environ.pop("PYTHONHASHSEED", None)
    torch.backends.cudnn.deterministic = deterministic

    def undo() -> None:
        for key, value in was[0].items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        torch.backends.cudnn.deterministic = was[1]

    return undo


def one_gpu_asked(device: Any) -> int | None:
    """The CUDA device index the run will train on where ``device`` names one (``0``, ``"0"``, ``"cuda:1"``; none:
    the current one, as Ultralytics' default), as ``parse_device`` and ``select_device`` read it; None for anything
    else (the CPU, several GPUs, Ultralytics' choice of an idle GPU, ``-1``, which it makes later)."""
    import torch

    if "-1" in str(device):
        return None
    text = parse_device(device if device is not None else "")
    if text == "":
        return torch.cuda.current_device()  # select_device's default
    return int(text) if text.isdigit() and int(text) < torch.cuda.device_count() else None

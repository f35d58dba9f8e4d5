"""The data as Ultralytics finds and reads it: the data yaml a ``data=`` names, how its label check treats an image,
and what ``check_det_dataset`` keeps on the trainer (``trainer.data``)."""

from __future__ import annotations

import os
from typing import Any

import ultralytics

from yolofeed.ultralytics_seam.names import check_file
from yolofeed.ultralytics_seam.required import _missing
from yolofeed.ultralytics_seam.version import since


# -- the data yaml ---------------------------------------------------------------------------------------------------
def find_dataset_yaml(data: str | os.PathLike) -> str | None:
    """The data yaml ``check_det_dataset`` reads for ``data=``: the file itself, else one of the dataset yamls
    Ultralytics ships (``cfg/datasets``), by name (``coco8.yaml``, or a bare ``coco8``), as ``yolo train`` finds them;
    None when there is none. Never downloads: a URL is None (``check_file`` would fetch it)."""
    name = str(data).strip()
    if not name or "://" in name:
        return None
    if os.path.exists(name):
        return name
    suffix = os.path.splitext(name)[1].lower()
    for candidate in [name] if suffix in (".yaml", ".yml") else [f"{name}.yaml", f"{name}.yml"]:
        found = check_file(candidate, download=False, hard=False)  # a search of Ultralytics' package folder
        if found:
            return str(found)
    return None


def restores_in_place(path: str | os.PathLike) -> bool:
    """Whether Ultralytics' label check can rewrite this JPEG with trailing bytes where it lies (it restores one so):
    from 8.4.167 it writes a temporary file beside it and renames it over (``_replace_image``: the folder must take
    writes), before it opened the file itself for writing. Where it cannot, it skips the image as corrupt."""
    if since("8.4.167"):
        return os.access(os.path.dirname(os.path.abspath(path)), os.W_OK | os.X_OK)
    return os.access(path, os.W_OK)


def packaged(path: str | os.PathLike) -> bool:
    """Whether ``path`` lies inside the installed Ultralytics package (a dataset yaml found by name there)."""
    root = os.path.dirname(os.path.realpath(ultralytics.__file__))
    return os.path.realpath(path).startswith(root + os.sep)


# -- the trainer's data ----------------------------------------------------------------------------------------------
def data_yaml(trainer: Any) -> str:
    """The data yaml's path: ``check_det_dataset`` keeps it under ``trainer.data["yaml_file"]``.

    Raises:
        UltralyticsError: the key is gone (packs are built beside the data yaml and keyed by it).
    """
    try:
        return trainer.data["yaml_file"]
    except (KeyError, TypeError, AttributeError):
        raise _missing('trainer.data["yaml_file"]', "yolofeed builds and finds its packs by") from None


def data_split(trainer: Any, dataset_path: Any) -> str | None:
    """Which split of ``trainer.data`` (``check_det_dataset``'s dict) ``get_dataloader`` was given, or None."""
    return next((k for k in ("train", "val", "test", "minival") if trainer.data.get(k) == dataset_path), None)


def data_complete(trainer: Any) -> bool:
    """``trainer.data["complete"]``: a dataset already cut to ``fraction`` when downloaded (``build_yolo_dataset``
    then uses all of it)."""
    return bool(trainer.data.get("complete"))

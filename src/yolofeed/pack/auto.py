"""``pack_format=auto``: the format a dataset's packs are built in.

The format of a pack already built (so machines that would choose differently share one), else
``codecs.choose`` on the packs' estimated size, this process's memory and the free space where they go.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from pathlib import Path

from yolofeed.errors import DatasetError, PackError
from yolofeed.limits import memory_limit
from yolofeed.pack import codecs
from yolofeed.pack.disk import current, existing_ancestor
from yolofeed.pack.layout import SUFFIX
from yolofeed.pack.paths import pack_folders
from yolofeed.pack.source import load_data_yaml, split_source
from yolofeed.pack.space import estimate_bytes
from yolofeed.pack.store import Pack

LOGGER = logging.getLogger(__name__)


def built_format(yaml_file: str, imgsz: int, out: str | None, task: str = "detect") -> tuple[str, Path] | None:
    """The format and path of a train pack already built for this dataset, size and task, if any (reads its header;
    another yaml's pack in a folder of the same name does not count)."""
    for name in codecs.names():
        for folder in pack_folders(yaml_file, imgsz, name, out, task):
            path = folder / f"train{SUFFIX}"
            # a damaged one, or one this user may not read (is_file raises on a folder it cannot enter): decided
            # afresh, and the build that follows says what is wrong with the folder
            with contextlib.suppress(PackError, OSError, ValueError):
                if path.is_file() and Pack.open(path, {"data": yaml_file}).format == name:
                    return name, path
    return None


def auto_format(yaml_file: str, imgsz: int, out: str | None, task: str = "detect") -> str:
    """``pack_format=auto`` for one dataset, image size and pack folder: the format of a pack already built there (so
    machines that would choose differently share one, and nothing is built twice), else the default format where the
    train and val packs fit comfortably in memory and on the disk or the compact format would be no smaller, else the
    compact one. Decided afresh at each call (a notebook's next run finds the packs built, deleted or replaced since,
    the free space of now and the images added); said where the format is not the one last said for the dataset."""
    key = (yaml_file, imgsz, out, task)
    built = built_format(yaml_file, imgsz, out, task)
    if built is not None:
        _say(key, built[0], f"the {built[0]} pack already built, {built[1]}")
        return built[0]
    total, compact = _sizes(yaml_file, imgsz, _stamp(yaml_file))
    folders = pack_folders(yaml_file, imgsz, codecs.DEFAULT, out, task)
    # where the build will write: beside a read-only dataset that is the user cache, on another disk
    folder = next((f for f in folders if current().writable(f, create=False) is None), folders[0])
    where = existing_ancestor(folder)
    free = current().free(where) if where is not None else None
    name, why = codecs.choose(total, memory_limit(), free, str(where), compact)
    _say(key, name, why)
    return name


_said: dict[tuple, str] = {}  # (yaml, imgsz, out, task) -> the format said for it


def _say(key: tuple, name: str, why: str) -> None:
    """The format auto picked and why, where it is not the one this process said last for ``key``."""
    if _said.get(key) != name:
        _said[key] = name
        LOGGER.info(f"pack: format {name} ({codecs.AUTO}): {why}")


def _stamp(yaml_file: str) -> tuple:
    """When the yaml and its train and val entries (folders, lists) last changed: images added to a folder, a list
    rewritten or the yaml edited make ``_sizes`` estimate again (a few stats)."""
    stamps = []
    with contextlib.suppress(DatasetError, OSError):
        d = load_data_yaml(yaml_file)
        root = Path(d.get("path") or Path(yaml_file).parent)
        stamps.append(os.stat(d.get("yaml_file", yaml_file)).st_mtime_ns)
        for split in ("train", "val"):
            entries = d.get(split) or []
            for entry in entries if isinstance(entries, list) else [entries]:
                with contextlib.suppress(OSError, TypeError):
                    stamps.append(os.stat(root / entry).st_mtime_ns)
    return tuple(stamps)


@functools.cache
def _sizes(yaml_file: str, imgsz: int, stamp: tuple) -> tuple[int, int]:
    """The train and val packs' estimated sizes in the default and the compact format (the headers of a sample of
    the images: up to a second on a large set), once for each ``stamp`` (``_stamp``: the dataset as it is now)."""
    d = load_data_yaml(yaml_file)
    total = compact = 0
    for split in ("train", "val"):
        with contextlib.suppress(DatasetError):  # a split the yaml lacks, or one not packed now (splits=train)
            src = split_source(d, split)
            total += estimate_bytes(src, imgsz, codecs.DEFAULT)
            compact += estimate_bytes(src, imgsz, codecs.COMPACT)
    return total, compact


def forget() -> None:
    """Forget the sizes estimated and the formats said (tests: each decides as a new process would)."""
    _sizes.cache_clear()
    _said.clear()


def resolve_format(data: dict, format: str, imgsz: int, out: str | os.PathLike | None = None,
                   task: str = "detect") -> str:
    """``format``, with ``auto`` replaced by the format it picks for this dataset, image size, folder, task and
    machine."""
    if format != codecs.AUTO:
        return format
    return auto_format(str(data["yaml_file"]), int(imgsz), str(out) if out else None, task)

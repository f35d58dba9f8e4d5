"""Where the packs of a data yaml live, and the command that rebuilds one.

A pack folder is ``<folder>/<yaml stem>-<format>-<imgsz>`` (``-pose`` after it for a pose pack): beside the yaml
(``yolofeed-packs``), under ``out=`` (``<yaml stem>-<hash of its path>-...`` there for a second yaml of the same name),
or, for a dataset whose folder is read-only, under the user's cache folder.
Error messages quote the exact ``yolofeed pack`` command that rebuilds a pack, worked out from its header and where
it lies.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
from pathlib import Path
from typing import Any

from yolofeed.errors import PackError, describe
from yolofeed.pack import codecs
from yolofeed.pack.disk import current
from yolofeed.pack.layout import HEADER_ERRORS, TASKS

LOGGER = logging.getLogger(__name__)

GENERIC_FIX = "rebuild it with 'yolofeed pack data=... rebuild=always'"


def cache_root() -> Path:
    """Where packs go when the dataset's folder is not writable: the user's cache folder."""
    if os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "yolofeed" / "packs"


def folder_name(stem: str, imgsz: int, format: str, task: str = "detect") -> str:
    """``<stem>-<format>-<imgsz>``, and ``-<task>`` after it for a task other than detection."""
    return f"{stem}-{format}-{imgsz}" + (f"-{task}" if task != "detect" else "")


def yaml_place(yaml_file: str | os.PathLike) -> Path:
    """A data yaml's absolute path with its folders' links resolved but not its own name: a yaml that is a link (one
    file shared by several datasets' folders, each resolving its splits from its own) keys the packs of the folder it
    lies in, as Ultralytics keeps a label cache in each dataset's folder. For any other yaml, ``Path.resolve()``."""
    path = Path(yaml_file).expanduser()
    return Path(os.path.realpath(path.parent)) / path.name


def yaml_stem(yaml_file: str | os.PathLike) -> str:
    """The stem that names a yaml's pack folders: the file's it resolves to, so that a link switched between versions
    (current.yaml to v1.yaml, then to v2.yaml) keeps each version's packs apart."""
    return Path(os.path.realpath(Path(yaml_file).expanduser())).stem


def store_dir(yaml_file: str | os.PathLike, imgsz: int, format: str, out: str | os.PathLike | None = None,
              task: str = "detect") -> Path:
    """Where the packs of a data yaml live: ``<folder>/<yaml stem>-<format>-<imgsz>`` (``-pose`` after it for
    ``task="pose"``), the folder being ``out``, or ``yolofeed-packs`` beside the yaml (see ``pack_folders``). Each
    dataset, format, size and task in a folder of its own, so that several of them share one ``out=`` without
    replacing each other's packs (a pose yaml's detection and pose packs keep different images: their label rules
    differ)."""
    try:
        y = yaml_place(yaml_file)
        base = Path(out).expanduser().resolve() if out else y.parent / "yolofeed-packs"
    except (RuntimeError, OSError) as e:  # a symbolic link loop: RuntimeError before Python 3.13, OSError after
        raise PackError(f"{out or yaml_file}: cannot resolve the path ({e}); pass a folder that is not a link loop"
                        ) from None
    return base / folder_name(yaml_stem(y), imgsz, format, task)


def _path_key(yaml_file: Path) -> str:
    """12 hex digits of the yaml's path (``yaml_place``): two datasets' ``data.yaml`` get different folders."""
    return hashlib.sha256(os.fsencode(str(yaml_file))).hexdigest()[:12]


def pack_folders(yaml_file: str | os.PathLike, imgsz: int, format: str,
                 out: str | os.PathLike | None = None, task: str = "detect") -> list[Path]:
    """Where the packs of a data yaml may be, in order of preference.

    When ``out`` is given: ``<out>/<yaml stem>-<format>-<imgsz>``, then ``<out>/<yaml stem>-<hash of the yaml's
    path>-<format>-<imgsz>`` for a yaml whose first folder holds another yaml of that name's packs (two datasets'
    ``data.yaml`` under one ``out=``: ``rebuild.own_folders`` skips the taken one). Else beside the yaml
    (``store_dir``), then ``<cache_root>/<yaml stem>-<hash>/<stem>-<format>-<imgsz>`` for datasets whose folder is
    read-only. A yaml Ultralytics ships (``data=coco8.yaml``) gets the cache folder only: packs never go into the
    installed package.
    """
    if out:
        plain = store_dir(yaml_file, imgsz, format, out, task)
        y = yaml_place(yaml_file)
        return [plain, plain.with_name(folder_name(f"{yaml_stem(y)}-{_path_key(y)}", imgsz, format, task))]
    y, stem = yaml_place(yaml_file), yaml_stem(yaml_file)
    cache = cache_root() / f"{stem}-{_path_key(y)}" / folder_name(stem, imgsz, format, task)
    from yolofeed.ultralytics_seam import packaged  # here: reading a pack (store.py) loads no Ultralytics

    return [cache] if packaged(y) else [store_dir(y, imgsz, format, task=task), cache]


def rebuild_command(yaml_file: str, imgsz: int, format: str, out: str | os.PathLike | None = None,
                    task: str = "detect") -> str:
    """The exact command that rebuilds this pack, for error messages: quoted for a POSIX shell, so that a path with a
    space or a quote in it pastes whole."""
    return shlex.join(["yolofeed", "pack", f"data={yaml_file}", f"imgsz={imgsz}", f"format={format}",
                       *([f"task={task}"] if task != "detect" else []),
                       *([f"out={os.path.abspath(os.path.expanduser(out))}"] if out else []), "rebuild=always"])


def fix_from_header(path: Path, header: dict[str, Any]) -> str:
    """The rebuild command for a pack whose header names its source, or "" (a header too damaged to tell)."""
    try:
        data, imgsz, format = str(header["source"]["data"]), int(header["imgsz"]), str(header["storage"])
        task = str(header.get("task", "detect"))
        if codecs.find(format) is None or imgsz < 1 or "\0" in data or task not in TASKS:
            return ""
        default = store_dir(data, imgsz, format, task=task)
    except (*HEADER_ERRORS, PackError, OSError):  # a path that cannot be resolved (a link loop, too long)
        return ""
    folder = path.parent
    if folder == default:
        out = None
    elif folder.name in {f.name for f in pack_folders(data, imgsz, format, folder.parent, task)}:
        out = folder.parent  # <out>/<stem>[-<hash>]-<format>-<imgsz>: rebuilt by out=<out>
    else:  # a pack file moved elsewhere: a new one is built under the folder it is in
        out = folder
    return f"rebuild it with: {rebuild_command(data, imgsz, format, out, task)}"


def build_folder(folders: list[Path], split: str, chosen: bool, create: bool = True) -> Path:
    """The first folder of ``folders`` where a pack can be written; says so when it is not the first.

    Args:
        create: see ``Disk.writable``; False also keeps quiet (a check before the build, which says it again).

    Raises:
        PackError: none is writable (``chosen``: the user named the only one with out= / pack_dir=).
    """
    errors = []
    for folder in folders:
        err = current().writable(folder, create)
        if err is None:
            if errors and create:
                LOGGER.warning(f"pack: {folders[0]} is not writable ({errors[0].strerror or errors[0]}); "
                               f"the {split} pack goes to {folder} instead (choose the folder with out= for "
                               "yolofeed pack, pack_dir= for yolofeed train)")
            return folder
        errors.append(err)
    if chosen:
        why = errors[0].strerror or errors[0]
        if os.path.islink(folders[0]) and not os.path.isdir(folders[0]):  # "File exists" says nothing of a link
            why = f"it is {describe(folders[0])}"
        raise PackError(f"cannot write packs to {folders[0]} ({why}); pass a writable folder: out= (yolofeed pack) or "
                        "pack_dir= (yolofeed train)")
    raise PackError(f"cannot write packs beside the data ({folders[0]}: {errors[0].strerror or errors[0]}) nor to "
                    f"{folders[-1]} ({errors[-1].strerror or errors[-1]}); pass a writable folder: out= (yolofeed "
                    "pack) or pack_dir= (yolofeed train)")


def old_layout(out: str | os.PathLike | None, name: str) -> str:
    """A note for a pack file directly in ``out``, where packs went before each got a folder of its own there; ""."""
    old = Path(out).expanduser() / name if out else None
    if old is None or not old.is_file():
        return ""
    return (f" ({old} is where packs of out= went before each data yaml, format and imgsz got a folder of its own in "
            "it: this yolofeed does not read it there; delete it once nothing needs it)")


def missing(path: Path, out: str | os.PathLike | None, fix: str) -> PackError:
    return PackError(f"pack {path} does not exist{old_layout(out, path.name)}; {fix}")

"""When a pack is reused, refused or rebuilt: the ``rebuild=`` policy, and the checks before a run starts.

A pack is rebuilt when a source file's path, size or modification time changes, or ``nc`` does: the
rule of Ultralytics' label cache (``get_hash`` over label and image files). A label file edited in
place to the same size with its modification time put back passes that rule, in Ultralytics too;
``rebuild=check`` also compares the CRC32 of every label file's bytes with the ones recorded at build
time (one read of each label file: small files, about a second per 100k on a local disk).
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from yolofeed.config import MIN_IMGSZ
from yolofeed.errors import (
    ConfigError,
    DatasetError,
    ForeignPackError,
    NewerPackError,
    PackError,
    PackSpaceError,
    StalePackError,
)
from yolofeed.pack import codecs, files
from yolofeed.pack.auto import resolve_format
from yolofeed.pack.build import build_split, locked
from yolofeed.pack.disk import current, existing_ancestor, leftovers
from yolofeed.pack.encode import label_crc
from yolofeed.pack.layout import DETECT_POLYGONS, SUFFIX, is_pack_file, printable
from yolofeed.pack.lock import FolderLock
from yolofeed.pack.paths import build_folder, missing, old_layout, pack_folders, rebuild_command
from yolofeed.pack.report import commonest_reasons, where_listed
from yolofeed.pack.source import SplitSource, load_data_yaml, split_source
from yolofeed.pack.space import MOVE_HINT, Space, gb, plan_space
from yolofeed.pack.store import Pack
from yolofeed.pack.summary import BuildResult, summary
from yolofeed.ultralytics_seam import LABEL_RULES

LOGGER = logging.getLogger(__name__)

REBUILDS = ("never", "auto", "check", "always")
SKIP_REASONS_SAID = 3  # the commonest reasons a reused pack's reminder of its skipped images names; the rest counted


def _label_crcs(label_files: tuple[str, ...]) -> np.ndarray:
    """CRC32 of every label file's bytes (0 when missing), read on a few threads (small files: I/O-bound)."""
    with ThreadPoolExecutor(8) as pool:
        return np.fromiter(pool.map(label_crc, label_files, chunksize=256), np.uint32, len(label_files))


def _open_checked(path: Path, expect: dict[str, Any], fix: str, src: SplitSource, rebuild: str,
                  verify: bool, stats: np.ndarray | None = None) -> Pack:
    """``Pack.open`` plus the fingerprint and the checks ``rebuild=check`` and ``verify=True`` ask for.

    Args:
        expect: ``Pack.open``'s, and the sources' ``fingerprint`` (``_expected``), compared here.
        stats: the sources' ``SplitSource.stats``, which the fingerprint was made of: with them a stale pack's error
            says what changed (``source_changes``); None: it says only that something did.

    Raises:
        PackError / StalePackError: as ``Pack.open``; stale sources or label contents; damaged payloads.
    """
    expect = dict(expect)
    fingerprint = expect.pop("fingerprint", None)
    pack = Pack.open(path, expect, fix)
    stale = ""
    if fingerprint is not None and pack.header["source"]["fingerprint"] != fingerprint:
        stale = ("the source images or labels changed since it was built"
                 f"{'' if stats is None else source_changes(pack, src, stats)}")
    elif rebuild == "check":
        changed = np.nonzero(_label_crcs(src.label_files) != pack.label_crc)[0]
        if len(changed):
            names = ", ".join(printable(src.label_files[i]) for i in changed[:3])
            stale = (f"{len(changed)} label file(s) changed content since it was built, keeping their size and time "
                     f"({names})")
    # a refused pack's map and file go now, not with the traceback the caller keeps (``_existing``'s errors), which
    # would hold them until a garbage collection: the file is about to be replaced
    if stale:
        del pack
        raise StalePackError(f"{path} is stale: {stale}; {fix}")
    if verify:
        try:
            pack.verify(fix=fix)
        except PackError as e:
            del pack
            raise e.with_traceback(None) from None  # without the frame of verify, which holds the pack too
    return pack


def source_changes(pack: Pack, src: SplitSource, stats: np.ndarray, shown: int = 2) -> str:
    """What changed in ``src`` (its files' ``stats`` now) since ``pack`` was built from it, as " (3 images added: a.jpg,
    b.jpg, ...; ...)", ``shown`` files named a kind, relative to the dataset's folder; "" where the pack did not
    record its sources (``Pack.sources``)."""
    recorded = pack.sources()
    if recorded is None:
        return ""
    old_files, old_stats = recorded
    parts = []
    if pack.header["source"].get("nc") != src.nc:
        parts.append(f"the yaml's nc {pack.header['source'].get('nc')} -> {src.nc}")
    if src.task == "pose" and pack.header.get("kpt_shape") != list(src.kpt_shape):
        parts.append(f"the yaml's kpt_shape {pack.header.get('kpt_shape')} -> {list(src.kpt_shape)}")
    where = {f: i for i, f in enumerate(old_files)}
    kept = set(src.im_files)
    retimed = "of the same size with another modification time (edited, touched, or copied without their times)"
    changed: dict[tuple[str, str], list[str]] = {  # (noun, what happened to it): the paths, in this order
        ("image", "added"): [f for f in src.im_files if f not in where],
        ("image", "removed"): [f for f in old_files if f not in kept],
        ("file", "created"): [], ("file", "deleted"): [], ("file", "of another size"): [], ("file", retimed): []}
    n_old, n_now = len(old_files), len(src.im_files)
    pairs = []  # (path, [size, mtime] then, now) of each image still in the split, and of its label file
    for j, f in enumerate(src.im_files):
        i = where.get(f)
        if i is not None:
            pairs += [(f, old_stats[i], stats[j]), (src.label_files[j], old_stats[n_old + i], stats[n_now + j])]
    for path, (size0, time0), (size1, time1) in pairs:
        what = ("created" if size0 < 0 <= size1 else "deleted" if size1 < 0 <= size0
                else "of another size" if size0 != size1 else retimed if time0 != time1 else None)
        if what:
            changed["file", what].append(path)
    # the dataset's folder: where its images and labels folders meet (Ultralytics' layout), else the yaml's
    root = (os.path.commonpath([os.path.dirname(src.im_files[0]), os.path.dirname(src.label_files[0])])
            if src.im_files else os.path.dirname(src.yaml_file))
    for (noun, what), paths in changed.items():
        if paths:
            names = [printable(os.path.relpath(p, root) if p.startswith(root + os.sep) else p) for p in paths[:shown]]
            parts.append(f"{len(paths):,} {noun}{'' if len(paths) == 1 else 's'} {what}: {', '.join(names)}"
                         f"{', ...' if len(paths) > shown else ''}")
    if not parts:  # the fingerprint's one other input; a detection pack does not record it
        parts.append("no image or label file changed its size or time: the yaml's kpt_shape, which the fingerprint "
                     "counts, did")
    return f" ({'; '.join(parts)})"


def no_labels(pack: Pack, training: bool = False) -> str:
    """Ultralytics' warning (``training``: its refusal) for a split without labels; "" when it has some."""
    c, where = pack.header["counts"], pack.header["source"]["label_dir"]
    if c["label_files"] == 0:
        return no_label_files(where, pack.split, training, pack.im_files)
    if c["boxes"] == 0:
        return f"Labels are missing or empty in {where} (split '{pack.split}'), training may not work correctly"
    return ""


def no_label_files(label_dir: str, split: str, training: bool, im_files: Sequence[str]) -> str:
    """Ultralytics' warning (``training``: its refusal) for a split none of whose images has a label file, with where
    it looks for them: each image path's last ``/images/`` made ``/labels/`` (``img2label_paths``), which a folder
    named otherwise (``Images``, ``imgs``) never matches."""
    consequence = ("Ultralytics refuses to train on such a split, and so does yolofeed" if training else
                   "training may not work correctly (Ultralytics refuses to train on such a split)")
    said = (f"No labels found in {label_dir}: none of the {len(im_files):,} images of split '{split}' has a label "
            f"file; {consequence}. ")
    folder = f"{os.sep}images{os.sep}"
    if any(folder in f for f in im_files[:1000]):
        return said + "Put YOLO .txt labels there, one per image, named as the image"
    return said + (f"Labels are looked for where an image's path has its last {folder} made {os.sep}labels{os.sep}, "
                   f"and these images lie under no folder named 'images' (the name's case counts: "
                   f"{Path(im_files[0]).parent}): move them into images{os.sep}{split} with the labels in "
                   f"labels{os.sep}{split} beside it")


def check_labels_found(src: SplitSource) -> None:
    """Refuse a split to train on none of whose images has a label file, before its pack is built: Ultralytics refuses
    it once its labels are scanned (``No labels found``), and the pack's build would decode every image first. A stat
    of each label file until one is found.

    Raises:
        DatasetError: ``no_label_files``' words, the split's label folder and the fix.
    """
    if src.label_files and not any(os.path.isfile(f) for f in src.label_files):
        raise DatasetError(no_label_files(str(Path(src.label_files[0]).parent), src.split, True, src.im_files))


def own_folders(folders: list[Path], yaml_file: str, out: str | os.PathLike | None) -> list[Path]:
    """Under ``out=``, ``folders`` (``paths.pack_folders``) less those holding a pack built from another data yaml:
    two datasets' ``data.yaml`` under one ``out=`` each keep their own packs, where otherwise the second would rebuild
    over the first's at every run of either. Reads the header of each pack file there. Without ``out`` the folders are
    this yaml's own (beside it, or keyed by its path): a pack of another path there is a copied dataset's, rebuilt.

    Raises:
        PackError: every folder holds another yaml's packs (a link planted at the second, say): none is replaced.
    """
    if not out:
        return folders
    own = [folder for folder in folders if _taken_by(folder, yaml_file) is None]
    if not own:
        taken = ", ".join(str(_taken_by(folder, yaml_file)) for folder in folders)
        raise PackError(f"the pack folders of {yaml_file} under out={out} hold another data yaml's packs ({taken}); "
                        f"yolofeed replaces none of them: pass another out= (yolofeed pack) or pack_dir= (yolofeed "
                        "train), or delete those folders")
    return own


def _taken_by(folder: Path, yaml_file: str) -> Path | None:
    """A pack in ``folder`` built from another data yaml than ``yaml_file``, or None."""
    with contextlib.suppress(OSError):
        for path in sorted(folder.glob(f"*{SUFFIX}")):
            try:
                Pack.open(path, {"data": yaml_file})
            except ForeignPackError:
                return path
            except PackError:  # damaged, another version: replaced by this yaml's as before
                continue
    return None


def _expected(src: SplitSource, imgsz: int, format: str, stats: np.ndarray) -> dict[str, Any]:
    """What a pack of ``src`` must say in its header to be used (``Pack.open``'s ``expect``): the split and the task
    right after the data, so that another split's pack (a copied file), or a detection pack found where a pose pack
    is wanted, says so rather than something vaguer."""
    return {"data": src.yaml_file, "split": src.split, "task": src.task, "imgsz": imgsz, "storage": format,
            "fingerprint": src.fingerprint(stats),
            "label_rules": LABEL_RULES.since,  # a pack checked under another release's label rules is stale
            **({"detect_polygons": DETECT_POLYGONS} if src.task == "detect" else {})}


def without_fix(message: str, fix: str) -> str:
    """A refused pack's message without its ``fix`` (the rebuild command) and the words that lead to it: said where
    the rebuild is already under way."""
    at = message.rfind(fix)
    if at < 0:
        return message
    head = message[:at].rstrip()
    for lead in (", or", " or", ";", ":", ","):
        if head.endswith(lead):
            return head[:-len(lead)].rstrip()
    return head


def _existing(folders: list[Path], name: str, src: SplitSource, imgsz: int, format: str, fix: str, rebuild: str,
              verify: bool, stats: np.ndarray) -> tuple[Pack | None, list[PackError]]:
    """The first valid pack ``name`` in ``folders``, and why each other one found there was refused.

    Args:
        stats: ``src.stats()``, one stat of every source file for all the folders (``_open_checked``).
    """
    expect = _expected(src, imgsz, format, stats)
    errors = []
    for folder in folders:
        if os.path.lexists(folder / name):  # a broken link, a link loop: said as such, not "does not exist"
            try:
                return _open_checked(folder / name, expect, fix, src, rebuild, verify, stats), errors
            except PackError as e:
                errors.append(e)
    return None, errors


def check_split(data: str | os.PathLike | dict, split: str = "train", imgsz: int = 640, format: str = codecs.DEFAULT,
                out: str | os.PathLike | None = None, rebuild: str = "never", task: str = "detect") -> None:
    """Refuse now what ``ensure_split`` would refuse later, before a training run makes its folder or model.

    With ``rebuild="never"``: the pack must exist and be valid and current (it is opened: its metadata
    checksums, and a stat of every source file for the fingerprint). Otherwise, when no pack file is there
    yet (or ``rebuild="always"``): some folder must take one (nothing is created; the build makes the folder), with
    the free space for it (the split is listed and up to ``SPACE_SAMPLE`` image headers are read, as the build will).
    A DDP launcher thereby refuses a pack that cannot fit in its own process, with the error's own type, before any
    rank starts. ``check_splits`` checks several splits, and their packs' space together.

    Raises:
        PackError / PackSpaceError / StalePackError / DatasetError: as ``ensure_split`` would.
    """
    check_splits(data, (split,), imgsz, format, out, rebuild, task)


def check_splits(data: str | os.PathLike | dict, splits: tuple[str, ...] | list[str], imgsz: int = 640,
                 format: str = codecs.DEFAULT, out: str | os.PathLike | None = None, rebuild: str = "never",
                 task: str = "detect", trains: str | None = None) -> None:
    """``check_split`` for each split, and the free space for every pack still to build, added up per disk; the split
    a run ``trains`` on, if named, must have label files (``check_labels_found``).

    The packs of a run are built one after the other and each stays: checked one at a time, each fits the free
    space, and the val pack fails for want of room once the train pack is written. A pack file already there is
    reused or rebuilt under ``rebuild="auto"``; only a build can tell which (it opens the pack), so it is not counted.

    Raises:
        PackSpaceError: the packs to build do not fit together (or one alone does not); the message gives each one's
            size, the sum and the free space.
        PackError / StalePackError / DatasetError: as ``check_split``.
    """
    if rebuild not in REBUILDS:
        raise PackError(f"rebuild={rebuild}: expected one of {', '.join(REBUILDS)}")
    d = data if isinstance(data, dict) else load_data_yaml(data)
    # a wrong path: refused before format=auto says what it chose (without the split)
    sources = {split: split_source(d, split, task) for split in dict.fromkeys(splits)}
    if trains in sources:
        check_labels_found(sources[trains])
    format = resolve_format(d, format, imgsz, out, task)
    folders = own_folders(pack_folders(d["yaml_file"], imgsz, format, out, task), d["yaml_file"], out)
    due: dict[int, list[tuple[str, Path, Space]]] = {}  # disk (st_dev) -> the packs to build there
    for split, src in sources.items():
        name = f"{split}{SUFFIX}"
        if rebuild == "never":
            fix = f"rebuild it with: {rebuild_command(d['yaml_file'], imgsz, format, out, task)}"
            pack, errors = _existing(folders, name, src, imgsz, format, fix, rebuild, False, src.stats())
            if pack is None:
                raise errors[0] if errors else missing(folders[0] / name, out, fix)
        elif rebuild == "always" or not any(os.path.lexists(folder / name) for folder in folders):
            folder = build_folder(folders, split, chosen=bool(out), create=False)
            FolderLock(folder).check()  # a lock file that is not yolofeed's: refused before a run folder is made
            space = plan_space(src, folder, imgsz, format)  # this one alone
            disk = existing_ancestor(folder) or folder
            due.setdefault(os.stat(disk).st_dev, []).append((split, folder, space))
    for packs in due.values():
        need = sum(space.estimate for _, _, space in packs)
        free = min(space.free for _, _, space in packs)
        if len(packs) > 1 and free < need:
            names = " and ".join(split for split, _, _ in packs)
            each = ", ".join(f"{split} {gb(space.estimate)}" for split, _, space in packs)
            where = ", ".join(dict.fromkeys(str(folder) for _, folder, _ in packs))
            raise PackSpaceError(f"not enough free space for the {names} packs in {where}: together they need "
                                 f"{gb(need)} ({need:,} bytes: {each}), {gb(free)} ({free:,} bytes) are free. "
                                 f"Free some space, or {MOVE_HINT}")


def _format_from_storage(format: str, storage: str | None) -> str:
    """``storage=``, the keyword's name before ``format=``: warns, then means ``format=``."""
    if storage is None:
        return format
    warnings.warn("storage= is deprecated: use format=", DeprecationWarning, stacklevel=3)
    return storage


def _checked_imgsz(imgsz: Any) -> int:
    """``imgsz`` as an int: a whole number of at least ``MIN_IMGSZ``, as ``yolofeed pack`` takes it (a numpy integer
    too)."""
    try:
        size = None if isinstance(imgsz, bool) else operator.index(imgsz)
    except TypeError:
        size = None
    if size is None or size < MIN_IMGSZ:
        raise ConfigError(f"imgsz={imgsz!r}: expected a whole number, at least {MIN_IMGSZ} (default 640)")
    return size


def ensure_split(data: str | os.PathLike | dict, split: str = "train", imgsz: int = 640, format: str = codecs.DEFAULT,
                 out: str | os.PathLike | None = None, rebuild: str = "never", workers: int = 0,
                 progress: bool = True, sync: bool = False, verify: bool = False, task: str = "detect", *,
                 storage: str | None = None) -> BuildResult:
    """Open the pack of one split, building it if asked to.

    Args:
        data: data yaml path, or a dict from ``load_data_yaml``.
        out: the pack folder; None: beside the data yaml, or the user's cache folder when that is not
            writable (``pack_folders``).
        rebuild: "never" refuses a missing or stale pack with the command that fixes it; "auto"
            builds it; "check" is "auto" that also compares the label files' contents (see the
            module docstring); "always" builds even an up-to-date one.
        sync: see ``build_split``.
        verify: check every payload's CRC32 of an existing pack (a read of the whole file); a
            damaged one is refused ("never") or rebuilt. A new build checks its payloads anyway.
        task: "detect", "pose" (the yaml's kpt_shape, Ultralytics' pose label rules, a keypoints section) or "obb"
            (4-corner rows, a corners section); each task's packs in a folder of their own (``paths.store_dir``).
            A pack built for another task is stale.

    Raises:
        PackError / StalePackError: with rebuild="never", the pack is missing, damaged or stale; no
            writable folder; the disk is full.
        DatasetError: the data yaml or the split is unusable.
    """
    format = _format_from_storage(format, storage)
    if rebuild not in REBUILDS:
        raise PackError(f"rebuild={rebuild}: expected one of {', '.join(REBUILDS)}")
    imgsz = _checked_imgsz(imgsz)
    if isinstance(data, dict) and "yaml_file" not in data:
        raise ConfigError("data: a dict from yolofeed.pack.load_data_yaml (or Ultralytics' check_det_dataset), which "
                          "records its yaml_file; or pass the data yaml's path")
    d = data if isinstance(data, dict) else load_data_yaml(data)
    src = split_source(d, split, task)  # a wrong path: refused before format=auto says what it chose
    format = resolve_format(d, format, imgsz, out, task)
    every = pack_folders(d["yaml_file"], imgsz, format, out, task)
    folders = own_folders(every, d["yaml_file"], out)
    name = f"{split}{SUFFIX}"
    fix = f"rebuild it with: {rebuild_command(d['yaml_file'], imgsz, format, out, task)}"
    result, errors = None, []
    stats = None if rebuild == "always" else src.stats()  # one stat of every source file, for both looks below
    if rebuild != "always":
        pack, errors = _existing(folders, name, src, imgsz, format, fix, rebuild, verify, stats)
        result = BuildResult(pack, built=False, verified=verify) if pack is not None else None
        if result is None and rebuild == "never":
            raise errors[0] if errors else missing(folders[0] / name, out, fix)
    if result is None:
        folder = build_folder(folders, split, chosen=bool(out))
        if folder != every[0] and folder.parent == every[0].parent:
            LOGGER.info(f"pack: {every[0]} holds the packs of another data yaml named {Path(d['yaml_file']).name} "
                        f"({_taken_by(every[0], d['yaml_file'])}); this one's go to {folder}")
        files.check_replaceable(folder / name, is_pack_file, f"the {split} pack")  # before saying "Rebuilding"
        for e in errors:  # a newer yolofeed's pack is worth a warning: that yolofeed will rebuild it in turn
            said = f"pack: {without_fix(str(e), fix)}; rebuilding it"
            if isinstance(e, NewerPackError):
                LOGGER.warning(f"WARNING {said}")
            else:
                LOGGER.info(said)
        if old_layout(out, name):
            LOGGER.info(f"pack: building the {split} pack in {folder}{old_layout(out, name)}")
        with locked(folder):
            if rebuild != "always":  # another process may have built it while we waited for the lock
                with contextlib.suppress(PackError):
                    expect = _expected(src, imgsz, format, stats)  # no stats: its error, dropped, names nothing
                    result = BuildResult(_open_checked(folder / name, expect, fix, src, rebuild, verify), built=False,
                                         verified=verify)
            if result is None:
                t0 = time.perf_counter()
                pack = build_split(src, folder / name, imgsz, format, workers, progress, sync)
                result = BuildResult(pack, built=True, seconds=time.perf_counter() - t0)
    if not result.built:
        _remove_leftovers_if_idle(result.pack.path.parent)
    warning = no_labels(result.pack)
    if warning:
        LOGGER.warning(f"WARNING pack {split}: {warning}")
    return result


def _remove_leftovers_if_idle(folder: Path) -> None:
    """After reusing a pack: a dead builder's temporary file goes too, if no build runs there now."""
    if not leftovers(folder)[0]:
        return
    lock = FolderLock(folder)
    # a read-only folder, a lock file that is not yolofeed's: the files stay, nothing else is wrong
    with contextlib.suppress(OSError, PackError):
        if lock.try_acquire():
            try:
                current().remove_leftovers(folder)
            finally:
                lock.release()


def open_or_build(data: str | os.PathLike | dict, split: str = "train", imgsz: int = 640, format: str = codecs.DEFAULT,
                  out: str | os.PathLike | None = None, rebuild: str = "never", workers: int = 0,
                  progress: bool = True, sync: bool = False, verify: bool = False, task: str = "detect", *,
                  storage: str | None = None) -> Pack:
    """The pack of one split, valid for ``imgsz``/``format`` and the current source files.

    Says what ``yolofeed pack`` says: the summary after a build (a warning when images were
    skipped: their reasons and the report file), and a one-line reminder of skipped images when an
    existing pack is reused. See ``ensure_split`` for the arguments and errors.
    """
    r = ensure_split(data, split, imgsz, _format_from_storage(format, storage), out, rebuild, workers, progress, sync,
                     verify, task)
    skipped = r.pack.header["skipped"]
    if r.built:
        (LOGGER.warning if skipped else LOGGER.info)(summary(r))
    elif skipped:
        reasons = commonest_reasons(skipped, SKIP_REASONS_SAID)
        top = "; ".join(kind.said() for kind in reasons)
        rest = len(skipped) - sum(kind.count for kind in reasons)
        more = f"; and {rest} more" if rest else ""
        LOGGER.warning(f"pack {split}: {len(skipped)} image(s) were skipped when it was built ({top}{more}); "
                       f"{where_listed(r.pack.path, len(skipped), len(r.pack.header['notes']))}")
    return r.pack

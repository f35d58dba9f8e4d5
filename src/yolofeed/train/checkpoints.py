"""A run's checkpoints written so that a kill never costs the previous one, and the way on when one is damaged anyway.

Ultralytics writes ``last.pt``, ``best.pt`` and ``epochN.pt`` in place (``Path.write_bytes``: the file is truncated,
then written), and rewrites ``last.pt`` and ``best.pt`` in place again at the end (``strip_optimizer``). A SIGKILL, the
OOM killer or a power cut in that window leaves an empty or truncated file, and the checkpoint it replaced is gone:
the run cannot be resumed, or its best weights are lost. Here each is written to a new temporary file in the same
folder, fsynced, and renamed over the old one: a reader sees the old file or the new one, whole. The final strip
on a disk without room for the new file is the exception: it strips in place, as stock does (``strip_atomically``).
Each write costs the disk's time for one checkpoint, fsync included (26 MB for yolo11n with AdamW's state: about 30 ms
a file on an H100 machine; 5 MB once stripped); save_model's are made in a thread beside the training
(train/writes.py).

A writer killed mid-write leaves its temporary file (``.last.pt.tmp-<pid>-<8 hex digits>``); the next save in that
folder removes those of writers that are no longer running, when they hold nothing or the start of a checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import pickle
import re
import shlex
import stat
import zipfile
from pathlib import Path
from typing import Any

from yolofeed import atomic
from yolofeed.atomic import CLOEXEC, MEANINGS, NOFOLLOW, read_back, write_atomically

NO_ROOM = {MEANINGS[errno.ENOSPC], MEANINGS[getattr(errno, "EDQUOT", errno.ENOSPC)]}  # where the strip goes in place
TEMP = re.compile(r"\.(?P<name>.+\.pt)\.tmp-(?P<pid>\d+)-[0-9a-f]{8}")
ZIP = b"PK\x03\x04"  # torch.save's format (a zip archive) starts so
EPOCH_FILE = re.compile(r"epoch(\d+)\.pt")
# What unpickling a damaged or foreign file raises: Ultralytics turns most into a TypeError naming the checkpoint;
# random bytes also give these (1 file in 15).
UNPICKLING_ERRORS = (TypeError, pickle.UnpicklingError, UnicodeDecodeError, ValueError, OverflowError, EOFError,
                     RuntimeError)


RUN_FIXES = {  # errno -> what to do where a run's own files cannot be written
    errno.ENOSPC: "free some space, or train with project= on another disk",
    getattr(errno, "EDQUOT", errno.ENOSPC): "free some space, or train with project= on another disk",
    errno.EFBIG: "raise the limit (ulimit -f unlimited)",  # whether to resume then is the trainer's line to say
    # first what lets a resume go on in the same folder (a resume keeps its run's folder), then a new run's way
    errno.EROFS: "mount the disk read-write again, or train with project= a folder you can write",
    errno.EACCES: "make the run's weights folder writable again, or train with project= a folder you can write",
    errno.EPERM: "make the run's weights folder writable again, or train with project= a folder you can write",
}


def write_run_file(path: str | os.PathLike, data: bytes | bytearray | memoryview) -> int:
    """``write_atomically`` for a file of a training run, its failure naming a training run's fix (``RUN_FIXES``)."""
    return write_atomically(path, data, RUN_FIXES)


class AtomicPath(type(Path())):
    """A path whose ``write_bytes`` replaces the file atomically (``write_atomically``); everything else is Path's.

    ``AtomicPath(folder) / name`` is an ``AtomicPath`` too (pathlib keeps the class).
    """

    def write_bytes(self, data: Any) -> int:
        return write_run_file(self, data)


def strip_atomically(path: Path, updates: dict | None = None) -> dict:
    """Ultralytics' ``strip_optimizer`` of ``path`` (the final checkpoint: EMA weights in half precision, no
    optimizer), written to a temporary file renamed over ``path`` instead of over it in place.

    The temporary file needs room for one more (stripped) checkpoint beside ``path``, where the in-place strip needs
    none and frees the optimizer's room (about 4/5 of the file) for what follows: the final validation's figures.
    Where the disk or the quota has no room, ``path`` is stripped in place as Ultralytics strips it
    (``_strip_in_place``), with one line saying so: stock finishes such a run, so this one does. Where the folder
    refuses the write for another reason ``atomic.MEANINGS`` names, ``path`` is left whole, with its optimizer, and the
    run goes on with one line a file saying so.

    Returns:
        What ``strip_optimizer`` returns: the checkpoint saved, or {} when ``path`` was not a valid one (left as it
        was; Ultralytics says so) or could not be written (left as it was; said here).
    """
    from yolofeed.ultralytics_seam import LOGGER, strip_optimizer

    tmp = None

    def in_place_words(record: logging.LogRecord) -> bool:  # its line names the file as the in-place strip does
        if isinstance(record.msg, str):
            record.msg = record.msg.replace(f" saved as {tmp},", "")
        return True

    LOGGER.addFilter(in_place_words)
    try:
        try:
            fd, tmp = atomic.create_temp(path)
            os.close(fd)
            ckpt = strip_optimizer(path, s=str(tmp), updates=updates)
            if ckpt:  # the rename too: a folder made read-only meanwhile leaves path whole, as a failed write does
                fd = os.open(tmp, os.O_RDONLY | CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, path)
        except (OSError, RuntimeError) as e:
            fault = _strip_fault(path, e)
            if fault is None:
                raise
            if tmp is not None:
                with contextlib.suppress(OSError):  # the partial copy's room first
                    tmp.unlink(missing_ok=True)
            if fault in NO_ROOM and not path.is_symlink():  # a link planted meanwhile: never written through
                return _strip_in_place(path, updates, fault)
            command = ("from ultralytics.utils.torch_utils import strip_optimizer; "
                       f"strip_optimizer({json.dumps(str(path))})")
            LOGGER.warning(f"yolofeed: could not strip the optimizer from {path}: {fault} ({_first_line(e)}); "
                           f"it is left whole, with its optimizer ({path.stat().st_size / 1e6:.1f} MB), and loads and "
                           f"predicts as it is; Ultralytics' strip rewrites it in place: python -c "
                           f"{shlex.quote(command)}")
            return {}
        if ckpt:  # renamed: the stripped file is path's, whether or not the folder's entry is on the disk yet
            with contextlib.suppress(OSError):
                atomic.fsync_dir(path.parent)
    finally:
        LOGGER.removeFilter(in_place_words)
        if tmp is not None:
            try:
                tmp.unlink(missing_ok=True)
            except OSError as e:  # a folder made read-only: the stripped copy stays beside last.pt, said
                LOGGER.warning(f"yolofeed: could not remove {tmp} ({_first_line(e)}); it is a stripped copy of "
                               f"{path.name}, or part of one, and may be deleted")
    return ckpt


def _strip_in_place(path: Path, updates: dict | None, fault: str) -> dict:
    """Ultralytics' ``strip_optimizer`` of ``path`` in place, where there is no room for a stripped copy beside it
    (``fault``): the file is truncated, then written, as stock writes it (a kill in that write truncates it, as
    stock's). A write that fails, or is interrupted (Ctrl-C), gets the checkpoint's bytes, held here meanwhile,
    written back (the room the stripped write had is theirs); the interruption is then raised."""
    from yolofeed.ultralytics_seam import LOGGER, strip_optimizer

    plain = Path(os.fspath(path))  # the trainer's AtomicPath would need the room this lacks
    try:
        whole = plain.read_bytes()
    except (OSError, MemoryError) as e:
        LOGGER.warning(f"yolofeed: could not strip the optimizer from {path}: {fault}, and it could not be read to "
                       f"strip it in place ({_first_line(e)}); it is left whole, with its optimizer")
        return {}
    try:
        ckpt = strip_optimizer(plain, updates=updates)
    except BaseException as e:
        try:
            if plain.read_bytes() != whole:  # a write that failed before truncating left it as it was
                plain.write_bytes(whole)
        except OSError as again:
            LOGGER.warning(f"yolofeed: {path} could not be stripped in place ({_first_line(e)}) nor written back "
                           f"({_first_line(again)}): it is damaged; free some space and load the run's other "
                           f"checkpoints ({'last.pt' if path.name == 'best.pt' else 'best.pt'}, epochN.pt)")
            if not isinstance(e, (OSError, RuntimeError)):
                raise
            return {}
        if not isinstance(e, (OSError, RuntimeError)):
            raise
        LOGGER.warning(f"yolofeed: could not strip the optimizer from {path}: {fault} ({_first_line(e)}); it is "
                       f"left whole, with its optimizer ({len(whole) / 1e6:.1f} MB), and loads and predicts as it is")
        return {}
    if ckpt:
        LOGGER.warning(f"yolofeed: no room beside {path} for a stripped copy ({fault}): stripped in place, as "
                       f"Ultralytics strips it, {len(whole) / 1e6:.1f} → {plain.stat().st_size / 1e6:.1f} MB")
    return ckpt


def _strip_fault(path: Path, e: BaseException) -> str | None:
    """What a failed strip of ``path`` means, where the write failed for a reason ``atomic.MEANINGS`` names;
    None for any other failure. torch's zip writer raises a full disk as a RuntimeError without an errno (``unexpected
    pos``, ``iostream error``): it is taken as one where the folder has less room left than ``path`` takes (a full
    quota with room on the disk is not seen so, and is raised)."""
    if isinstance(e, OSError):
        return MEANINGS.get(e.errno)
    try:
        room = os.statvfs(path.parent)
        full = room.f_bavail * room.f_frsize < path.stat().st_size
    except (OSError, AttributeError):  # AttributeError: no statvfs (Windows)
        return None
    return MEANINGS[errno.ENOSPC] if full else None


def _first_line(e: BaseException) -> str:
    """An error's own words, one line (torch's writer errors run to several, with a C++ stack)."""
    said = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
    return (said.strip().splitlines() or [type(e).__name__])[0][:160]


def trim_results(csv: Path, epochs: int) -> list[int]:
    """Remove from ``csv`` (a run's results.csv) the rows of epochs after ``epochs`` (1-based, as its first column
    counts them); returns the epochs removed.

    Ultralytics appends an epoch's row before it saves that epoch's last.pt: a run killed between the two, or resumed
    from an older checkpoint, trains those epochs again and would append their rows a second time. Only a row whose
    first field is a whole number is a row; the header, the rows kept and every other line stay byte for byte. The
    file is rewritten atomically: a link at ``csv`` is replaced by the file, its target left as it was (as every
    file yolofeed writes in a run folder).

    Raises:
        WriteError: the rewrite failed for a reason a user can fix; ``csv`` is as it was.
        OSError: any other failed rewrite, the same way.
    """
    try:
        data = read_back(csv)
    except (OSError, ValueError):  # none yet (no epoch ended), unreadable, or no regular file (a FIFO; refused at the
        return []  # run folder's check, checks.check_run_folder): Ultralytics' own append says so
    kept, removed = [], []
    for line in data.splitlines(keepends=True):
        first = line.split(b",", 1)[0].strip()
        if first.isdigit() and int(first) > epochs:
            removed.append(int(first))
        else:
            kept.append(line)
    if removed:
        write_run_file(csv, b"".join(kept))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:  # Windows: no signal 0; keep the file
        return True
    return True


def sweep(folder: Path) -> list[Path]:
    """Remove the temporary checkpoints in ``folder`` left by writers that died mid-write; returns those removed.

    Only a regular file named as ``atomic.create_temp`` names them, of a process that no longer runs, holding nothing
    (killed before its first byte) or the start of a torch checkpoint. Anything else is left alone.
    """
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        m = TEMP.fullmatch(entry.name)
        if m is None or int(m["pid"]) == os.getpid() or _alive(int(m["pid"])):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | CLOEXEC)
        except OSError:
            continue
        try:
            ours = stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(ZIP)) in (b"", ZIP)
        except OSError:
            ours = False
        finally:
            os.close(fd)
        if ours:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def damage(path: str | os.PathLike) -> str | None:
    """What is wrong with a checkpoint's zip archive (``torch.save``'s format), in words, or None: intact, or not a
    zip archive (torch's legacy format, or a file ``torch.load`` refuses itself). ``torch.load`` does not check the
    entries' CRC-32s, so flipped bytes load as wrong weights and optimizer state; a truncated archive (a zip's start,
    no directory at its end) is named here because Ultralytics' own refusal of it first looks its name up on GitHub.
    Reads the whole file (a fraction of a second for the largest YOLO weights)."""
    try:
        if not zipfile.is_zipfile(path):
            with open(path, "rb") as f:
                started = f.read(len(ZIP)) == ZIP
            return "truncated: a zip archive's start without the directory at its end (a write or a copy cut " \
                   "short)" if started else None
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return None
    return None if bad is None else (f"its entry {bad} fails the checksum written with it (bytes changed on disk or "
                                     "in a copy), and would load as wrong weights")


def resume_named(resume: Any) -> str | None:
    """The checkpoint a trainer's ``resume`` argument names before Ultralytics reads it: an existing file, or with
    ``resume=True`` the newest last*.pt under the working folder (Ultralytics' ``get_latest_run``); None: no resume,
    or nothing there (Ultralytics says so)."""
    if isinstance(resume, (str, Path)) and str(resume).lower() not in ("", "true", "false"):
        return str(resume) if Path(resume).is_file() else None
    if resume is True or str(resume).lower() == "true":
        from yolofeed.ultralytics_seam import get_latest_run

        latest = get_latest_run()
        return latest if latest and Path(latest).is_file() else None
    return None


def check_intact(path: str | os.PathLike, key: str = "resume", once: bool = False) -> None:
    """Refuse a checkpoint whose bytes changed or were cut short since it was written (``damage``). ``once``: where
    the last file this process found intact is this one, unchanged (its real path, size and modification time), it is
    not read again (``yolofeed train`` checks a resume's checkpoint, then the trainer it makes does); once only.

    Raises:
        ConfigError: naming the file, what is wrong and (``resume=``) the run's checkpoint to go on from.
    """
    global _last_intact
    seen, last = _signature(path), _last_intact
    _last_intact = None
    if once and seen is not None and seen == last:
        return
    what = damage(path)
    if what is None:
        _last_intact = seen
        return
    from yolofeed.errors import ConfigError

    on = way_on(path) if key == "resume" else "point at another copy of the weights, or train from a model yaml"
    raise ConfigError(f"{key}={path}: damaged: {what}; {on}")


_last_intact: tuple[str, int, int] | None = None  # the last file check_intact found intact (``_signature``)


def _signature(path: str | os.PathLike) -> tuple[str, int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return os.path.realpath(path), st.st_size, st.st_mtime_ns


def _loaded(path: Path, checked: bool = False) -> dict | None:
    """A checkpoint's dict, or None where it is missing, does not load or is damaged (``damage``, unless ``checked``
    already)."""
    from yolofeed.ultralytics_seam import torch_safe_load

    # a missing file is not handed to Ultralytics, which would look its name up on GitHub
    if not Path(path).is_file() or (not checked and damage(path) is not None):
        return None
    try:
        ckpt, _ = torch_safe_load(str(path))
    except (*UNPICKLING_ERRORS, AttributeError, OSError):
        return None
    return ckpt if isinstance(ckpt, dict) else None


def resumable_epoch(path: Path) -> int | None:
    """The epoch (0-based) a checkpoint can resume after, or None: it does not load, or holds a finished run (no
    optimizer state: ``strip_optimizer`` made it)."""
    ckpt = _loaded(path)
    if ckpt is None or ckpt.get("optimizer") is None or not isinstance(ckpt.get("epoch"), int):
        return None
    return ckpt["epoch"] if ckpt["epoch"] >= 0 else None


def model_classes(path: str | os.PathLike) -> int | None:
    """The number of classes a checkpoint's model (its EMA's, else its own) predicts, or None: it does not load or
    holds no model that says. A read of the whole checkpoint (its checksums are not checked here: ``check_intact``)."""
    ckpt = _loaded(Path(path), checked=True)
    model = ckpt and (ckpt.get("ema") or ckpt.get("model"))
    nc = getattr(model, "nc", None)
    if nc is None:
        nc = (getattr(model, "yaml", None) or {}).get("nc")
    return int(nc) if isinstance(nc, int) else None


def nothing_to_resume(ckpt: dict, epochs: int | None = None) -> str | None:
    """Why a checkpoint that loads cannot be resumed, in words to follow its path; None where it can. Ultralytics'
    ``resume_training`` asserts ``0 < epoch + 1 < epochs`` (RELIED_ON), with a traceback: a finished run's checkpoint
    (stripped: epoch -1), or one holding every epoch of its run not yet stripped (a run stopped between its last
    epoch's save and the final strip, whose final validation never ran). ``time=`` recounts the epochs only after an
    epoch trained: the assertion holds with it too. ``epochs``: the run's, where known
    (the trainer's); else the checkpoint's own arguments'."""
    epoch = ckpt.get("epoch", -1)
    if not isinstance(epoch, int) or epoch < 0:
        return "is the checkpoint of a finished run (no epoch or optimizer state left)"
    if epochs is None:
        epochs = (ckpt.get("train_args") or {}).get("epochs")
    if isinstance(epochs, int) and not isinstance(epochs, bool) and epoch + 1 >= epochs:
        return (f"holds every epoch of its run ({epoch + 1} of {epochs}: the run stopped before its final "
                f"validation; validate its best.pt with yolo val)")
    return None


def refuse_nothing_to_resume(path: str | os.PathLike, ckpt: dict | None = None, epochs: int | None = None) -> None:
    """Refuse to resume the checkpoint at ``path`` (``ckpt``, where loaded already; else read once more, its bytes
    checked already) where ``nothing_to_resume`` says why; a stripping writer's copy beside it, where the run was
    killed in its strip, swept first. One that does not load is left to Ultralytics' resume, which says so.

    Raises:
        ConfigError: a finished run's checkpoint, or one holding every epoch of its run.
    """
    from yolofeed.errors import ConfigError

    ckpt = ckpt if ckpt is not None else _loaded(Path(path), checked=True)
    if ckpt is not None and (why := nothing_to_resume(ckpt, epochs)):
        sweep(Path(path).parent)
        raise ConfigError(f"{path} {why}: nothing to resume. Start a new run from it with "
                          f"{shlex.quote(f'model={path}')} and no resume")


def finished_run(path: Path) -> bool:
    """Whether a checkpoint loads and holds a finished run (no optimizer state: ``strip_optimizer`` made it)."""
    ckpt = _loaded(path)
    return ckpt is not None and ckpt.get("optimizer") is None


def newest_resumable(damaged: Path) -> tuple[Path, int] | None:
    """The checkpoint beside ``damaged`` that resumes furthest: ``best.pt``, or the newest ``epochN.pt`` that loads.

    Reads best.pt and the epoch files from the newest down until one loads (a read each).
    """
    folder = damaged.parent
    found = []
    best = folder / "best.pt"
    if best != damaged and (epoch := resumable_epoch(best)) is not None:
        found.append((epoch, best))
    numbered = sorted(((int(m[1]), p) for p in folder.glob("epoch*.pt") if (m := EPOCH_FILE.fullmatch(p.name))),
                      reverse=True)
    for _, p in numbered:
        if p != damaged and (epoch := resumable_epoch(p)) is not None:
            found.append((epoch, p))
            break
    if not found:
        return None
    epoch, path = max(found, key=lambda x: x[0])
    return path, epoch


def way_on(damaged: str | os.PathLike) -> str:
    """What to do when ``resume=`` names a checkpoint that does not load: the run's checkpoint to go on from."""
    path = Path(damaged)
    found = newest_resumable(path)
    if found is None:
        return (f"no other checkpoint in {path.parent} loads (best.pt, epochN.pt): start the run again, from a model "
                "yaml such as model=yolo11n.yaml")
    other, epoch = found
    return (f"the newest checkpoint of this run that loads is {other} (saved after epoch {epoch + 1}): continue from "
            f"it with: {shlex.join(['yolofeed', 'train', f'resume={other}'])}")

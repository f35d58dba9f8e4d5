"""Build pack files in parallel, atomically, and open them only when they match their source.

One pass over the split: worker processes verify a sample each and have the format's codec encode it
(``yolofeed.pack.codecs``; raw: decode and resize, where JPEG decode dominates the CPU cost, ~2 ms per
640x480 image per core), take its CRC32 and write its payload at an offset they reserve from a shared
counter, so payloads never travel back through a pipe; the parent only collects metadata and labels.
Every payload is then read back and checked against its CRC32 (threads; zlib releases the GIL), the
index, labels and header are appended, and the file, written under a temporary name, is renamed into
place. The two CRC32 passes cost 0.3-0.55 ms per 640-px raw image each on the 2-core development
machine (1.7-3 GB/s), next to ~2.5 ms of decode and resize: the read-back took 0.1-0.3 s of 1.4-2.7 s
builds of 512 such images there (noisy, shared cores).

Faults, and what a build does about them (RELIABILITY.md lists each case with its test):

* Killed at any moment (``kill -9``, ``kill``, Ctrl-C, the OOM killer, a crashed DDP rank): no file a
  reader accepts appears under the pack's name. Workers die with their parent (``PR_SET_PDEATHSIG``
  on Linux; elsewhere, and as a second line, a thread in each worker watches the parent) and never
  hold the folder's lock (pack/lock.py), so a later build neither waits forever nor finds a stale
  lock; it removes the dead builder's temporary file. While a build runs, SIGTERM stops it as Ctrl-C
  does: workers stopped, temporary file removed, exit status 143.
* Disk space: checked before writing against the pack's size, estimated from up to 256 image
  headers. Payloads of a format with a largest size (``Codec.max_payload``: raw pixels) go through a
  shared mmap only once ``posix_fallocate`` has reserved every byte (on a tmpfs: once each payload's
  pages are faulted in by ``madvise(MADV_POPULATE_WRITE)``, which reports a full tmpfs as an error);
  otherwise through ``pwrite``, which reports a full disk as an error where a write to an unbacked mmap
  page would kill the process with SIGBUS. A full disk, a worker that died or any other failure ends in
  one ``PackError`` that says what happened and what to do, with the temporary file removed.
* A dataset folder that is not writable (shared read-only datasets): packs go to the user's cache
  folder instead, and the log says where (``pack_folders``).
* A folder that holds other files, or is shared with other users: every file a build writes there is
  opened without following a link, under a name taken with ``O_EXCL`` (``pack/files.py``); the
  temporary file starts with the pack's preamble, and only files so named that start so are swept as
  leftovers; a pack or report is replaced only where what is there is one yolofeed wrote. Anything
  else under those names is refused with one line that names it.

A pack is rebuilt when a source file's path, size or modification time changes, or ``nc`` does: the
rule of Ultralytics' label cache (``get_hash`` over label and image files). A label file edited in
place to the same size with its modification time put back passes that rule, in Ultralytics too;
``rebuild=check`` also compares the CRC32 of every label file's bytes with the ones recorded at build
time (one read of each label file: small files, about a second per 100k on a local disk).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import logging
import mmap
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from tqdm import tqdm

from yolofeed import __version__
from yolofeed.config import PackConfig, usable_cores
from yolofeed.errors import ConfigError, DatasetError, NewerPackError, PackError, PackSpaceError, StalePackError
from yolofeed.pack import codecs, files
from yolofeed.pack.files import TMP_MARK
from yolofeed.pack.lock import FolderLock
from yolofeed.pack.source import SplitSource, load_data_yaml, split_source
from yolofeed.pack.store import (
    CONTROL,
    INDEX_DTYPE,
    PREAMBLE,
    SUFFIX,
    Pack,
    _pwrite_all,
    align,
    is_pack_file,
    payload_crcs,
    printable,
    rebuild_command,
    store_dir,
    write_tail,
)
from yolofeed.pack.verify import SampleError, file_problem, load_sample
from yolofeed.pack.workers import WorkerDied, Workers, mp_context, signals_between_waits
from yolofeed.processes import die_with_parent, process_start, sigterm_exits
from yolofeed.ultralytics_seam import packaged

LOGGER = logging.getLogger(__name__)
# a build's temporary files: ".<split>.yfpack.tmp-<pid>-<token>" and ".<split>.report.txt.tmp-<pid>-<token>"
TEMP_NAME = re.compile(rf"^\.(?P<name>.+){re.escape(TMP_MARK)}\d+-[0-9a-f]{{8}}$")
# the report's first line, as every yolofeed has written it: what proves a report file to be yolofeed's
REPORT_SUFFIX = ".report.txt"
REPORT_HEAD = re.compile(rb"# [^\n]+\.yfpack: \d+ skipped, \d+ notes\. file<TAB>status<TAB>reason\n")
REBUILDS = ("never", "auto", "check", "always")
DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}
SPACE_SAMPLE = 256  # image headers read to estimate a pack's size before building it
MOVE_HINT = "put the packs on a disk with room: out=/path (yolofeed pack) or pack_dir=/path (yolofeed train)"


def cache_root() -> Path:
    """Where packs go when the dataset's folder is not writable: the user's cache folder."""
    if os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "yolofeed" / "packs"


def pack_folders(yaml_file: str | os.PathLike, imgsz: int, storage: str,
                 out: str | os.PathLike | None = None) -> list[Path]:
    """Where the packs of a data yaml may be, in order of preference.

    ``[<out>/<yaml stem>-<format>-<imgsz>]`` when ``out`` is given; else beside the yaml (``store_dir``), then
    ``<cache_root>/<yaml stem>-<hash of the yaml's path>/<stem>-<format>-<imgsz>`` for datasets whose
    folder is read-only (the hash keeps two datasets' ``data.yaml`` apart). A yaml Ultralytics ships
    (``data=coco8.yaml``) gets the cache folder only: packs never go into the installed package.
    """
    if out:
        return [store_dir(yaml_file, imgsz, storage, out)]
    y = Path(yaml_file).resolve()
    key = hashlib.sha256(os.fsencode(str(y))).hexdigest()[:12]
    cache = cache_root() / f"{y.stem}-{key}" / f"{y.stem}-{storage}-{imgsz}"
    return [cache] if packaged(y) else [store_dir(y, imgsz, storage), cache]


@dataclass
class BuildResult:
    """What one split's build did, for the summary and the report file."""

    pack: Pack
    built: bool  # False: an up-to-date pack was reused
    seconds: float = 0.0
    verified: bool = False  # every payload's checksum was read back (verify=True on a reused pack)


# -- worker side: runs in each build process ---------------------------------------------------
_W: dict[str, Any] = {}
# madvise(MADV_POPULATE_WRITE), Linux 5.14+: a payload's pages faulted in, writable, in one call
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23 if sys.platform.startswith("linux") else None)


def _init_worker(tmp_path: str, counter: Any, nc: int, imgsz: int, storage: str, mapped: int, backed: bool = True,
                 parent: tuple[int, float] | None = None) -> None:
    """Open the temporary file (and map it when ``mapped`` bytes were reserved) in a build worker.

    Args:
        backed: the mapped bytes are allocated on the disk. False (a tmpfs file merely extended): a payload goes
            through the mapping only once the populate advice has faulted its pages in.
        parent: (PID, start time) of the building process for a worker process; None in-process.
    """
    if parent is not None:
        die_with_parent(*parent)  # signals: see workers._serve
    fd = os.open(tmp_path, os.O_RDWR | files.SAFE)
    # Raw packs are written through a shared mapping of the file: 16 processes copy into the page cache at
    # ~12 GB/s, where pwrite serialises on the file's inode lock at ~4.5 GB/s (measured on the H200 machine,
    # BENCHMARKS.md). Only where every byte is allocated (or, not ``backed``, every payload's pages faulted in
    # first): a page the filesystem cannot back (disk full) would kill the writer with SIGBUS.
    mm = mmap.mmap(fd, mapped) if mapped else None
    _W.update(fd=fd, mm=mm, counter=counter, nc=nc, imgsz=imgsz, storage=storage, mapped=mapped, populate=True,
              backed=backed)
    import cv2

    cv2.setNumThreads(1)  # one image per process; OpenCV's own threads would only contend


def _close_worker() -> None:
    if _W.get("mm") is not None:
        _W.pop("mm").close()
    if "fd" in _W:
        os.close(_W.pop("fd"))


def _label_crc(lb_file: str) -> int:
    """CRC32 of a label file's bytes; 0 when it is missing, not a regular file or cannot be read.

    A FIFO, socket or device is not read (it could block forever): Ultralytics' ``os.path.isfile`` test
    calls it missing, and so does ``read_labels``. Opened without blocking, then checked on the open
    descriptor, so a file swapped for a FIFO between a check and the open cannot hang the build either.
    """
    try:
        fd = os.open(lb_file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError:
        return 0
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return 0
        with open(fd, "rb", closefd=False) as f:
            return zlib.crc32(f.read())
    except OSError:
        return 0
    finally:
        os.close(fd)


def _process(task: tuple[int, str, str]) -> tuple:
    """Verify, decode and store one sample; returns its label file's CRC32 and metadata (never its pixels)."""
    i, im_file, lb_file = task
    lcrc = _label_crc(lb_file)
    try:
        s = load_sample(im_file, lb_file, _W["nc"], _W["imgsz"], _W["storage"])
    except SampleError as e:
        return i, lcrc, str(e), None
    except Exception as e:  # anything else Ultralytics would also count as corrupt: report, don't die
        return i, lcrc, f"{type(e).__name__}: {e}", None
    payload = memoryview(np.ascontiguousarray(s.payload)).cast("B")
    crc = zlib.crc32(payload)  # ~0.6 ms for a 640x480 raw image, next to ~2.5 ms of decode and resize
    with _W["counter"].get_lock():  # reserve [offset, offset + nbytes) in the shared file
        offset = _W["counter"].value
        _W["counter"].value = align(offset + payload.nbytes)
    if _W["mm"] is not None and offset + payload.nbytes <= _W["mapped"] and _populate(_W["mm"], offset, payload.nbytes):
        _W["mm"][offset:offset + payload.nbytes] = payload
    else:
        _pwrite_all(_W["fd"], payload, offset)  # a full disk raises ENOSPC here, in the parent's map
    return i, lcrc, None, (offset, payload.nbytes, crc, *s.ori_hw, *s.hw, s.labels, s.notes)


def _populate(mm: mmap.mmap, offset: int, nbytes: int) -> bool:
    """Fault in the pages of ``mm[offset:offset + nbytes]``, writable, before the copy writes them.

    A 0.9 MB payload's copy otherwise faults its ~225 pages in one by one, at about 1.5x the kernel time of one
    madvise first (BENCHMARKS.md, "Pack build rate"). Where the kernel refuses the advice (before Linux 5.14:
    EINVAL) the copy faults them as before, and this worker stops asking.

    Returns:
        False where the kernel says these pages cannot be backed (EFAULT, a full disk: a reservation a copy-on-write
        filesystem did not keep, or a full tmpfs), where the copy would die of SIGBUS: the caller writes with pwrite
        instead, which fails with a clean ENOSPC. False also where nothing was reserved (``_W["backed"]`` False) and
        the advice is unavailable. True otherwise.
    """
    if MADV_POPULATE_WRITE is None or not _W.get("populate", True):
        return _W.get("backed", True)
    start = offset - offset % mmap.PAGESIZE
    try:
        mm.madvise(MADV_POPULATE_WRITE, start, offset + nbytes - start)
    except OSError as e:
        if e.errno == errno.EFAULT or e.errno in DISK_FULL:
            return False
        then = "the copies fault pages in" if _W.get("backed", True) else "nothing is reserved: payloads go by pwrite"
        LOGGER.debug(f"pack worker: madvise(MADV_POPULATE_WRITE) refused ({e}); {then}")
        _W["populate"] = False
        return _W.get("backed", True)
    return True


def _process_chunk(tasks: list[tuple[int, str, str]]) -> list[tuple]:
    return [_process(t) for t in tasks]


class _Writeback(threading.Thread):
    """Flush the file to disk every ``interval`` seconds while workers fill it.

    The kernel would start writing only at its dirty threshold (10 % of RAM), leaving the whole
    file to the final fsync (9 GB: ~4 s at the H200 machine's ~2.4 GB/s); flushing as we go
    overlaps that with decoding.
    """

    def __init__(self, fd: int, interval: float = 1.0):
        super().__init__(daemon=True)
        self.fd, self.interval, self.stop = fd, interval, threading.Event()
        self.sync = getattr(os, "fdatasync", os.fsync)  # no fdatasync on macOS and Windows

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self.sync(self.fd)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.join()


# -- parent side ------------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold the folder's build lock; once held, remove what builders that died left behind.

    Raises:
        PackError: the folder has no space left even for the lock's record.
    """
    lock = FolderLock(folder)
    try:
        lock.acquire()
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        raise PackError(f"no space left in {folder}, not even for the build lock ({e.strerror}); free some space, "
                        f"or {MOVE_HINT}") from None
    try:
        _remove_leftovers(folder)
        yield
    finally:
        lock.release()


def _leftovers(folder: Path) -> tuple[list[Path], list[Path]]:
    """The temporary files of builds in ``folder``: those proven to be yolofeed's, and those only named like them.

    Proven: a regular file (not a link), named as a build names its temporary files, that starts as yolofeed writes
    them (the pack's preamble, the report's first line). A file of any other kind or content is not yolofeed's
    to delete, whatever its name.
    """
    ours, others = [], []
    for path in folder.glob(f".*{TMP_MARK}*"):
        m = TEMP_NAME.match(path.name)
        if m is None:
            continue
        start = files.head(path, 256)  # None: a link, a folder, a FIFO ...
        if start is not None and (m["name"].endswith(SUFFIX) and start.startswith(PREAMBLE)
                                  or m["name"].endswith(REPORT_SUFFIX) and REPORT_HEAD.match(start)):
            ours.append(path)
        else:
            others.append(path)
    return ours, others


def _remove_leftovers(folder: Path) -> None:
    """Delete the temporary files of builds that did not finish; only under the folder's lock, when no one else can be
    writing them, and only those proven to be yolofeed's (``_leftovers``)."""
    ours, others = _leftovers(folder)
    for stale in ours:
        with contextlib.suppress(OSError):
            size = stale.stat().st_size
            stale.unlink()
            LOGGER.info(f"pack: removed {stale.name} ({size / 1e6:,.0f} MB), left by a build that did not finish")
    for other in others:
        LOGGER.info(f"pack: left {other} alone ({files.describe(other)}): it is named as a yolofeed temporary file, "
                    "but yolofeed did not write it (an older yolofeed did, or another program); delete it yourself if "
                    "nothing needs it")


def _remove_leftovers_if_idle(folder: Path) -> None:
    """After reusing a pack: a dead builder's temporary file goes too, if no build runs there now."""
    if not _leftovers(folder)[0]:
        return
    lock = FolderLock(folder)
    # a read-only folder, a lock file that is not yolofeed's: the files stay, nothing else is wrong
    with contextlib.suppress(OSError, PackError):
        if lock.try_acquire():
            try:
                _remove_leftovers(folder)
            finally:
                lock.release()


@dataclass
class _Space:
    free: int  # bytes free in the pack folder before the build
    estimate: int  # bytes the pack is expected to take
    bound: int  # bytes it takes at most (the format's largest payload for every image), else the estimate


def _gb(nbytes: float) -> str:
    """A size for messages: 9.32 GB, 184.5 MB, 12 KB."""
    if nbytes >= 1e9:
        return f"{nbytes / 1e9:,.2f} GB"
    return f"{nbytes / 1e6:,.1f} MB" if nbytes >= 1e6 else f"{nbytes / 1e3:,.0f} KB"


def _plan_space(src: SplitSource, folder: Path, imgsz: int, storage: str) -> _Space:
    """Compare the pack's size with the folder's free space before writing anything.

    The size is estimated from the headers of up to ``SPACE_SAMPLE`` images, evenly spread (exact
    for smaller splits; a header read is a fraction of a millisecond).

    Raises:
        PackError: the pack will not fit; the message gives bytes needed and free, the folder and the fix.
    """
    n, codec = len(src.im_files), codecs.get(storage)
    estimate, tail, sampled = _estimate(src, imgsz, storage)
    largest = codec.max_payload(imgsz)
    bound = int(n * align(largest) + tail) if largest is not None else estimate
    free = shutil.disk_usage(_existing_ancestor(folder) or folder).free  # a folder the build has yet to make
    if free < estimate:
        how = "" if sampled == n else f", estimated from the headers of {sampled} of its {n:,} images"
        raise PackSpaceError(f"not enough free space for the {src.split} pack in {folder}: it needs "
                             f"{_gb(estimate)} ({estimate:,} bytes{how}), {_gb(free)} ({free:,} bytes) are free. "
                             f"Free some space, or {MOVE_HINT}")
    return _Space(free, estimate, bound)


def _tail_bytes(src: SplitSource, label_bytes: list[int]) -> float:
    """Everything of a pack but the payloads: index + label CRC + worst-case header and report lines per image,
    labels at most twice their text, the paths, and the header's fixed part (class names, ~2 KB of keys)."""
    n = len(src.im_files)
    tail = n * (INDEX_DTYPE.itemsize + 4 + 256 + 2 * float(np.mean(label_bytes) if label_bytes else 0))
    return tail + sum(len(os.fsencode(f)) + 1 for f in src.im_files) + len(json.dumps(list(src.names), indent=1)) + 4096


def estimate_bytes(src: SplitSource, imgsz: int, storage: str) -> int:
    """The size of a split's pack in ``storage``, from the headers of up to ``SPACE_SAMPLE`` images evenly spread
    (exact for smaller splits; a header read is a fraction of a millisecond)."""
    return _estimate(src, imgsz, storage)[0]


def _estimate(src: SplitSource, imgsz: int, storage: str) -> tuple[int, float, int]:
    """``estimate_bytes``, the part of it that is not payloads, and how many image headers were read."""
    n, codec = len(src.im_files), codecs.get(storage)
    picks = np.unique(np.linspace(0, n - 1, min(n, SPACE_SAMPLE)).round().astype(np.int64)) if n else []
    payloads, label_bytes = [], []
    for i in picks.tolist():
        if file_problem(src.im_files[i]):  # skipped by the build; a FIFO would block the header read forever
            continue
        try:
            payloads.append(codec.payload_estimate(src.im_files[i], imgsz))
        except Exception:  # an unreadable image is skipped by the build: it takes no space
            continue
        with contextlib.suppress(OSError):
            label_bytes.append(os.path.getsize(src.label_files[i]))
    tail = _tail_bytes(src, label_bytes)
    return int(n * float(np.mean(payloads) if payloads else 0) + tail), tail, len(payloads)


def build_split(src: SplitSource, dest: Path, imgsz: int, storage: str = codecs.DEFAULT, workers: int = 0,
                progress: bool = True, sync: bool = False) -> Pack:
    """Verify, decode and write every sample of ``src`` into the pack file ``dest``.

    Bad samples are skipped and listed in the header and in ``<split>.report.txt``. Call under
    ``_locked(dest.parent)``.

    Args:
        sync: fsync the file before publishing it, so it survives a power loss too. Without it the
            build is still atomic against a killed process (the page cache outlives the process)
            and the kernel writes the file back within about 30 s; a crash inside that window
            leaves a file that is short of its trailer, which ``Pack.open`` refuses. The cost is the
            disk's write time: about 4 s for the 9.32 GB synthetic 640-px pack on the H200 machine.

    Raises:
        DatasetError: no sample of the split is usable (the message lists the commonest reasons).
        PackError: the disk is (or would be) full, a worker process died, a payload read back wrong,
            or writing failed; nothing is published and the temporary file is removed.
    """
    codecs.get(storage)  # an unknown format: PackError, before anything is written
    t0 = time.perf_counter()
    n = len(src.im_files)
    workers = max(1, min(workers or usable_cores(), n))
    fingerprint = src.fingerprint()
    purpose = f"the {src.split} pack"
    files.check_replaceable(dest, is_pack_file, purpose)  # before the build's minutes, not only after them
    space = _plan_space(src, dest.parent, imgsz, storage)
    with sigterm_exits():  # a build stopped by SIGTERM removes its temporary file, as with Ctrl-C
        fd, tmp = files.create_temp(dest.parent, dest.name)
        try:
            try:
                os.write(fd, PREAMBLE)  # first: what proves the file to be yolofeed's, should the build die
                skipped, notes = _fill(src, tmp, fd, imgsz, storage, workers, progress, sync, fingerprint, space, t0)
                if sync:
                    os.fsync(fd)  # the rename below must not publish a file whose bytes are not on disk
            finally:
                os.close(fd)
            files.check_replaceable(dest, is_pack_file, purpose)  # again: what is there may have changed meanwhile
            os.replace(tmp, dest)
        except BaseException as e:  # KeyboardInterrupt and SIGTERM included: leave nothing half-written behind
            tmp.unlink(missing_ok=True)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                LOGGER.info(f"pack {src.split}: stopped; removed the unfinished {tmp.name}")
            if isinstance(e, OSError) and e.errno in DISK_FULL:
                raise PackError(f"the disk filled up while writing the {src.split} pack in {dest.parent} "
                                f"({e.strerror}): it needs about {_gb(space.estimate)}, {_gb(space.free)} were "
                                f"free when the build started. Nothing was published and the temporary file is "
                                f"removed. Free some space, or {MOVE_HINT}") from None
            if isinstance(e, OSError):
                raise PackError(f"writing the {src.split} pack in {dest.parent} failed: {e}. Nothing was "
                                f"published. If the folder is the problem, {MOVE_HINT}") from e
            raise
    if sync:
        _fsync_dir(dest.parent)
    try:
        _write_report(dest, skipped, notes)
    except PackError as e:  # something that is not yolofeed's report is under its name: left as it is
        LOGGER.warning(f"pack {src.split}: did not write its report: {e}; the skipped images and notes are in the "
                       "pack's header too")
    except OSError as e:  # the pack is whole and published; its report is a convenience (the header lists the same)
        LOGGER.warning(f"pack {src.split}: could not write {report_path(dest)} ({e.strerror or e}); "
                       "the skipped images and notes are in the pack's header too")
    return Pack.open(dest)


def _fill(src: SplitSource, tmp: Path, fd: int, imgsz: int, storage: str, workers: int, progress: bool, sync: bool,
          fingerprint: str, space: _Space, t0: float) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The body of ``build_split``: write every sample, check the payloads, append the tail to ``tmp`` (``fd``).

    Returns:
        The skipped samples and the notes, for the report file.
    """
    n = len(src.im_files)
    # A format whose payloads are bounded (raw pixels: imgsz x imgsz x 3) reserves that much up front when it
    # fits (write_tail gives back what was not used): on a sparse file every first write to a page allocates a
    # block under the filesystem journal, which held 16 writers to ~1,000 img/s on the H200 machine.
    largest = codecs.get(storage).max_payload(imgsz)
    capacity = len(PREAMBLE) + n * align(largest) if largest is not None else 0
    # One writer gains nothing from the mapping (pwrite outruns one core's decoding), and in-process a
    # SIGBUS (a full copy-on-write filesystem, whose reservations do not hold) would end the build's own process
    mapped, backed = 0, True
    if workers > 1 and space.free >= space.bound:
        if capacity and _in_memory(tmp.parent):  # tmpfs has no journal to spare, and its reservation allocates
            # every page of the bound in this process (1.3-2.5 s for 12 GB on the H200 machine) where the workers
            # would fault in only what they write, in parallel; each worker's populate advice, which reports a full
            # tmpfs as EFAULT, stands in for the reservation
            os.ftruncate(fd, capacity)
            mapped, backed = capacity, False
        elif _reserve(fd, capacity):
            mapped = capacity
    if capacity and not mapped and workers > 1:  # one writer never maps: nothing to say
        LOGGER.info(f"pack {src.split}: workers write with pwrite rather than a shared map (the disk space for the "
                    f"largest possible pack, {_gb(space.bound)}, is not reserved up front; {_gb(space.free)} free)")
    ctx = mp_context()
    counter = ctx.Value("Q", len(PREAMBLE))  # payloads go after the preamble
    initargs = (str(tmp), counter, src.nc, imgsz, storage, mapped, backed)
    me = (os.getpid(), process_start(os.getpid()) or 0.0)
    started = time.perf_counter()  # the phases' ends, for the header: what is fixed and what grows with n
    pool = Workers(workers, _init_worker, (*initargs, me) if workers > 1 else initargs, _close_worker, ctx)
    first = None
    index = np.zeros(n, INDEX_DTYPE)
    labels: list[np.ndarray | None] = [None] * n
    label_crc = np.zeros(n, np.uint32)
    skipped: list[tuple[str, str]] = []
    notes: list[tuple[str, str]] = []
    tasks = list(zip(range(n), src.im_files, src.label_files))
    chunk = max(1, min(64, n // (workers * 8)))
    why: dict[int, str] = {}  # results arrive in completion order; the report lists them in source order
    noted: dict[int, list[str]] = {}
    try:
        with (signals_between_waits() as check, _Writeback(fd) if sync else contextlib.nullcontext(),
              tqdm(total=n, unit="img", disable=not progress, desc=f"pack {src.split}") as bar):
            chunks = (tasks[k:k + chunk] for k in range(0, n, chunk))
            for i, lcrc, reason, meta in pool.imap(_process_chunk, chunks, check):
                first = first or time.perf_counter()
                bar.update()
                label_crc[i] = lcrc
                if reason is not None:
                    why[i] = reason
                    bar.set_postfix(skipped=len(why), refresh=False)
                    continue
                off, nbytes, crc, h0, w0, h, w, lb, sample_notes = meta
                index[i] = (off, nbytes, h0, w0, h, w, 0, len(lb), crc)
                labels[i] = lb
                noted[i] = sample_notes
    except WorkerDied as e:  # the workers are stopped already
        raise PackError(f"a worker process building the {src.split} pack died ({e}); nothing was published. "
                        "Signal 9 is usually the out-of-memory killer: build with fewer workers= ; a crash while "
                        "decoding one image is found with workers=1") from None
    except BaseException:
        pool.stop()
        raise
    pool.close()
    filled = time.perf_counter()
    skipped += [(src.im_files[i], why[i]) for i in sorted(why)]
    notes += [(src.im_files[i], note) for i in sorted(noted) for note in noted[i]]
    keep = np.array([lb is not None for lb in labels], bool)
    if not keep.any():
        top = Counter(r for _, r in skipped).most_common(3)
        raise DatasetError(f"no usable image in split '{src.split}' of {src.yaml_file} ({n} tried). "
                           "Commonest reasons:\n  " + "\n  ".join(f"{c}x {r}" for r, c in top))
    index = index[keep]
    kept_labels = [lb for lb in labels if lb is not None]
    kept_files = [f for f, k in zip(src.im_files, keep) if k]
    _check_written(tmp, fd, index, kept_files, workers, src.split)
    checked = time.perf_counter()
    counts = np.array([len(lb) for lb in kept_labels], np.int64)
    index["label_start"] = np.concatenate([[0], np.cumsum(counts)[:-1]])
    table = np.concatenate(kept_labels) if counts.sum() else np.zeros((0, 5), np.float32)
    missing = sum(1 for _, note in notes if note.startswith("label file missing"))
    seconds = time.perf_counter() - t0
    header = {
        "yolofeed_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "split": src.split, "imgsz": imgsz, "storage": storage, "channels": 3, "color": "RGB",
        "resize": "long side to imgsz, cv2.INTER_LINEAR, as Ultralytics BaseDataset.load_image",
        "source": {"data": src.yaml_file, "paths": list(src.paths), "nc": src.nc, "names": list(src.names),
                   "fingerprint": fingerprint, "label_dir": str(Path(src.label_files[0]).parent)},
        "counts": {"images": int(keep.sum()), "boxes": int(counts.sum()), "skipped": len(skipped),
                   "tried": n, "label_files": int(keep.sum()) - missing, "data_bytes": int(index["nbytes"].sum())},
        "skipped": skipped, "notes": notes,
        "build": {"workers": workers, "seconds": round(seconds, 3), "sync": sync,
                  # plan: fingerprint, space check, the file's reservation; start: the workers' start and the
                  # first chunk's images (up to 64); payloads: the rest; check: the read-back
                  "phases_s": {k: round(b - a, 3) for k, a, b in (
                      ("plan", t0, started), ("start", started, first or filled), ("payloads", first or filled, filled),
                      ("check", filled, checked))}},
    }
    write_tail(fd, int(counter.value), index, table, kept_files, label_crc, header)
    LOGGER.debug(f"pack {src.split}: filled in {seconds:.2f} s")
    return skipped, notes


def _check_written(tmp: Path, fd: int, index: np.ndarray, im_files: list[str], workers: int, split: str) -> None:
    """Read every payload back from the file and compare it with the CRC32 its worker took before writing.

    Catches what would otherwise train silently on wrong pixels: two payloads written over each other,
    a write that did not land, memory or disk faults. Costs one CRC32 pass over the payloads on
    ``workers`` threads (from the page cache: the build just wrote them).

    Raises:
        PackError: some payloads differ; nothing is published.
    """
    size = os.fstat(fd).st_size
    if not len(index) or not size:
        return
    mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)  # the file this build made, not whatever has its name now
    try:
        bad = np.nonzero(payload_crcs(np.frombuffer(mm, np.uint8), index, workers) != index["crc32"])[0]
    finally:
        mm.close()
    if len(bad):
        names = ", ".join(printable(im_files[i]) for i in bad[:3])
        raise PackError(f"pack {split}: {len(bad)} image(s) read back from {tmp} differ from what was written "
                        f"({names}): a disk or memory fault, or a bug in yolofeed. Nothing was published; build "
                        "again, and check the disk (dmesg) if it happens again")


def _in_memory(folder: Path) -> bool:
    """Whether ``folder`` is on a tmpfs (``/dev/shm``, often ``/tmp``): its files live in memory, not on a disk."""
    path = os.path.realpath(folder)
    try:
        mounts = psutil.disk_partitions(all=True)
    except (OSError, RuntimeError):  # no mount table to read: treat it as a disk
        return False
    under = [m for m in mounts if path == m.mountpoint or path.startswith(m.mountpoint.rstrip(os.sep) + os.sep)]
    # the deepest mount point; of two on the same point, the later one (the mount table's order), which hides the other
    return bool(under) and max(reversed(under), key=lambda m: len(m.mountpoint)).fstype == "tmpfs"


def _reserve(fd: int, nbytes: int) -> bool:
    """Allocate ``nbytes`` of disk for the file up front.

    Returns:
        True when every byte is allocated: then, and only then, workers may write through a shared
        mmap. False where ``posix_fallocate`` is missing (macOS, Windows) or failed.
    """
    fallocate = getattr(os, "posix_fallocate", None)
    if not nbytes or fallocate is None:
        return False
    try:
        fallocate(fd, 0, nbytes)
        return True
    except OSError as e:  # ENOSPC, or EOPNOTSUPP on some filesystems: slower, still correct
        os.ftruncate(fd, len(PREAMBLE))  # give back whatever part was allocated, keep the preamble
        LOGGER.info(f"pack: could not reserve {_gb(nbytes)} up front ({e.strerror}); writing with pwrite")
        return False


def _fsync_dir(folder: Path) -> None:
    if os.name == "nt":  # NTFS makes a rename durable itself; a folder cannot be opened for fsync there
        return
    dfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _write_report(dest: Path, skipped: list[tuple[str, str]], notes: list[tuple[str, str]]) -> Path:
    """``<split>.report.txt``: one line per skipped sample and per note, tab-separated.

    Written to a new temporary file and renamed over the last report (``files.write_replacing``); never over a file
    that does not start as a report does (a link, someone's file of that name).

    Raises:
        PackError: something else is under the report's name; nothing is written.
    """
    report = report_path(dest)
    lines = [f"# {dest.name}: {len(skipped)} skipped, {len(notes)} notes. file<TAB>status<TAB>reason"]
    lines += [f"{report_field(f)}\tskipped\t{report_field(r)}" for f, r in skipped]
    lines += [f"{report_field(f)}\tnote\t{report_field(r)}" for f, r in notes]
    # a name that is not UTF-8 is written as its bytes, so the report names the very file (cut -f1 | xargs ...)
    data = ("\n".join(lines) + "\n").encode("utf-8", errors="surrogateescape")
    files.write_replacing(report, data, _is_report, f"the {dest.name.removesuffix(SUFFIX)} pack's report")
    return report


SHELL_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
QUOTED_FIELD = re.compile(r"\$'(.*)'", re.DOTALL)


def report_field(text: str) -> str:
    """A file name or reason as one field of a report line: as it is, unless it holds a control character (a
    newline or tab in a name, legal on Linux, would break the line or its columns): then quoted as ``ls`` and
    bash quote such names, ``$'...'`` with ``\\n``, ``\\t``, ``\\xHH``, ``\\\\`` and ``\\'``, which pastes into
    a shell as the very name and ``read_report`` reads back. A name that starts as such a field is quoted too."""
    if not CONTROL.search(text) and not QUOTED_FIELD.fullmatch(text):
        return text
    escaped = "".join(SHELL_ESCAPES.get(c) or (f"\\x{ord(c):02x}" if CONTROL.match(c) else c) for c in text)
    return f"$'{escaped}'"


def _unquote_field(field: str) -> str:
    """``report_field`` undone."""
    m = QUOTED_FIELD.fullmatch(field)
    if m is None:
        return field
    back = {v[1]: k for k, v in SHELL_ESCAPES.items()}
    return re.sub(r"\\(x[0-9a-f]{2}|.)", lambda e: chr(int(e[1][1:], 16)) if len(e[1]) == 3 else back.get(e[1], e[0]),
                  m[1])


def _is_report(fd: int) -> bool:
    """Whether the open file ``fd`` starts as a report yolofeed wrote (``REPORT_HEAD``)."""
    with open(fd, "rb", closefd=False) as f:
        return REPORT_HEAD.match(f.read(256)) is not None


def report_path(dest: Path) -> Path:
    """The report file beside a pack: ``<split>.report.txt``."""
    return dest.with_name(dest.name.removesuffix(SUFFIX) + REPORT_SUFFIX)


def _writable(folder: Path, create: bool = True) -> OSError | None:
    """None if packs can be written in ``folder``, else the error that says why not.

    Args:
        create: make the folder when it is missing; False: make nothing, and try its first existing parent
            (a file there, say, is ``NotADirectoryError``).
    """
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        else:
            while not folder.exists() and folder != folder.parent:
                folder = folder.parent
            if not folder.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, f"{folder} is a file, not a folder")
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return e
    return None


def _build_folder(folders: list[Path], split: str, chosen: bool, create: bool = True) -> Path:
    """The first folder of ``folders`` where a pack can be written; says so when it is not the first.

    Args:
        create: see ``_writable``; False also keeps quiet (a check before the build, which says it again).

    Raises:
        PackError: none is writable (``chosen``: the user named the only one with out= / pack_dir=).
    """
    errors = []
    for folder in folders:
        err = _writable(folder, create)
        if err is None:
            if errors and create:
                LOGGER.warning(f"pack: {folders[0]} is not writable ({errors[0].strerror or errors[0]}); "
                               f"the {split} pack goes to {folder} instead (choose the folder with out= for "
                               "yolofeed pack, pack_dir= for yolofeed train)")
            return folder
        errors.append(err)
    if chosen:
        raise PackError(f"cannot write packs to {folders[0]} ({errors[0].strerror or errors[0]}); pass a writable "
                        "folder: out= (yolofeed pack) or pack_dir= (yolofeed train)")
    raise PackError(f"cannot write packs beside the data ({folders[0]}: {errors[0].strerror or errors[0]}) nor to "
                    f"{folders[-1]} ({errors[-1].strerror or errors[-1]}); pass a writable folder: out= (yolofeed "
                    "pack) or pack_dir= (yolofeed train)")


def _label_crcs(label_files: tuple[str, ...]) -> np.ndarray:
    """CRC32 of every label file's bytes (0 when missing), read on a few threads (small files: I/O-bound)."""
    with ThreadPoolExecutor(8) as pool:
        return np.fromiter(pool.map(_label_crc, label_files, chunksize=256), np.uint32, len(label_files))


def _open_checked(path: Path, expect: dict[str, Any], fix: str, src: SplitSource, rebuild: str,
                  verify: bool) -> Pack:
    """``Pack.open`` plus the checks ``rebuild=check`` and ``verify=True`` ask for.

    Raises:
        PackError / StalePackError: as ``Pack.open``; stale label contents; damaged payloads.
    """
    pack = Pack.open(path, expect, fix)
    if rebuild == "check":
        changed = np.nonzero(_label_crcs(src.label_files) != pack.label_crc)[0]
        if len(changed):
            names = ", ".join(printable(src.label_files[i]) for i in changed[:3])
            raise StalePackError(f"{path} is stale: {len(changed)} label file(s) changed content since it was "
                                 f"built, keeping their size and time ({names}); {fix}")
    if verify:
        pack.verify(fix=fix)
    return pack


def no_labels(pack: Pack, training: bool = False) -> str:
    """Ultralytics' warning (``training``: its refusal) for a split without labels; "" when it has some."""
    c, where = pack.header["counts"], pack.header["source"]["label_dir"]
    if c["label_files"] == 0:
        consequence = ("Ultralytics refuses to train on such a split, and so does yolofeed" if training else
                       "training may not work correctly (Ultralytics refuses to train on such a split)")
        return (f"No labels found in {where}: none of the {c['images']:,} images of split '{pack.split}' has a "
                f"label file; {consequence}. Put YOLO .txt labels there, one per image, named as the image")
    if c["boxes"] == 0:
        return f"Labels are missing or empty in {where} (split '{pack.split}'), training may not work correctly"
    return ""


def _expected(src: SplitSource, imgsz: int, storage: str) -> dict[str, Any]:
    """What a pack of ``src`` must say in its header to be used (``Pack.open``'s ``expect``)."""
    return {"data": src.yaml_file, "imgsz": imgsz, "storage": storage, "fingerprint": src.fingerprint()}


def _existing(folders: list[Path], name: str, src: SplitSource, imgsz: int, storage: str, fix: str, rebuild: str,
              verify: bool) -> tuple[Pack | None, list[PackError]]:
    """The first valid pack ``name`` in ``folders``, and why each other one found there was refused."""
    expect = _expected(src, imgsz, storage)
    errors = []
    for folder in folders:
        if os.path.lexists(folder / name):  # a broken link, a link loop: said as such, not "does not exist"
            try:
                return _open_checked(folder / name, expect, fix, src, rebuild, verify), errors
            except PackError as e:
                errors.append(e)
    return None, errors


CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # cgroup v2, v1


def _own_cgroup_limits() -> tuple[str, ...]:
    """The memory limit files of this process's own cgroup (a job scheduler's nested one), then the root's."""
    own = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():  # "0::/path" (v2), "4:memory:/path" (v1)
            _, controllers, rel = line.split(":", 2)
            if controllers == "":
                own.append(f"/sys/fs/cgroup{rel}/memory.max")
            elif "memory" in controllers.split(","):
                own.append(f"/sys/fs/cgroup/memory{rel}/memory.limit_in_bytes")
    return (*own, *CGROUP_LIMITS)


def memory_limit(cgroup_files: tuple[str, ...] | None = None) -> int:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit where that is lower (containers,
    job schedulers).

    Args:
        cgroup_files: limit files to read; default this process's cgroup's and the root's.
    """
    total = psutil.virtual_memory().total
    for path in _own_cgroup_limits() if cgroup_files is None else cgroup_files:
        with contextlib.suppress(OSError, ValueError):
            total = min(total, int(Path(path).read_text().strip()))  # "max" (no limit) is a ValueError
    return total


def _built_format(yaml_file: str, imgsz: int, out: str | None) -> tuple[str, Path] | None:
    """The format and path of a train pack already built for this dataset and size, if any (reads its header)."""
    for name in codecs.names():
        for folder in pack_folders(yaml_file, imgsz, name, out):
            path = folder / f"train{SUFFIX}"
            if path.is_file():
                with contextlib.suppress(PackError, OSError, ValueError):  # a damaged one: decided afresh
                    if Pack.open(path).storage == name:
                        return name, path
    return None


@functools.cache
def _auto_storage(yaml_file: str, imgsz: int, out: str | None) -> str:
    """``pack_format=auto`` for one dataset, image size and pack folder, said once a process: the format of a pack
    already built there (so machines that would choose differently share one, and nothing is built twice), else
    the default format where the train and val packs fit comfortably in memory, else the compact one."""
    built = _built_format(yaml_file, imgsz, out)
    if built is not None:
        LOGGER.info(f"pack: format {built[0]} ({codecs.AUTO}): the {built[0]} pack already built, {built[1]}")
        return built[0]
    d = load_data_yaml(yaml_file)
    total = 0
    for split in ("train", "val"):
        with contextlib.suppress(DatasetError):  # a split the yaml lacks, or one not packed now (splits=train)
            total += estimate_bytes(split_source(d, split), imgsz, codecs.DEFAULT)
    folders = pack_folders(yaml_file, imgsz, codecs.DEFAULT, out)
    # where the build will write: beside a read-only dataset that is the user cache, on another disk
    folder = next((f for f in folders if _writable(f, create=False) is None), folders[0])
    disk = _existing_ancestor(folder)
    free = shutil.disk_usage(disk).free if disk is not None else None
    name, why = codecs.choose(total, memory_limit(), free, str(disk))
    LOGGER.info(f"pack: format {name} ({codecs.AUTO}): {why}")
    return name


def _existing_ancestor(folder: Path) -> Path | None:
    """``folder`` or its nearest parent that exists: where a pack to be built there would take its space."""
    for p in (folder, *folder.parents):
        with contextlib.suppress(OSError):
            if p.is_dir():
                return p
    return None


def resolve_storage(data: dict, storage: str, imgsz: int, out: str | os.PathLike | None = None) -> str:
    """``storage``, with ``auto`` replaced by the format it picks for this dataset, image size, folder and machine."""
    if storage != codecs.AUTO:
        return storage
    return _auto_storage(str(data["yaml_file"]), int(imgsz), str(out) if out else None)


def check_split(data: str | os.PathLike | dict, split: str = "train", imgsz: int = 640, storage: str = codecs.DEFAULT,
                out: str | os.PathLike | None = None, rebuild: str = "never") -> None:
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
    check_splits(data, (split,), imgsz, storage, out, rebuild)


def check_splits(data: str | os.PathLike | dict, splits: tuple[str, ...] | list[str], imgsz: int = 640,
                 storage: str = codecs.DEFAULT, out: str | os.PathLike | None = None, rebuild: str = "never") -> None:
    """``check_split`` for each split, and the free space for every pack still to build, added up per disk.

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
    sources = {split: split_source(d, split) for split in dict.fromkeys(splits)}
    storage = resolve_storage(d, storage, imgsz, out)
    folders = pack_folders(d["yaml_file"], imgsz, storage, out)
    due: dict[int, list[tuple[str, Path, _Space]]] = {}  # disk (st_dev) -> the packs to build there
    for split, src in sources.items():
        name = f"{split}{SUFFIX}"
        if rebuild == "never":
            fix = f"rebuild it with: {rebuild_command(d['yaml_file'], imgsz, storage, out)}"
            pack, errors = _existing(folders, name, src, imgsz, storage, fix, rebuild, False)
            if pack is None:
                raise errors[0] if errors else _missing(folders[0] / name, out, fix)
        elif rebuild == "always" or not any(os.path.lexists(folder / name) for folder in folders):
            folder = _build_folder(folders, split, chosen=bool(out), create=False)
            FolderLock(folder).check()  # a lock file that is not yolofeed's: refused before a run folder is made
            space = _plan_space(src, folder, imgsz, storage)  # this one alone
            disk = _existing_ancestor(folder) or folder
            due.setdefault(os.stat(disk).st_dev, []).append((split, folder, space))
    for packs in due.values():
        need = sum(space.estimate for _, _, space in packs)
        free = min(space.free for _, _, space in packs)
        if len(packs) > 1 and free < need:
            names = " and ".join(split for split, _, _ in packs)
            each = ", ".join(f"{split} {_gb(space.estimate)}" for split, _, space in packs)
            where = ", ".join(dict.fromkeys(str(folder) for _, folder, _ in packs))
            raise PackSpaceError(f"not enough free space for the {names} packs in {where}: together they need "
                                 f"{_gb(need)} ({need:,} bytes: {each}), {_gb(free)} ({free:,} bytes) are free. "
                                 f"Free some space, or {MOVE_HINT}")


def ensure_split(data: str | os.PathLike | dict, split: str = "train", imgsz: int = 640, storage: str = codecs.DEFAULT,
                 out: str | os.PathLike | None = None, rebuild: str = "never", workers: int = 0,
                 progress: bool = True, sync: bool = False, verify: bool = False) -> BuildResult:
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

    Raises:
        PackError / StalePackError: with rebuild="never", the pack is missing, damaged or stale; no
            writable folder; the disk is full.
        DatasetError: the data yaml or the split is unusable.
    """
    if rebuild not in REBUILDS:
        raise PackError(f"rebuild={rebuild}: expected one of {', '.join(REBUILDS)}")
    d = data if isinstance(data, dict) else load_data_yaml(data)
    src = split_source(d, split)  # a wrong path: refused before format=auto says what it chose (without the split)
    storage = resolve_storage(d, storage, imgsz, out)
    folders = pack_folders(d["yaml_file"], imgsz, storage, out)
    name = f"{split}{SUFFIX}"
    fix = f"rebuild it with: {rebuild_command(d['yaml_file'], imgsz, storage, out)}"
    result, errors = None, []
    if rebuild != "always":
        pack, errors = _existing(folders, name, src, imgsz, storage, fix, rebuild, verify)
        result = BuildResult(pack, built=False, verified=verify) if pack is not None else None
        if result is None and rebuild == "never":
            raise errors[0] if errors else _missing(folders[0] / name, out, fix)
    if result is None:
        folder = _build_folder(folders, split, chosen=bool(out))
        files.check_replaceable(folder / name, is_pack_file, f"the {split} pack")  # before saying "Rebuilding"
        for e in errors:  # a newer yolofeed's pack is worth a warning: that yolofeed will rebuild it in turn
            if isinstance(e, NewerPackError):
                LOGGER.warning(f"WARNING pack: {e}. Rebuilding.")
            else:
                LOGGER.info(f"pack: {e}. Rebuilding.")
        if _old_layout(out, name):
            LOGGER.info(f"pack: building the {split} pack in {folder}{_old_layout(out, name)}")
        with _locked(folder):
            if rebuild != "always":  # another process may have built it while we waited for the lock
                with contextlib.suppress(PackError):
                    expect = _expected(src, imgsz, storage)
                    result = BuildResult(_open_checked(folder / name, expect, fix, src, rebuild, verify), built=False,
                                         verified=verify)
            if result is None:
                t0 = time.perf_counter()
                pack = build_split(src, folder / name, imgsz, storage, workers, progress, sync)
                result = BuildResult(pack, built=True, seconds=time.perf_counter() - t0)
    if not result.built:
        _remove_leftovers_if_idle(result.pack.path.parent)
    warning = no_labels(result.pack)
    if warning:
        LOGGER.warning(f"WARNING pack {split}: {warning}")
    return result


def _old_layout(out: str | os.PathLike | None, name: str) -> str:
    """A note for a pack file directly in ``out``, where packs went before each got a folder of its own there; ""."""
    old = Path(out).expanduser() / name if out else None
    if old is None or not old.is_file():
        return ""
    return (f" ({old} is where packs of out= went before each data yaml, format and imgsz got a folder of its own in "
            "it: this yolofeed does not read it there; delete it once nothing needs it)")


def _missing(path: Path, out: str | os.PathLike | None, fix: str) -> PackError:
    return PackError(f"pack {path} does not exist{_old_layout(out, path.name)}; {fix}")


def open_or_build(data: str | os.PathLike | dict, split: str = "train", imgsz: int = 640, storage: str = codecs.DEFAULT,
                  out: str | os.PathLike | None = None, rebuild: str = "never", workers: int = 0,
                  progress: bool = True, sync: bool = False, verify: bool = False) -> Pack:
    """The pack of one split, valid for ``imgsz``/``storage`` and the current source files.

    Says what ``yolofeed pack`` says: the summary after a build (a warning when images were
    skipped: their reasons and the report file), and a one-line reminder of skipped images when an
    existing pack is reused. See ``ensure_split`` for the arguments and errors.
    """
    r = ensure_split(data, split, imgsz, storage, out, rebuild, workers, progress, sync, verify)
    skipped = r.pack.header["skipped"]
    if r.built:
        (LOGGER.warning if skipped else LOGGER.info)(summary(r))
    elif skipped:
        top = "; ".join(f"{c}x {why}" for why, c in Counter(why for _, why in skipped).most_common(2))
        LOGGER.warning(f"pack {split}: {len(skipped)} image(s) were skipped when it was built ({top}); "
                       f"full list: {report_path(r.pack.path)}")
    return r.pack


def summary(result: BuildResult, max_listed: int = 10) -> str:
    """A few lines for the terminal: images, boxes, skipped with reasons, bytes, build rate."""
    p, h = result.pack, result.pack.header
    c = h["counts"]
    size = p.path.stat().st_size
    lines = [f"pack {p.split}: {c['images']:,} images, {c['boxes']:,} boxes, {c['skipped']} skipped, "
             f"{size / 1e9:.2f} GB ({p.storage}, imgsz {p.imgsz})"]
    if result.built:
        rate = c["tried"] / max(result.seconds, 1e-9)
        synced = ", synced to disk" if h["build"].get("sync") else ""
        lines[0] += f", built in {result.seconds:.1f} s ({rate:,.0f} img/s, {h['build']['workers']} workers{synced})"
    else:
        lines[0] += f", up to date (built {h['created']})"
        if result.verified:
            lines[0] += f"; verified: the stored pixels of all {c['images']:,} images match their checksums"
    for f, r in h["skipped"][:max_listed]:
        lines.append(f"  skipped {printable(f)}: {printable(r)}")
    if len(h["skipped"]) > max_listed:
        lines.append(f"  ... {len(h['skipped']) - max_listed} more skipped")
    for note, count in Counter(n.split(":")[0] for _, n in h["notes"]).most_common(5):
        lines.append(f"  note: {count}x {note}")
    if h["skipped"] or h["notes"]:
        lines.append(f"  full list: {report_path(p.path)}")
    lines.append(f"  -> {p.path}")
    return "\n".join(lines)


def run(cfg: PackConfig) -> list[BuildResult]:
    """``yolofeed pack``: build or check the packs of every requested split and print a summary."""
    splits = list(dict.fromkeys(s.strip() for s in cfg.splits.split(",") if s.strip()))
    if not splits:
        raise ConfigError(f"splits={cfg.splits}: names no split; list the data yaml's splits to pack, comma-separated, "
                          "e.g. splits=train,val")
    d = load_data_yaml(cfg.data)
    if cfg.rebuild != "never":  # every pack to build must fit, together, before the first is written
        check_splits(d, splits, cfg.imgsz, cfg.format, cfg.out, cfg.rebuild)
    results = []
    for split in splits:
        r = ensure_split(d, split, cfg.imgsz, cfg.format, cfg.out, cfg.rebuild, cfg.workers, sync=cfg.sync,
                         verify=cfg.verify)
        print(summary(r), flush=True)
        results.append(r)
    return results


def read_report(dest: Path) -> list[list[str]]:
    """Rows of a pack's report file (for tests and the doctor)."""
    text = report_path(dest).read_text(encoding="utf-8", errors="surrogateescape")
    return [[_unquote_field(f) for f in line.split("\t")] for line in text.split("\n")[1:] if line]


__all__ = ["BuildResult", "build_split", "cache_root", "check_split", "check_splits", "ensure_split", "no_labels",
           "open_or_build", "pack_folders", "rebuild_command", "run", "store_dir", "summary"]

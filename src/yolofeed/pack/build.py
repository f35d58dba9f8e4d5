"""Write one split's pack file, in parallel and atomically.

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
  folder instead, and the log says where (``paths.pack_folders``).
* A folder that holds other files, or is shared with other users: every file a build writes there is
  opened without following a link, under a name taken with ``O_EXCL`` (``pack/files.py``); the
  temporary file starts with the pack's preamble, and only files so named that start so are swept as
  leftovers; a pack or report is replaced only where what is there is one yolofeed wrote. Anything
  else under those names is refused with one line that names it.

Every file operation goes through ``Disk`` (pack/disk.py), which tests replace; when a pack is built at all is
pack/rebuild.py's.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from yolofeed import __version__
from yolofeed.config import worker_count
from yolofeed.errors import DatasetError, PackError
from yolofeed.pack import codecs, files
from yolofeed.pack.disk import Disk, current
from yolofeed.pack.encode import close_worker, init_worker, process_chunk
from yolofeed.pack.layout import (
    DETECT_POLYGONS,
    INDEX_DTYPE,
    PREAMBLE,
    align,
    corner_section,
    detect_keeps_polygons,
    detection_sections,
    encode_tail,
    is_pack_file,
    keypoint_section,
    payload_crcs,
    polygon_sections,
    printable,
    source_sections,
)
from yolofeed.pack.lock import FolderLock
from yolofeed.pack.report import commonest_reasons, report_path, write_report
from yolofeed.pack.source import SplitSource
from yolofeed.pack.space import DISK_FULL, MOVE_HINT, Space, gb, plan_space
from yolofeed.pack.store import Pack
from yolofeed.pack.workers import WorkerDied, Workers, mp_context
from yolofeed.processes import signals_deferred, sigterm_exits
from yolofeed.ultralytics_seam import LABEL_RULES

LOGGER = logging.getLogger(__name__)


class _Writeback(threading.Thread):
    """Flush the file to disk every ``interval`` seconds while workers fill it.

    The kernel would start writing only at its dirty threshold (10 % of RAM), leaving the whole
    file to the final fsync (9 GB: ~4 s at the H200 machine's ~2.4 GB/s); flushing as we go
    overlaps that with decoding.
    """

    def __init__(self, disk: Disk, fd: int, interval: float = 1.0):
        super().__init__(daemon=True)
        self.disk, self.fd, self.interval, self.stop = disk, fd, interval, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self.disk.datasync(self.fd)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.join()


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
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
        current().remove_leftovers(folder)
        yield
    finally:
        lock.release()


def build_split(src: SplitSource, dest: Path, imgsz: int, format: str = codecs.DEFAULT, workers: int = 0,
                progress: bool = True, sync: bool = False) -> Pack:
    """Verify, decode and write every sample of ``src`` into the pack file ``dest``.

    Bad samples are skipped and listed in the header and in ``<split>.report.txt``. Call under
    ``locked(dest.parent)``.

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
    codecs.get(format)  # an unknown format: PackError, before anything is written
    t0 = time.perf_counter()
    n = len(src.im_files)
    workers = max(1, min(worker_count(workers), n))
    stats = src.stats()  # the fingerprint's inputs, before any image is read: recorded in the pack
    purpose = f"the {src.split} pack"
    files.check_replaceable(dest, is_pack_file, purpose)  # before the build's minutes, not only after them
    space = plan_space(src, dest.parent, imgsz, format)
    disk = current()
    with sigterm_exits():  # a build stopped by SIGTERM removes its temporary file, as with Ctrl-C
        fd, tmp = disk.create_temp(dest.parent, dest.name)
        try:
            try:
                disk.pwrite(fd, PREAMBLE, 0)  # first: what proves the file to be yolofeed's, should the build die
                skipped, notes = _fill(src, tmp, fd, imgsz, format, workers, progress, sync, stats, space, t0,
                                       disk)
                if sync:
                    disk.fsync(fd)  # the rename below must not publish a file whose bytes are not on disk
            finally:
                os.close(fd)
            disk.publish(tmp, dest, is_pack_file, purpose)
        except BaseException as e:  # KeyboardInterrupt and SIGTERM included: leave nothing half-written behind
            disk.remove(tmp)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                LOGGER.info(f"pack {src.split}: stopped; removed the unfinished {tmp.name}")
            if isinstance(e, OSError) and e.errno == errno.EFBIG:
                raise PackError(f"writing the {src.split} pack in {dest.parent} passed this process's file-size limit "
                                f"(ulimit -f; {e.strerror}): it needs about {gb(space.estimate)}. Nothing was "
                                f"published and the temporary file is removed. Raise the limit (ulimit -f unlimited) "
                                f"and build again") from None
            if isinstance(e, OSError) and e.errno in DISK_FULL:
                raise PackError(f"the disk filled up while writing the {src.split} pack in {dest.parent} "
                                f"({e.strerror}): it needs about {gb(space.estimate)}, {gb(space.free)} were "
                                f"free when the build started. Nothing was published and the temporary file is "
                                f"removed. Free some space, or {MOVE_HINT}") from None
            if isinstance(e, OSError):
                raise PackError(f"writing the {src.split} pack in {dest.parent} failed: {e}. Nothing was "
                                f"published. If the folder is the problem, {MOVE_HINT}") from e
            raise
    if sync:
        disk.fsync_dir(dest.parent)
    try:
        write_report(dest, skipped, notes)
    except PackError as e:  # something that is not yolofeed's report is under its name: left as it is
        LOGGER.warning(f"pack {src.split}: did not write its report: {e}; the skipped images and notes are in the "
                       "pack's header too")
    except OSError as e:  # the pack is whole and published; its report is a convenience (the header lists the same)
        LOGGER.warning(f"pack {src.split}: could not write {report_path(dest)} ({e.strerror or e}); "
                       "the skipped images and notes are in the pack's header too")
    return Pack.open(dest)


def _fill(src: SplitSource, tmp: Path, fd: int, imgsz: int, format: str, workers: int, progress: bool, sync: bool,
          stats: np.ndarray, space: Space, t0: float,
          disk: Disk) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The body of ``build_split``: write every sample, check the payloads, append the tail to ``tmp`` (``fd``).

    Returns:
        The skipped samples and the notes, for the report file.
    """
    n = len(src.im_files)
    # A format whose payloads are bounded (raw pixels: imgsz x imgsz x 3) reserves that much up front when it
    # fits (the tail's truncate gives back what was not used): on a sparse file every first write to a page allocates a
    # block under the filesystem journal, which held 16 writers to ~1,000 img/s on the H200 machine.
    largest = codecs.get(format).max_payload(imgsz)
    capacity = len(PREAMBLE) + n * align(largest) if largest is not None else 0
    # One writer gains nothing from the mapping (pwrite outruns one core's decoding), and in-process a
    # SIGBUS (a full copy-on-write filesystem, whose reservations do not hold) would end the build's own process
    mapped, backed = 0, True
    if workers > 1 and space.free >= space.bound:
        if capacity and disk.in_memory(tmp.parent):  # tmpfs has no journal to spare, and its reservation allocates
            # every page of the bound in this process (1.3-2.5 s for 12 GB on the H200 machine) where the workers
            # would fault in only what they write, in parallel; each worker's populate advice, which reports a full
            # tmpfs as EFAULT, stands in for the reservation
            disk.truncate(fd, capacity)
            mapped, backed = capacity, False
        elif _reserve(disk, fd, capacity):
            mapped = capacity
    if capacity and not mapped and workers > 1:  # one writer never maps: nothing to say
        LOGGER.info(f"pack {src.split}: workers write with pwrite rather than a shared map (the disk space for the "
                    f"largest possible pack, {gb(space.bound)}, is not reserved up front; {gb(space.free)} free)")
    ctx = mp_context()
    counter = ctx.Value("Q", len(PREAMBLE))  # payloads go after the preamble
    initargs = (str(tmp), counter, src.nc, imgsz, format, mapped, backed, disk, src.task, src.kpt_shape)
    started = time.perf_counter()  # the phases' ends, for the header: what is fixed and what grows with n
    first = None
    index = np.zeros(n, INDEX_DTYPE)
    labels: list[np.ndarray | None] = [None] * n
    keypoints: list[np.ndarray | None] = [None] * n  # pose: (n_i, K, 3) per image, aligned with its labels
    corners: list[np.ndarray | None] = [None] * n  # obb: (n_i, 4, 2) per image, aligned with its labels
    polygons: list[list[np.ndarray] | None] = [None] * n  # segment, detect: polygons per image, with its labels
    label_crc = np.zeros(n, np.uint32)
    skipped: list[tuple[str, str]] = []
    notes: list[tuple[str, str]] = []
    tasks = list(zip(range(n), src.im_files, src.label_files))
    chunk = max(1, min(64, n // (workers * 8)))
    why: dict[int, str] = {}  # results arrive in completion order; the report lists them in source order
    noted: dict[int, list[str]] = {}
    pool = Workers(workers, init_worker, initargs, close_worker, ctx)  # last before the try that stops it
    try:
        with (signals_deferred() as check, _Writeback(disk, fd) if sync else contextlib.nullcontext(),
              tqdm(total=n, unit="img", disable=not progress, desc=f"pack {src.split}") as bar):
            chunks = (tasks[k:k + chunk] for k in range(0, n, chunk))
            for i, lcrc, reason, meta in pool.imap(process_chunk, chunks, check):
                first = first or time.perf_counter()
                bar.update()
                label_crc[i] = lcrc
                if reason is not None:
                    why[i] = reason
                    bar.set_postfix(skipped=len(why), refresh=False)
                    continue
                off, nbytes, crc, h0, w0, h, w, lb, sample_notes, kp, quads, polys = meta
                index[i] = (off, nbytes, h0, w0, h, w, 0, len(lb), crc)
                labels[i], keypoints[i], corners[i], polygons[i] = lb, kp, quads, polys
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
        top = commonest_reasons(skipped, 3)
        hint = ""
        missing = next((f for f, r in skipped if r == "image file not found"), None)
        if missing and not os.path.isabs(missing):  # a .txt list's relative line: read from the current folder
            hint = ("\n  (a .txt list's lines that do not start with ./ are read from the current folder, "
                    f"{os.getcwd()}, as Ultralytics reads them: start them with ./ to read them from the list's)")
        raise DatasetError(f"no usable image in split '{src.split}' of {src.yaml_file} ({n} tried). "
                           "Commonest reasons:\n  " + "\n  ".join(
                               kind.said() for kind in top) + hint)
    index = index[keep]
    kept_labels = [lb for lb in labels if lb is not None]
    kept_files = [f for f, k in zip(src.im_files, keep) if k]
    _check_written(tmp, fd, index, kept_files, workers, src.split)
    checked = time.perf_counter()
    counts = np.array([len(lb) for lb in kept_labels], np.int64)
    index["label_start"] = np.concatenate([[0], np.cumsum(counts)[:-1]])
    table = np.concatenate(kept_labels) if counts.sum() else np.zeros((0, 5), np.float32)
    sections = detection_sections(index, table, kept_files, label_crc)
    if src.task == "pose":  # rows in the labels' order: the same images kept, each its labels' count of rows
        k = src.kpt_shape[0]
        kept = [kp for kp, lb in zip(keypoints, labels) if lb is not None]
        sections["keypoints"] = keypoint_section(np.concatenate(kept) if counts.sum() else np.zeros((0, k, 3)))
    if src.task == "obb":  # the same: each kept image's corners, one row per label row
        kept = [q for q, lb in zip(corners, labels) if lb is not None]
        sections["corners"] = corner_section(np.concatenate(kept) if counts.sum() else np.zeros((0, 4, 2)))
    per_image = [ps or [] for ps, lb in zip(polygons, labels) if lb is not None]  # each kept image's, as counts
    kept_polygons = [p for ps in per_image for p in ps]
    keeps = detect_keeps_polygons(src.task, len(kept_polygons), int(counts.sum()))
    if src.task == "segment" or keeps:
        sections.update(polygon_sections(kept_polygons))  # each kept image's polygons, one per label row
    sections.update(source_sections(src.im_files, stats))
    box_images = None  # polygon and box rows mixed: Ultralytics decides on the files a fraction= keeps (it cuts them
    if src.task == "detect" and kept_polygons and not keeps:  # first): the images with box rows, for its warning
        box_images = [i for i, (ps, c) in enumerate(zip(per_image, counts)) if c and not ps]
    missing = sum(1 for _, note in notes if note.startswith("label file missing"))
    seconds = time.perf_counter() - t0
    header = {
        "yolofeed_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "split": src.split, "imgsz": imgsz, "storage": format, "task": src.task,
        **({"kpt_shape": list(src.kpt_shape)} if src.task == "pose" else {}), "channels": 3, "color": "RGB",
        "label_rules": LABEL_RULES.since,  # the installed Ultralytics' (pack.verify): another's makes the pack stale
        **({"detect_polygons": DETECT_POLYGONS} if src.task == "detect" else {}),
        **({"box_row_images": box_images, "polygon_rows": len(kept_polygons)} if box_images is not None else {}),
        "resize": "long side to imgsz, cv2.INTER_LINEAR, as Ultralytics BaseDataset.load_image",
        "source": {"data": src.yaml_file, "paths": list(src.paths), "nc": src.nc, "names": list(src.names),
                   "fingerprint": src.fingerprint(stats), "label_dir": str(Path(src.label_files[0]).parent)},
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
    start, tail = encode_tail(int(counter.value), sections, header)
    disk.pwrite(fd, tail, start)
    disk.truncate(fd, start + len(tail))  # a reservation's unused end given back
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


def _reserve(disk: Disk, fd: int, nbytes: int) -> bool:
    """Allocate ``nbytes`` of disk for the file up front.

    Returns:
        True when every byte is allocated: then, and only then, workers may write through a shared
        mmap. False where ``posix_fallocate`` is missing (macOS, Windows) or failed.
    """
    if not nbytes:
        return False
    try:
        return disk.allocate(fd, nbytes)
    except OSError as e:  # ENOSPC, or EOPNOTSUPP on some filesystems: slower, still correct
        disk.truncate(fd, len(PREAMBLE))  # give back whatever part was allocated, keep the preamble
        LOGGER.info(f"pack: could not reserve {gb(nbytes)} up front ({e.strerror}); writing with pwrite")
        return False

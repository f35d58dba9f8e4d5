"""A build worker's side: verify one sample, have its format's codec encode it, write its payload in place.

Each worker takes its payload's offset from a shared counter and writes it into the temporary file itself, so
payloads never travel back through a pipe; it returns only metadata and labels. The writes go through the build's
``Disk`` (pack/disk.py), which a test replaces with a failing one.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import stat
import zlib
from typing import Any

import numpy as np

from yolofeed.pack import codecs, files
from yolofeed.pack.disk import Disk, current
from yolofeed.pack.layout import align
from yolofeed.pack.space import DISK_FULL
from yolofeed.pack.verify import SampleError, load_sample

LOGGER = logging.getLogger(__name__)

_W: dict[str, Any] = {}  # this worker's state: its descriptor, mapping, codec, Disk ...


def init_worker(tmp_path: str, counter: Any, nc: int, imgsz: int, format: str, mapped: int, backed: bool = True,
                disk: Disk | None = None, task: str = "detect", kpt_shape: tuple[int, int] | None = None) -> None:
    """Open the temporary file (and map it when ``mapped`` bytes were reserved) in a build worker.

    Args:
        backed: the mapped bytes are allocated on the disk. False (a tmpfs file merely extended): a payload goes
            through the mapping only once the populate advice has faulted its pages in.
        disk: the build's file operations (default ``disk.current()``).
        task, kpt_shape: which label rules apply (``verify.load_sample``).
    """
    fd = os.open(tmp_path, os.O_RDWR | files.SAFE)
    # Raw packs are written through a shared mapping of the file: 16 processes copy into the page cache at
    # ~12 GB/s, where pwrite serialises on the file's inode lock at ~4.5 GB/s (measured on the H200 machine,
    # BENCHMARKS.md). Only where every byte is allocated (or, not ``backed``, every payload's pages faulted in
    # first): a page the filesystem cannot back (disk full) would kill the writer with SIGBUS.
    mm = mmap.mmap(fd, mapped) if mapped else None
    _W.update(fd=fd, mm=mm, counter=counter, nc=nc, imgsz=imgsz, codec=codecs.get(format), mapped=mapped,
              populate=True, backed=backed, disk=disk or current(), task=task, kpt_shape=kpt_shape)
    import cv2

    cv2.setNumThreads(1)  # one image per process; OpenCV's own threads would only contend


def close_worker() -> None:
    if _W.get("mm") is not None:
        _W.pop("mm").close()
    if "fd" in _W:
        os.close(_W.pop("fd"))


def label_crc(lb_file: str) -> int:
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


def process(task: tuple[int, str, str]) -> tuple:
    """Verify, decode and store one sample; returns its label file's CRC32 and metadata (never its pixels)."""
    i, im_file, lb_file = task
    lcrc = label_crc(lb_file)
    try:
        s = load_sample(im_file, lb_file, _W["nc"], _W["imgsz"], _W["codec"].encode, _W.get("task", "detect"),
                        _W.get("kpt_shape"))
    except SampleError as e:
        return i, lcrc, str(e), None
    except Exception as e:  # anything else Ultralytics would also count as corrupt: report, don't die
        return i, lcrc, f"{type(e).__name__}: {e}", None
    payload = memoryview(np.ascontiguousarray(s.payload)).cast("B")
    crc = zlib.crc32(payload)  # ~0.6 ms for a 640x480 raw image, next to ~2.5 ms of decode and resize
    with _W["counter"].get_lock():  # reserve [offset, offset + nbytes) in the shared file
        offset = _W["counter"].value
        _W["counter"].value = align(offset + payload.nbytes)
    if _W["mm"] is not None and offset + payload.nbytes <= _W["mapped"] and populate(_W["mm"], offset, payload.nbytes):
        _W["mm"][offset:offset + payload.nbytes] = payload
    else:
        _W["disk"].write_payload(_W["fd"], payload, offset)  # a full disk raises ENOSPC here, in the parent's map
    return i, lcrc, None, (offset, payload.nbytes, crc, *s.ori_hw, *s.hw, s.labels, s.notes, s.keypoints,
                                s.corners, s.polygons)


def populate(mm: mmap.mmap, offset: int, nbytes: int) -> bool:
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
    disk = _W.get("disk") or current()
    if disk.advice is None or not _W.get("populate", True):
        return _W.get("backed", True)
    start = offset - offset % mmap.PAGESIZE
    try:
        disk.populate(mm, start, offset + nbytes - start)
    except OSError as e:
        if e.errno == errno.EFAULT or e.errno in DISK_FULL:
            return False
        then = "the copies fault pages in" if _W.get("backed", True) else "nothing is reserved: payloads go by pwrite"
        LOGGER.debug(f"pack worker: madvise(MADV_POPULATE_WRITE) refused ({e}); {then}")
        _W["populate"] = False
        return _W.get("backed", True)
    return True


def process_chunk(tasks: list[tuple[int, str, str]]) -> list[tuple]:
    return [process(t) for t in tasks]

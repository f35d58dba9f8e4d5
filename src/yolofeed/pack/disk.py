"""The file operations a build makes, behind one small class that a test replaces with a failing disk.

``Disk`` is every operation a build asks of the file system: make the temporary file, write at an offset (a
payload, or the preamble and tail), reserve space, fault a mapping's pages in, fsync, publish by rename, remove,
read the free space, tell a tmpfs from a disk, probe a folder for writing, and sweep what dead builds left. The
build and its workers take the one ``current()`` returns (``using`` puts another in its place), so a full disk, a
lost write or a refused advice is a subclass that overrides one method, not a patch of the build's insides.
Workers get it with their arguments.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

from yolofeed.errors import describe
from yolofeed.pack import files
from yolofeed.pack.files import TMP_MARK
from yolofeed.pack.layout import PREAMBLE, SUFFIX
from yolofeed.pack.report import REPORT_HEAD, REPORT_SUFFIX

LOGGER = logging.getLogger(__name__)
# madvise(MADV_POPULATE_WRITE), Linux 5.14+: a payload's pages faulted in, writable, in one call
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23 if sys.platform.startswith("linux") else None)
# a build's temporary files: ".<split>.yfpack.tmp-<pid>-<token>" and ".<split>.report.txt.tmp-<pid>-<token>"
TEMP_NAME = re.compile(rf"^\.(?P<name>.+){re.escape(TMP_MARK)}\d+-[0-9a-f]{{8}}$")


class Disk:
    """The local file system, as a build uses it. Subclass and override a method to inject a fault.

    Attributes:
        advice: the madvise advice ``populate`` gives (``MADV_POPULATE_WRITE``); None where the system has none.
    """

    advice: int | None = MADV_POPULATE_WRITE

    # -- the temporary file ---------------------------------------------------------------------
    def create_temp(self, folder: Path, name: str) -> tuple[int, Path]:
        """A new temporary file beside ``folder/name``, open for reading and writing (``files.create_temp``)."""
        return files.create_temp(folder, name)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        """Write all of ``data`` at ``offset``: ``os.pwrite``, or seek + write where it is missing (Windows).

        The fallback moves the descriptor's position, so each writer needs its own descriptor (as build
        workers have).
        """
        view = memoryview(data).cast("B")
        pwrite = getattr(os, "pwrite", None)
        while view:
            if pwrite is not None:
                n = pwrite(fd, view, offset)
            else:
                os.lseek(fd, offset, os.SEEK_SET)
                n = os.write(fd, view)
            view, offset = view[n:], offset + n

    def write_payload(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        """A build worker's write of one payload where it is not copied into the shared mapping: ``pwrite``."""
        self.pwrite(fd, data, offset)

    def allocate(self, fd: int, nbytes: int) -> bool:
        """Allocate the file's first ``nbytes`` on the disk (``posix_fallocate``).

        Returns:
            False where the system has no ``posix_fallocate`` (macOS, Windows); True once every byte is allocated.

        Raises:
            OSError: the allocation failed (ENOSPC; EOPNOTSUPP on some filesystems).
        """
        fallocate = getattr(os, "posix_fallocate", None)
        if fallocate is None:
            return False
        fallocate(fd, 0, nbytes)
        return True

    def truncate(self, fd: int, nbytes: int) -> None:
        os.ftruncate(fd, nbytes)

    def populate(self, mm: mmap.mmap, start: int, nbytes: int) -> None:
        """Fault in ``mm[start:start + nbytes]`` (``start`` page-aligned), writable, with ``advice``.

        Raises:
            OSError: the kernel refused (EINVAL: an advice it does not know; EFAULT or ENOSPC: pages it cannot back).
        """
        mm.madvise(self.advice, start, nbytes)

    def datasync(self, fd: int) -> None:
        getattr(os, "fdatasync", os.fsync)(fd)  # no fdatasync on macOS and Windows

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fsync_dir(self, folder: Path) -> None:
        if os.name == "nt":  # NTFS makes a rename durable itself; a folder cannot be opened for fsync there
            return
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def publish(self, tmp: Path, dest: Path, ours: Callable[[int], bool], purpose: str) -> None:
        """Rename ``tmp`` over ``dest``, once what is at ``dest`` is nothing or yolofeed's (``check_replaceable``)."""
        files.check_replaceable(dest, ours, purpose)  # again: what is there may have changed meanwhile
        os.replace(tmp, dest)

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    # -- the folder -----------------------------------------------------------------------------
    def free(self, folder: Path) -> int:
        """Bytes free where a pack in ``folder`` would take its space (a folder yet to be made: its parent's)."""
        return shutil.disk_usage(existing_ancestor(folder) or folder).free

    def in_memory(self, folder: Path) -> bool:
        """Whether ``folder`` is on a tmpfs (``/dev/shm``, often ``/tmp``): its files live in memory, not on a disk."""
        path = os.path.realpath(folder)
        try:
            mounts = psutil.disk_partitions(all=True)
        except (OSError, RuntimeError):  # no mount table to read: treat it as a disk
            return False
        under = [m for m in mounts if path == m.mountpoint or path.startswith(m.mountpoint.rstrip(os.sep) + os.sep)]
        # the deepest mount point; of two on the same point, the later one (the mount table's order), which hides it
        return bool(under) and max(reversed(under), key=lambda m: len(m.mountpoint)).fstype == "tmpfs"

    def writable(self, folder: Path, create: bool = True) -> OSError | None:
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

    def remove_leftovers(self, folder: Path) -> None:
        """Delete the temporary files of builds that did not finish; only under the folder's lock, when no one else
        can be writing them, and only those proven to be yolofeed's (``leftovers``)."""
        ours, others = leftovers(folder)
        for stale in ours:
            with contextlib.suppress(OSError):
                size = stale.stat().st_size
                stale.unlink()
                LOGGER.info(f"pack: removed {stale.name} ({size / 1e6:,.0f} MB), left by a build that did not "
                            "finish")
        for other in others:
            if other in _SAID_ALONE:  # said once a process: each split's build looks at the same folder
                continue
            _SAID_ALONE.add(other)
            LOGGER.info(f"pack: left {other} alone ({describe(other)}): it is named as a yolofeed temporary "
                        "file, but yolofeed did not write it (an older yolofeed did, or another program); delete it "
                        "yourself if nothing needs it")


_SAID_ALONE: set[Path] = set()  # the files remove_leftovers has said it left alone

_CURRENT: list[Disk] = [Disk()]


def current() -> Disk:
    """The ``Disk`` builds use now."""
    return _CURRENT[-1]


@contextlib.contextmanager
def using(disk: Disk) -> Iterator[Disk]:
    """Builds inside the block (and the workers they start) use ``disk``."""
    _CURRENT.append(disk)
    try:
        yield disk
    finally:
        _CURRENT.remove(disk)


def existing_ancestor(folder: Path) -> Path | None:
    """``folder`` or its nearest parent that exists: where a pack to be built there would take its space."""
    for p in (folder, *folder.parents):
        with contextlib.suppress(OSError):
            if p.is_dir():
                return p
    return None


def leftovers(folder: Path) -> tuple[list[Path], list[Path]]:
    """The temporary files of builds in ``folder``: those proven to be yolofeed's, and those only named like them.

    Proven: a regular file (not a link), named as a build names its temporary files, that starts as yolofeed writes
    them (the pack's preamble, the report's first line), or is empty: a build killed between creating its file and
    its first write leaves that, and an empty file holds nothing to lose. A file of any other kind or content is not
    yolofeed's to delete, whatever its name.
    """
    ours, others = [], []
    for path in folder.glob(f".*{TMP_MARK}*"):
        m = TEMP_NAME.match(path.name)
        if m is None:
            continue
        start = files.head(path, 256)  # None: a link, a folder, a FIFO ...
        if start is not None and (start == b"" or m["name"].endswith(SUFFIX) and start.startswith(PREAMBLE)
                                  or m["name"].endswith(REPORT_SUFFIX) and REPORT_HEAD.match(start)):
            ours.append(path)
        else:
            others.append(path)
    return ours, others

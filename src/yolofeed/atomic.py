"""Files written whole or not at all: a temporary file beside the target, fsynced, renamed over it.

The files a kill must not leave half of go through ``write_atomically``: a run's checkpoints, yolofeed.yaml and
results.csv where yolofeed rewrites it (its rows trimmed on a resume); bench.json, parity.json and the doctor's report.
Killed at any moment, the file holds its old bytes or the new ones; a link at its name is replaced, its target left
as it was. The fsync costs the disk's write time of the file once (a checkpoint, 5-110 MB, once an epoch; the reports
are kilobytes). What Ultralytics writes itself (results.csv's rows, appended each epoch; its plots and figures) it
writes as stock does, following a link at the name. Such a file read back (``read_back``) is read only where it is a
regular file of a bounded size.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

from yolofeed.errors import WriteError, describe

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # not on Windows
CLOEXEC = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO opened without it blocks until a writer comes
READ_BACK_MAX_BYTES = 64 << 20  # yolofeed.yaml and results.csv are kilobytes

MEANINGS = {  # errno -> what a failed write means, in words
    errno.ENOSPC: "the disk is full",
    getattr(errno, "EDQUOT", errno.ENOSPC): "the disk quota is full",
    errno.EFBIG: "the file would pass this process's file-size limit (ulimit -f)",
    errno.EROFS: "the disk is read-only",
    errno.EACCES: "no permission to write there",
    errno.EPERM: "no permission to write there",
}


def create_temp(path: Path) -> tuple[int, Path]:
    """A new file ``.<name>.tmp-<pid>-<random>`` beside ``path``, open for writing (``O_EXCL``: a name planted ahead
    is never opened, another is drawn). Mode 0666 less the umask, as ``write_bytes`` gives."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC, 0o666), tmp
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, f"no free temporary name beside {path} after 100 tries")


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX); nothing where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a folder: the rename is atomic all the same
        pass
    finally:
        os.close(fd)


def write_atomically(path: str | os.PathLike, data: bytes | bytearray | memoryview,
                     fixes: dict[int, str] | None = None) -> int:
    """Replace ``path`` with ``data``: a temporary file beside it, fsynced, renamed over it.

    Args:
        fixes: errno -> what the user can do, the end of a ``WriteError``'s line (a training run's: ``project=``).

    Returns:
        The number of bytes written (as ``Path.write_bytes``).

    Raises:
        WriteError: the write failed for a reason ``MEANINGS`` names (``write_failure``); ``path`` is as it was and the
            temporary file is removed.
        OSError: any other failed write, the same way.
    """
    path = Path(path)
    view = memoryview(data).cast("B")
    try:
        fd, tmp = create_temp(path)
    except OSError as e:
        if e.errno in MEANINGS:
            raise write_failure(path, e, fixes) from None
        raise
    try:
        try:
            with contextlib.suppress(OSError, AttributeError):  # the mode of the file it replaces, as an in-place
                mode = os.stat(path, follow_symlinks=False).st_mode  # write keeps it (no fchmod on Windows)
                if stat.S_ISREG(mode):
                    os.fchmod(fd, stat.S_IMODE(mode))
            rest = view
            while rest:
                rest = rest[os.write(fd, rest):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:  # Ctrl-C and SIGTERM included: nothing half-written is left
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OSError) and e.errno in MEANINGS:
            raise write_failure(path, e, fixes) from None
        raise
    fsync_dir(path.parent)
    return len(view)


def write_failure(path: Path, e: OSError, fixes: dict[int, str] | None = None) -> WriteError:
    """A failed write of ``path`` as one line: what the error means, that nothing half-written is left, and the fix
    ``fixes`` gives for it, if any."""
    fix = (fixes or {}).get(e.errno)
    before = "the file is as it was before" if os.path.lexists(path) else "no file is there"
    err = WriteError(f"could not write {path}: {MEANINGS[e.errno]} ({e.strerror}); {before}, nothing half-written "
                     "is left" + (f": {fix}" if fix else ""))
    err.errno, err.strerror, err.filename = e.errno, e.strerror, str(path)
    return err


def read_back(path: str | os.PathLike, max_bytes: int = READ_BACK_MAX_BYTES) -> bytes:
    """A run file yolofeed writes (yolofeed.yaml, results.csv), read whole where it is a regular file of at most
    ``max_bytes``: a FIFO planted at its name would block the read for ever, a link to /dev/zero fill the memory.

    Raises:
        FileNotFoundError: nothing there.
        OSError: it cannot be opened or read.
        ValueError: it is no regular file (what it is, in words), or larger than ``max_bytes``.
    """
    if not stat.S_ISREG(os.stat(path).st_mode):  # before the open: opening a device (a tty, a tape) acts on it
        raise ValueError(f"it is {describe(path)}, not a file yolofeed writes")
    fd = os.open(path, os.O_RDONLY | NONBLOCK | CLOEXEC)
    try:
        st = os.fstat(fd)  # again on what was opened: the name may have changed in between
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"it is {describe(path)}, not a file yolofeed writes")
        if st.st_size > max_bytes:
            raise ValueError(f"it holds {st.st_size:,} bytes, more than a file yolofeed writes there ({max_bytes:,})")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(max_bytes + 1)
    finally:
        os.close(fd)

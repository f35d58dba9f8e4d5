"""The files a build writes in a pack folder, written so that nothing else there is harmed.

A pack folder may be shared (a group-writable dataset folder, ``/tmp``) or one the user named that holds
other files (``out=``, ``pack_dir=``). So no write there follows a symbolic link or goes through a second
hard link, a temporary name is taken with ``O_EXCL`` and a random part (a name planted ahead is passed
over, never opened), no open blocks on a FIFO, and nothing found there is deleted or overwritten unless
its bytes show that yolofeed wrote it (the caller's ``ours``). What is refused is one ``PackError`` that
names the file, says what it is and what to do.

A rename replaces a link, never its target, and is atomic: the report is published that way, after its
name was checked. Between that check and the rename someone who may write the folder could put a link
there; the rename then replaces the link (the file it points to is untouched).
"""

from __future__ import annotations

import errno
import os
import secrets
import shlex
import stat
from collections.abc import Callable
from pathlib import Path

from yolofeed.errors import PackError, describe

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # not on Windows, where links need privileges to make
NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO opened without it blocks until a writer comes
SAFE = NOFOLLOW | NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
TMP_MARK = ".tmp-"  # temporary files are ".<name>.tmp-<pid>-<8 hex digits>"
ELSEWHERE = "give yolofeed another folder: out= (yolofeed pack) or pack_dir= (yolofeed train)"
# errors of an open that say what is at the path (the path itself, not the disk or the folder)
WHAT_IS_THERE = {errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EMLINK, errno.EACCES, errno.EPERM,
                 getattr(errno, "EFTYPE", errno.ELOOP)}


def owner(st: os.stat_result) -> str:
    """ "owned by root (uid 0), mode 0600" for a message."""
    try:
        import pwd

        name = f"{pwd.getpwuid(st.st_uid).pw_name} (uid {st.st_uid})"
    except (ImportError, KeyError):  # Windows; a uid with no name here
        name = f"uid {st.st_uid}"
    return f"owned by {name}, mode {stat.S_IMODE(st.st_mode):04o}"


def refused(path: str | os.PathLike, purpose: str, found: str = "", elsewhere: str = ELSEWHERE) -> PackError:
    """The error for something at ``path`` that yolofeed will not write through or over.

    Args:
        purpose: what yolofeed keeps under that name ("its build lock", "the train pack").
        found: what is there; default ``describe(path)``.
        elsewhere: the other way out, besides moving it (default: another pack folder).
    """
    q = shlex.quote(str(path))
    return PackError(f"{path} is {found or describe(path)}, not a file yolofeed made: yolofeed keeps {purpose} under "
                     f"that name and never writes through a link or over a file it did not make. Move it away "
                     f"(mv {q} {shlex.quote(str(path) + '.old')}), or {elsewhere}")


def denied(path: str | os.PathLike, e: OSError, needs: str, purpose: str, elsewhere: str = ELSEWHERE) -> PackError:
    """The error for a file yolofeed may not open (another user's, mode 000).

    Args:
        needs: "read" or "read and write".
    """
    try:
        who = f"; {owner(os.lstat(path))}"
    except OSError:
        who = ""
    return PackError(f"cannot open {path} ({e.strerror or e}{who}): yolofeed needs to {needs} it ({purpose}); ask its "
                     f"owner to change that (chmod, chown) or to remove it, or {elsewhere}")


def open_file(path: str | os.PathLike, flags: int, purpose: str, mode: int = 0o644, single_link: bool = False,
              elsewhere: str = ELSEWHERE) -> int:
    """``os.open`` of a regular file that follows no link and never blocks (a FIFO), for a pack folder's files.

    Args:
        purpose, elsewhere: for the messages (see ``refused``).
        single_link: refuse a file with other hard links too (one written in place would change them all).

    Returns:
        The descriptor (blocking reads and writes: ``O_NONBLOCK`` does nothing to a regular file).

    Raises:
        PackError: a link, a folder, a FIFO or device, a file with other hard links, or one this user may not open.
        OSError: anything else (a full disk, a read-only filesystem): the caller's to report.
    """
    needs = "read and write" if flags & (os.O_WRONLY | os.O_RDWR) else "read"
    try:
        fd = os.open(path, flags | SAFE, mode)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM) and not os.path.islink(path):
            raise denied(path, e, needs, purpose, elsewhere) from None
        if e.errno in WHAT_IS_THERE:
            raise refused(path, purpose, elsewhere=elsewhere) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (single_link and st.st_nlink > 1):
        os.close(fd)
        raise refused(path, purpose, elsewhere=elsewhere)
    return fd


def head(path: str | os.PathLike, nbytes: int) -> bytes | None:
    """The first ``nbytes`` of the regular file at ``path`` (not followed if a link); None when it is anything else,
    is missing or cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | SAFE)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with open(fd, "rb", closefd=False) as f:
            return f.read(nbytes)
    except OSError:
        return None
    finally:
        os.close(fd)


def create_temp(folder: Path, name: str) -> tuple[int, Path]:
    """Create ``folder/.<name>.tmp-<pid>-<random>``, new (``O_EXCL``: a file, link or folder planted under a guessed
    name is never opened; another name is drawn), open for reading and writing.

    Returns:
        Its descriptor and path.
    """
    for _ in range(100):
        tmp = folder / f".{name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | SAFE, 0o644), tmp
        except FileExistsError:
            continue
    raise PackError(f"could not find a free temporary name in {folder} after 100 tries (each one taken): the folder "
                    f"is full of names like {tmp.name}. Remove them, or {ELSEWHERE}")


def check_replaceable(path: Path, ours: Callable[[int], bool], purpose: str) -> None:
    """Refuse to publish over ``path`` unless nothing is there or what is there is yolofeed's.

    Args:
        ours: whether the regular file open as this descriptor is one yolofeed writes under this name (its bytes say).

    Raises:
        PackError: a link, a folder, a FIFO, a file yolofeed did not write, or one it may not read.
    """
    if not os.path.lexists(path):
        return
    fd = open_file(path, os.O_RDONLY, purpose)
    try:
        mine = ours(fd)
    finally:
        os.close(fd)
    if not mine:
        raise refused(path, purpose, "a file yolofeed did not write (its bytes are not those yolofeed writes there)")


def write_replacing(path: Path, data: bytes, ours: Callable[[int], bool], purpose: str) -> None:
    """Write ``data`` to ``path`` atomically (a new temporary file, then a rename), never over what is not yolofeed's.

    Raises:
        PackError: as ``check_replaceable``; nothing is written.
        OSError: writing failed (the temporary file is removed).
    """
    check_replaceable(path, ours, purpose)
    fd, tmp = create_temp(path.parent, path.name)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        check_replaceable(path, ours, purpose)  # again, just before: it may have changed while writing
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

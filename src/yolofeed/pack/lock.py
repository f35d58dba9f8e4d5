"""One builder per pack folder, and a lock that a killed builder never leaves held.

Two mechanisms behind one interface, ``FolderLock``:

* ``kernel`` (POSIX): ``fcntl.lockf`` on ``<folder>/.lock``. The kernel drops the lock when its
  process dies, however it dies (``kill -9``, the OOM killer). A ``lockf`` record lock belongs to the
  process, not to the open file, so the build's forked worker processes never hold it: with ``flock``
  they inherited it, and orphaned workers kept every later build waiting.
* ``file``: where there is no ``fcntl`` (Windows) or the filesystem refuses record locks (NFS mounted
  with ``nolock``: ``ENOLCK``), holding the lock means having created ``<folder>/.lock.owner`` with
  ``O_EXCL``. A dead holder leaves that file behind: a waiter takes over when the recorded holder ran
  on this host and its PID is gone or now belongs to a newer process (its start time differs).

A record lock is dropped when its process closes *any* descriptor of the file, so the holder reads
and writes the file only through the descriptor it locked. Either way the holder writes who it is
(PID, host, process start time, since when, command line) into its lock file, a waiter logs whom it
waits for and for how long, and the next holder says so when it finds the record of a holder that
died. The kernel lock costs one ``fcntl`` call; a waiter polls every ``poll`` seconds (0.5 s:
nothing next to a pack build).

The lock files are opened as ``pack/files.py`` opens a pack folder's files: a symbolic link, a folder, a
FIFO, a file with other hard links or one holding anything but a holder record is refused with one line
(``PackError``), never written through, emptied or deleted; so is a file this user may not open.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shlex
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from yolofeed import processes
from yolofeed.pack import files
from yolofeed.processes import process_alive, process_start

try:
    import fcntl
except ImportError:  # Windows: the file mechanism
    fcntl = None

LOGGER = logging.getLogger(__name__)
LOCK_NAME = ".lock"
OWNER_NAME = ".lock.owner"
BREAK_NAME = ".lock.break"
STALE_BREAK = 30.0  # s: a break file older than this belongs to a waiter that died while breaking
UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, getattr(errno, "ENOTSUP", -1)}
PURPOSE = "its build lock"
FOREIGN = "a file yolofeed did not write (it holds something other than a holder record)"
RECORD_LIMIT = 1 << 16  # bytes: a holder record is ~300; a larger file is not one

_threads: dict[str, threading.Lock] = {}  # record locks are per process: threads take turns here first
_threads_guard = threading.Lock()


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a lock: enough to tell, from this host, whether it is still running."""

    pid: int
    host: str
    started: float  # the process's start time, epoch seconds: a reused PID has another
    since: float  # when it took the lock, epoch seconds
    command: str

    @classmethod
    def me(cls) -> Holder:
        pid = os.getpid()
        return cls(pid, socket.gethostname(), process_start(pid) or 0.0, time.time(), " ".join(sys.argv)[:300])

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """The holder a lock file records; None for an empty or unreadable record."""
        try:
            d = json.loads(text)
            return cls(int(d["pid"]), str(d["host"]), float(d["started"]), float(d["since"]), str(d["command"]))
        except (ValueError, KeyError, TypeError):
            return None

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    def state(self) -> str:
        """'alive', 'dead' (this host, PID gone or reused) or 'unknown' (another host: cannot look)."""
        if self.host != socket.gethostname():
            return "unknown"
        return "alive" if process_alive(self.pid, self.started) else "dead"

    def describe(self) -> str:
        since = datetime.fromtimestamp(self.since, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        where = "this host" if self.host == socket.gethostname() else f"host {self.host}"
        return f"PID {self.pid} on {where} ('{self.command}', holding it since {since})"


def _read_fd(fd: int, limit: int = RECORD_LIMIT) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, limit)


def _record_of(data: bytes | None) -> tuple[Holder | None, bool]:
    """The holder a lock file's bytes record, and whether they are a lock file yolofeed wrote at all.

    Empty (released, or made and not yet recorded), a holder record, or the start of one (a holder killed while
    writing it) are yolofeed's; anything else is someone else's file, which the lock must not empty.
    """
    if data is None:
        return None, False
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, False
    holder = Holder.parse(text)
    return holder, holder is not None or text == "" or text.startswith('{"pid": ')


class FolderLock:
    """An exclusive, inter-process lock on one folder (see the module docstring).

    Use as a context manager. Waiting is unbounded: a live holder is building the same pack, and
    waiting for it is what DDP ranks and a second ``yolofeed pack`` should do.

    Args:
        folder: the pack folder (created if missing).
        poll: seconds between attempts while another process holds the lock.
        report_every: seconds between "still waiting" messages.
        clock, sleep: injected by tests.
    """

    def __init__(self, folder: str | os.PathLike, poll: float = 0.5, report_every: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 purpose: str = PURPOSE, elsewhere: str = files.ELSEWHERE):
        self.folder = Path(folder)
        self.purpose, self.elsewhere = purpose, elsewhere  # for the messages about the lock file (files.refused)
        self.poll, self.report_every, self.clock, self.sleep = poll, report_every, clock, sleep
        self.mechanism = "kernel" if fcntl is not None else "file"
        self._fd = -1
        self._thread_lock: threading.Lock | None = None
        self.previous: Holder | None = None  # the record of a holder that died holding the lock, if any

    @property
    def path(self) -> Path:
        return self.folder / (LOCK_NAME if self.mechanism == "kernel" else OWNER_NAME)

    # -- acquiring ---------------------------------------------------------------------------
    def check(self) -> None:
        """Raise now what taking the lock would raise about the lock file there, making and writing nothing.

        Raises:
            PackError: the kernel mechanism's lock file is not one yolofeed made, or this user may not write it.
        """
        if self.mechanism != "kernel" or not os.path.lexists(self.path):
            return
        if os.path.isfile(self.path) and not os.path.islink(self.path) and not os.access(self.path, os.R_OK | os.W_OK):
            # said as taking the lock says it (the open below, for reading only, would say "read")
            raise files.denied(self.path, PermissionError(errno.EACCES, os.strerror(errno.EACCES)), "read and write",
                               self.purpose, self.elsewhere)
        fd = files.open_file(self.path, os.O_RDONLY, self.purpose, single_link=True, elsewhere=self.elsewhere)
        try:
            ours = _record_of(_read_fd(fd))[1]
        finally:
            os.close(fd)
        if not ours:
            raise files.refused(self.path, self.purpose, FOREIGN, self.elsewhere)
        if not os.access(self.path, os.W_OK):
            raise files.denied(self.path, PermissionError(errno.EACCES, os.strerror(errno.EACCES)), "read and write",
                               self.purpose, self.elsewhere)

    def try_acquire(self, take_over: bool = False) -> bool:
        """Take the lock if nobody holds it, without waiting; True if taken. ``take_over``: where the file
        mechanism's holder died (its file stays behind), remove its file and try once more, as ``acquire`` does."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with _threads_guard:
            self._thread_lock = _threads.setdefault(os.path.realpath(self.folder), threading.Lock())
        if not self._thread_lock.acquire(blocking=False):
            return False
        try:
            taken = self._try()
            if not taken and take_over and self.mechanism == "file":
                holder = self._read_holder()
                if holder is not None and self._dead(holder):
                    self._break(holder)
                    taken = self._try()
        except BaseException:
            self._thread_lock.release()
            raise
        if not taken:
            if self._fd >= 0:  # the kernel mechanism's descriptor: this process holds no lock through it
                os.close(self._fd)
                self._fd = -1
            self._thread_lock.release()
            self._thread_lock = None
            return False
        self._record()
        return True

    def acquire(self) -> FolderLock:
        """Take the lock, waiting as long as a live holder has it (see the class docstring)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        key = os.path.realpath(self.folder)
        with _threads_guard:
            self._thread_lock = _threads.setdefault(key, threading.Lock())
        if not self._thread_lock.acquire(blocking=False):
            LOGGER.info(f"pack: waiting for another thread of this process building in {self.folder} ...")
            processes.acquire(self._thread_lock)
        try:
            t0 = self.clock()
            last: tuple[Holder | None, float] | None = None  # what was reported, and when
            while not self._try():
                holder, now = self._read_holder(), self.clock()
                if last is None or holder != last[0] or now - last[1] >= self.report_every:
                    self._report(holder, now - t0)
                    last = holder, now
                if self.mechanism == "file" and self._dead(holder):
                    self._break(holder)
                    continue
                self.sleep(self.poll)
        except BaseException:
            self._thread_lock.release()
            raise
        if self.previous is not None:
            LOGGER.warning(f"pack: the previous builder in {self.folder}, {self.previous.describe()}, died "
                           "without finishing; taking over")
        self._record()
        return self

    def _report(self, holder: Holder | None, waited: float) -> None:
        who = holder.describe() if holder is not None else "a process that has not recorded itself yet"
        state = {"alive": "running", "dead": "gone", "unknown": "cannot be checked from here"}.get(
            holder.state() if holder else "", "")
        hint = ""
        if holder is not None and holder.state() == "unknown" and self.mechanism == "file":
            hint = f". If no build runs there any more, delete it: rm {shlex.quote(str(self.path))}"
        LOGGER.info(f"pack: waiting for {who}{f' ({state})' if state else ''} to finish building in "
                    f"{self.folder}; waited {waited:.0f} s{hint}")

    def _try(self) -> bool:
        """One non-blocking attempt; switches to the file mechanism where record locks are refused.

        Raises:
            PackError: the lock file is not one yolofeed made (see the module docstring), or may not be opened.
        """
        if self.mechanism == "kernel":
            if self._fd < 0:
                self._fd = files.open_file(self.folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, self.purpose,
                                           single_link=True, elsewhere=self.elsewhere)
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EACCES, errno.EAGAIN):
                    return False
                if e.errno not in UNSUPPORTED:
                    raise
                LOGGER.info(f"pack: {self.folder} refuses record locks ({e.strerror}); using {OWNER_NAME} files")
                os.close(self._fd)
                self._fd, self.mechanism = -1, "file"
                return self._try()
            # read through our own descriptor: closing any other descriptor of the file would drop the lock
            self.previous, ours = _record_of(_read_fd(self._fd))  # a holder that released it left it empty
            if not ours:  # checked before the record is written over it
                os.close(self._fd)
                self._fd = -1
                raise files.refused(self.path, self.purpose, FOREIGN, self.elsewhere)
            return True
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | files.SAFE, 0o644)
        except FileExistsError:
            self.previous = None  # another waiter took over first
            return False
        return True

    def _dead(self, holder: Holder | None) -> bool:
        """Whether a file lock's holder is gone: its record says so, or it never wrote one in STALE_BREAK s."""
        if holder is not None:
            return holder.state() == "dead"
        try:
            return time.time() - os.lstat(self.path).st_mtime > STALE_BREAK
        except OSError:
            return False

    def _break(self, dead: Holder | None) -> None:
        """Remove the file lock of a dead holder, unless another waiter got there first.

        Raises:
            PackError: the lock file, or the break file of a waiter that died, is not one yolofeed made.
        """
        brk = self.folder / BREAK_NAME
        try:
            fd = os.open(brk, os.O_WRONLY | os.O_CREAT | os.O_EXCL | files.SAFE, 0o644)
        except FileExistsError:
            self._remove_stale_break(brk, self.purpose, self.elsewhere)
            self.sleep(self.poll)
            return
        try:
            os.close(fd)
            holder, ours = _record_of(files.head(self.path, RECORD_LIMIT))
            if not ours and os.path.lexists(self.path):
                raise files.refused(self.path, self.purpose, elsewhere=self.elsewhere)
            if holder == dead and self._dead(dead):  # still the dead one: nobody took over
                self.path.unlink(missing_ok=True)
                self.previous = dead
        finally:
            brk.unlink(missing_ok=True)

    @staticmethod
    def _remove_stale_break(brk: Path, purpose: str, elsewhere: str) -> None:
        """Remove the break file of a waiter that died while breaking (older than STALE_BREAK s)."""
        try:
            stale = time.time() - os.lstat(brk).st_mtime > STALE_BREAK
        except OSError:
            return
        if stale and files.head(brk, 1) != b"":  # yolofeed makes it empty, and it stays so
            raise files.refused(brk, purpose, elsewhere=elsewhere)
        if stale:
            with contextlib.suppress(OSError):
                brk.unlink()

    # -- the holder record -------------------------------------------------------------------
    def holder(self) -> Holder | None:
        """Who holds the lock, as its record says (None: no record, or none readable); read without taking it."""
        return self._read_holder()

    def _read_holder(self) -> Holder | None:
        """The record in the lock file, read by a process that does not hold the lock (never blocking on a FIFO)."""
        return _record_of(files.head(self.path, RECORD_LIMIT))[0]

    def _record(self) -> None:
        """Write the holder record of a lock just taken; a failed write (a full disk) lets the lock go again."""
        try:
            self._write_holder()
        except BaseException:
            self.release()
            raise

    def _write_holder(self) -> None:
        blob = Holder.me().dumps().encode("utf-8")
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        os.write(self._fd, blob)

    # -- releasing ---------------------------------------------------------------------------
    def release(self) -> None:
        if self._fd < 0:
            return
        try:
            if self.mechanism == "kernel":
                os.ftruncate(self._fd, 0)  # an empty record: nobody died holding it
                fcntl.lockf(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = -1
            if self.mechanism == "file":
                self.path.unlink(missing_ok=True)  # after the close: Windows cannot delete an open file
            if self._thread_lock is not None:
                self._thread_lock.release()
                self._thread_lock = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


__all__ = ["FolderLock", "Holder", "process_alive", "process_start"]

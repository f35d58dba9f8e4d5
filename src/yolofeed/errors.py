"""The exceptions yolofeed raises for things a user can fix.

Every message says what was expected, what was found, and what to do. The CLI prints them
without a traceback; anything else that escapes is a bug in yolofeed.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import stat
from collections.abc import Callable, Iterator


class YolofeedError(Exception):
    """Base class: an error whose message tells the user what to change. A long job it stopped may put on it where it
    stopped and how to go on (``stopped``, set by ``say_stopped``), which the CLI prints in the message's place."""

    stopped: str | None = None


class ConfigError(YolofeedError):
    """A command or keyword argument is unknown or has a value of the wrong kind."""


class DatasetError(YolofeedError):
    """The data yaml or the dataset it names cannot be used (missing keys, no images, no usable sample)."""


class PackError(YolofeedError):
    """A pack is missing, unreadable, truncated or not a yolofeed pack."""


class PackSpaceError(PackError):
    """A pack would not fit in the free space of its folder (found before anything is written)."""


class StalePackError(PackError):
    """A valid pack that does not match what is asked of it (source changed, other imgsz or version)."""


class ForeignPackError(StalePackError):
    """A valid pack built from another data yaml (two yamls of one name under one ``out=`` / ``pack_dir=``)."""


class NewerPackError(StalePackError):
    """A pack of a format version above the one this yolofeed writes: a newer yolofeed built it."""


class WriteError(YolofeedError, OSError):
    """A file yolofeed writes could not be written (a full disk, a file-size limit, a read-only folder), with nothing
    half-written left; an ``OSError`` too, with the failed write's ``errno``, ``strerror`` and ``filename``."""

    def __str__(self) -> str:  # the message, not OSError's "[Errno n] strerror: filename"
        return str(self.args[0]) if self.args else ""

    def __reduce__(self):  # pickled whole (a bench mode's error crosses processes): errno and filename kept
        return _write_error, (str(self), self.errno, self.strerror, self.filename)


def _write_error(message: str, code: int | None, strerror: str | None, filename: str | None) -> WriteError:
    err = WriteError(message)
    err.errno, err.strerror, err.filename = code, strerror, filename
    return err


class UltralyticsError(YolofeedError):
    """The installed Ultralytics lacks something yolofeed relies on (``yolofeed.ultralytics_seam`` says what)."""


class UltralyticsVersionError(UltralyticsError, ImportError):
    """Raised when a module that uses Ultralytics is imported with an Ultralytics yolofeed was not written for.

    An ``ImportError`` too: the module cannot be used, as if a dependency were missing.
    """


_CALLER_SAYS: contextvars.ContextVar[bool] = contextvars.ContextVar("yolofeed_caller_says_stops", default=False)


@contextlib.contextmanager
def caller_says_stops() -> Iterator[None]:
    """Within it (this thread's context), a job stopped by a ``YolofeedError`` leaves its stop line to the caller
    (``say_stopped``): the CLI prints it once, as its error line on stderr, where the job's log line would say it again
    on stdout. A training from Python in another thread logs its own as before."""
    token = _CALLER_SAYS.set(True)
    try:
        yield
    finally:
        _CALLER_SAYS.reset(token)


def say_stopped(e: BaseException, line: str, log: Callable[[str], None]) -> None:
    """Say where a job stopped by ``e`` and how to go on: logged, or kept on ``e`` for the caller that prints it.

    Args:
        e: what stopped the job.
        line: the stop line, in yolofeed's words without its name.
        log: where the line goes unless ``e`` is a ``YolofeedError`` within ``caller_says_stops``, which keeps it as
            ``e.stopped`` (``stop_line`` finds it).
    """
    if isinstance(e, YolofeedError) and _CALLER_SAYS.get():
        e.stopped = line
    else:
        log(line)


def stop_line(e: BaseException) -> str | None:
    """The stop line ``say_stopped`` kept on ``e``, or on the error ``e`` replaced (a Ctrl-C or SIGTERM during the
    stop's clean-up is raised there, the error as its context); None where none was kept."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, YolofeedError) and e.stopped:
            return e.stopped
        e = e.__context__
    return None


def first_line(e: BaseException, limit: int = 200) -> str:
    """``e`` said in one line for a warning: its type and its message's first line (torch's CUDA and cuDNN errors run
    to several, with a C++ stack), at most ``limit`` characters of it."""
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:limit]}"


def kind(mode: int) -> str:
    """What a file of ``st_mode`` is, in words: "a folder", "a FIFO (named pipe)", ..."""
    for test, words in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"),
                        (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return words
    return "a special file"


def describe(path: str | os.PathLike) -> str:
    """What is at ``path``, without following it: "a symbolic link to /dev/zero (a character device)", "a folder"."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if not stat.S_ISLNK(st.st_mode):
        links = f" with {st.st_nlink} hard links (other names share its bytes)" if (
            stat.S_ISREG(st.st_mode) and st.st_nlink > 1) else ""
        return kind(st.st_mode) + links
    try:
        to = os.readlink(path)
    except OSError:
        to = "?"
    try:
        target = kind(os.stat(path).st_mode)
    except FileNotFoundError:
        target = "which does not exist"
    except OSError as e:
        target = "a link loop" if e.errno == errno.ELOOP else f"unreadable: {e.strerror or e}"
    return f"a symbolic link to {to} ({target})"

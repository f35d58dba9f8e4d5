"""The exceptions yolofeed raises for things a user can fix.

Every message says what was expected, what was found, and what to do. The CLI prints them
without a traceback; anything else that escapes is a bug in yolofeed.
"""

from __future__ import annotations


class YolofeedError(Exception):
    """Base class: an error whose message tells the user what to change."""


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


def first_line(e: BaseException, limit: int = 200) -> str:
    """``e`` said in one line for a warning: its type and its message's first line (torch's CUDA and cuDNN errors run
    to several, with a C++ stack), at most ``limit`` characters of it."""
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:limit]}"

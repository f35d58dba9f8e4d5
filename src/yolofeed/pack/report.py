"""``<split>.report.txt``, the file beside a pack that lists its skipped images and notes, one a line.

Tab-separated, a name with a control character quoted as a shell quotes it, so ``cut -f1 | xargs`` names the very
files; written by a new temporary file and a rename, never over a file that is not a report yolofeed wrote.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from yolofeed.pack import files
from yolofeed.pack.layout import CONTROL, SUFFIX

REPORT_SUFFIX = ".report.txt"
# the report's first line, as every yolofeed has written it: what proves a report file to be yolofeed's
REPORT_HEAD = re.compile(rb"# [^\n]+\.yfpack: \d+ skipped, \d+ notes\. file<TAB>status<TAB>reason\n")


def write_report(dest: Path, skipped: list[tuple[str, str]], notes: list[tuple[str, str]]) -> Path:
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


def where_listed(dest: Path, skipped: int, notes: int) -> str:
    """Where a pack's ``skipped`` images and ``notes`` are listed in full, for its summary: its report, where that is
    a file (not a link) that ``write_report`` wrote for this pack and these counts; else the pack's header, the report
    named as not written (something else under its name, a folder that refused it)."""
    report = report_path(dest)
    head = f"# {dest.name}: {skipped} skipped, {notes} notes.".encode()
    try:
        if not report.is_symlink() and report.is_file():
            with open(report, "rb") as f:
                if f.read(len(head)) == head:
                    return f"full list: {report}"
    except OSError:
        pass
    return f"full list: in the pack's header ({report} is not its report: not written)"


# what a skip reason quotes of its own sample: values in brackets or quotes, numbers ("uses class 3 ... nc=2")
_PARTICULAR = re.compile(r"\([^()]*\)|'[^']*'|-?\d+(?:\.\d+)?(?:e-?\d+)?")


def reason_kind(image: str, reason: str) -> str:
    """A skip reason without what is particular to its sample: the image's and its label file's paths, the values and
    numbers it quotes. The same mistake in every label file (a class beyond nc, pixel coordinates) is one kind.

    Args:
        image: the skipped image's path, as the pack records it.
        reason: why it was skipped.
    """
    for path in _paths_of(image):
        reason = reason.replace(path, "")
    return _PARTICULAR.sub("#", reason)


def _paths_of(image: str) -> tuple[str, str]:
    """A sample's label file (as Ultralytics finds it) and image: the paths its skip reasons may name."""
    from yolofeed.ultralytics_seam import img2label_paths

    return img2label_paths([image])[0], image


class ReasonKind(NamedTuple):
    """One kind of skip reason (``reason_kind``) among a split's skipped images."""

    count: int
    image: str  # the kind's first image
    reason: str  # the first image's reason
    alike: bool  # every reason of the kind reads the same

    def said(self) -> str:
        """``"19x, the first: <reason>"`` where the kind's reasons differ, ``"19x <reason>"`` where they are one; the
        first image is named where the reason names neither it nor its label file."""
        named = any(path in self.reason for path in _paths_of(self.image))
        if self.alike:
            return f"{self.count}x {self.reason}" + ("" if named else f" (first: {self.image})")
        return f"{self.count}x, the first: " + (self.reason if named else f"{self.image}: {self.reason}")


def commonest_reasons(skipped: list[tuple[str, str]], n: int) -> list[ReasonKind]:
    """The ``n`` commonest kinds of reason (``reason_kind``) among skipped ``(image, reason)`` pairs, commonest first.

    Args:
        skipped: each skipped image and its reason, in the order found.
        n: the most kinds returned.
    """
    kinds = [reason_kind(f, r) for f, r in skipped]
    first: dict[str, tuple[str, str]] = {}
    alike: dict[str, bool] = {}
    for (f, r), k in zip(skipped, kinds):
        first.setdefault(k, (f, r))
        alike[k] = alike.get(k, True) and r == first[k][1]
    return [ReasonKind(c, *first[k], alike[k]) for k, c in Counter(kinds).most_common(n)]


def read_report(dest: Path) -> list[list[str]]:
    """Rows of a pack's report file (for tests and the doctor)."""
    text = report_path(dest).read_text(encoding="utf-8", errors="surrogateescape")
    return [[_unquote_field(f) for f in line.split("\t")] for line in text.split("\n")[1:] if line]

"""A pack's size, estimated before it is built, against the free space where it goes.

Estimated from up to ``SPACE_SAMPLE`` image headers, evenly spread (exact for smaller splits; a header read is a
fraction of a millisecond), so a build that cannot fit is refused before it writes anything.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from yolofeed.errors import PackSpaceError
from yolofeed.pack import codecs
from yolofeed.pack.disk import current
from yolofeed.pack.layout import INDEX_DTYPE, align
from yolofeed.pack.source import SplitSource
from yolofeed.pack.verify import file_problem

DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}
SPACE_SAMPLE = 256  # image headers read to estimate a pack's size before building it
MOVE_HINT = "put the packs on a disk with room: out=/path (yolofeed pack) or pack_dir=/path (yolofeed train)"


@dataclass
class Space:
    """A pack's size against the free space where it goes, measured before its build."""

    free: int  # bytes free in the pack folder before the build
    estimate: int  # bytes the pack is expected to take
    bound: int  # bytes it takes at most (the format's largest payload for every image), else the estimate


def gb(nbytes: float) -> str:
    """A size for messages: 9.32 GB, 184.5 MB, 12 KB."""
    if nbytes >= 1e9:
        return f"{nbytes / 1e9:,.2f} GB"
    return f"{nbytes / 1e6:,.1f} MB" if nbytes >= 1e6 else f"{nbytes / 1e3:,.0f} KB"


def plan_space(src: SplitSource, folder: Path, imgsz: int, format: str) -> Space:
    """Compare the pack's size with the folder's free space before writing anything.

    The size is estimated from the headers of up to ``SPACE_SAMPLE`` images, evenly spread (exact
    for smaller splits; a header read is a fraction of a millisecond).

    Raises:
        PackError: the pack will not fit; the message gives bytes needed and free, the folder and the fix.
    """
    n, codec = len(src.im_files), codecs.get(format)
    estimate, tail, sampled = _estimate(src, imgsz, format)
    largest = codec.max_payload(imgsz)
    bound = int(n * align(largest) + tail) if largest is not None else estimate
    free = current().free(folder)
    if free < estimate:
        how = "" if sampled == n else f", estimated from the headers of {sampled} of its {n:,} images"
        raise PackSpaceError(f"not enough free space for the {src.split} pack in {folder}: it needs "
                             f"{gb(estimate)} ({estimate:,} bytes{how}), {gb(free)} ({free:,} bytes) are free. "
                             f"Free some space, or {MOVE_HINT}")
    return Space(free, estimate, bound)


def _tail_bytes(src: SplitSource, label_bytes: list[int]) -> float:
    """Everything of a pack but the payloads: index + label CRC + worst-case header and report lines per image,
    labels at most twice their text, the paths, and the header's fixed part (class names, ~2 KB of keys)."""
    n = len(src.im_files)
    tail = n * (INDEX_DTYPE.itemsize + 4 + 256 + 2 * float(np.mean(label_bytes) if label_bytes else 0))
    return tail + sum(len(os.fsencode(f)) + 1 for f in src.im_files) + len(json.dumps(list(src.names), indent=1)) + 4096


def estimate_bytes(src: SplitSource, imgsz: int, format: str) -> int:
    """The size of a split's pack in ``format``, from the headers of up to ``SPACE_SAMPLE`` images evenly spread
    (exact for smaller splits; a header read is a fraction of a millisecond)."""
    return _estimate(src, imgsz, format)[0]


def _estimate(src: SplitSource, imgsz: int, format: str) -> tuple[int, float, int]:
    """``estimate_bytes``, the part of it that is not payloads, and how many image headers were read."""
    n, codec = len(src.im_files), codecs.get(format)
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

"""Drop files' pages from the page cache (``posix_fadvise(DONTNEED)``), so that their next read comes from storage.

Other files stay cached, unlike ``echo 1 > /proc/sys/vm/drop_caches``: a run beside this one keeps its data warm.
Dirty pages are written first (fsync), since only clean pages can be dropped.

Usage: python -m tools.device.evict FILE [FILE ...]
"""

from __future__ import annotations

import os
import sys


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    for p in sys.argv[1:]:
        evict(p)

"""Drop files' pages from the page cache (``posix_fadvise(DONTNEED)``), so that their next read comes from storage.

Other files stay cached, unlike ``echo 1 > /proc/sys/vm/drop_caches``: a run beside this one keeps its data warm.
Dirty pages are written first (fsync), since only clean pages can be dropped.

Usage: python -m tools.device.evict FILE [FILE ...]
"""

from __future__ import annotations

import errno
import os
import stat
import sys


def evict(path: str) -> None:
    """Drop ``path``'s clean pages from the page cache, after writing its dirty ones.

    Raises:
        OSError: the file cannot be opened, or is not a regular file (a folder, a device, a pipe).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder's pages are not its files'; fsync refuses devices
            raise OSError(errno.EINVAL, "not a regular file: name the files themselves")
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main(paths: list[str]) -> int:
    """Evict each file; one line per file that cannot be, and the others still evicted. Returns the exit status."""
    failed = 0
    for p in paths:
        try:
            evict(p)
        except OSError as e:
            print(f"evict: {p}: {e.strerror or e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    sys.exit(main(sys.argv[1:]))

"""How much memory this process may use: the machine's, or its cgroup's limit where that is lower."""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil

CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # cgroup v2, v1


def _own_cgroup_limits() -> tuple[str, ...]:
    """The memory limit files of this process's own cgroup (a job scheduler's nested one), then the root's."""
    own = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():  # "0::/path" (v2), "4:memory:/path" (v1)
            _, controllers, rel = line.split(":", 2)
            if controllers == "":
                own.append(f"/sys/fs/cgroup{rel}/memory.max")
            elif "memory" in controllers.split(","):
                own.append(f"/sys/fs/cgroup/memory{rel}/memory.limit_in_bytes")
    return (*own, *CGROUP_LIMITS)


def memory_limit(cgroup_files: tuple[str, ...] | None = None) -> int:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit where that is lower (containers,
    job schedulers).

    Args:
        cgroup_files: limit files to read; default this process's cgroup's and the root's.
    """
    total = psutil.virtual_memory().total
    for path in _own_cgroup_limits() if cgroup_files is None else cgroup_files:
        with contextlib.suppress(OSError, ValueError):
            total = min(total, int(Path(path).read_text().strip()))  # "max" (no limit) is a ValueError
    return total

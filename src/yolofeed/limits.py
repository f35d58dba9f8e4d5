"""What this process may use: its CPU cores and its memory, the limits of its cgroup (a container's, a job
scheduler's) included.

A container often sees the host's cores and memory (``os.sched_getaffinity``, ``psutil.virtual_memory``) while its
cgroup grants it a fraction of them: ``docker run --cpus=2 --memory=8g`` on a 64-core host. Sized on the host's
figures, yolofeed would start 63 worker processes on two cores' worth of time, or start children that the cgroup's
out-of-memory killer answers by killing the largest process in it: the training. Each figure here is the lower of
the host's and the cgroup's (version 2, or version 1's ``cpu`` and ``memory`` controllers; this process's own cgroup,
then the root's).
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

import psutil

ROOT = Path("/sys/fs/cgroup")


def _own_cgroups(v1_controller: str) -> list[Path]:
    """The folders of this process's own cgroup and of each cgroup above it (version 2's, and version 1's of
    ``v1_controller``: a limit set on a parent, a systemd slice say, binds its children), then the root's."""
    own: list[Path] = []
    text = _read(Path("/proc/self/cgroup")) or ""
    for line in text.splitlines():  # "0::/path" (v2), "4:memory:/path" (v1); a line of another form is passed over
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, rel = fields
        base = ROOT if controllers == "" else ROOT / controllers if v1_controller in controllers.split(",") else None
        if base is None:
            continue
        parts = [p for p in rel.split("/") if p and p != ".."]
        own.extend(base.joinpath(*parts[:n]) for n in range(len(parts), 0, -1))
    return [*own, ROOT, ROOT / v1_controller]


def _read(path: Path) -> str | None:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return path.read_text().strip()
    return None


def _cpu_quota(folders: list[Path]) -> float | None:
    """Cores' worth of CPU time the lowest quota among ``folders`` grants (v2 ``cpu.max``: "quota period" or "max
    period"; v1 ``cpu.cfs_quota_us``, -1 for none, over ``cpu.cfs_period_us``); None where none is set."""
    quotas = []
    for folder in folders:
        v2 = _read(folder / "cpu.max")
        parts = v2.split() if v2 else []
        pairs = [parts] if len(parts) == 2 and parts[0] != "max" else []
        pairs.append([_read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")])  # quota -1: none
        for quota, period in pairs:
            with contextlib.suppress(TypeError, ValueError, ArithmeticError):  # missing, garbage, 0 or huge values
                if int(quota) > 0 and int(period) > 0:
                    quotas.append(int(quota) / int(period))
    return min(quotas) if quotas else None


def usable_cores(folders: list[Path] | None = None) -> int:
    """CPU cores this process may run on: its affinity mask (not the machine's count), fewer where its cgroup's CPU
    quota grants fewer cores' worth of time (rounded up).

    Args:
        folders: the cgroup folders to read; default this process's own and the root's.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    quota = _cpu_quota(_own_cgroups("cpu") if folders is None else folders)
    return max(1, min(cores, math.ceil(quota))) if quota else cores


def _memory_files(folders: list[Path]) -> list[tuple[Path, Path, Path, str]]:
    """(limit, usage, stat, the stat's reclaimable page-cache key) of each folder, v2's then v1's names."""
    return [f for folder in folders for f in (
        (folder / "memory.max", folder / "memory.current", folder / "memory.stat", "inactive_file"),
        (folder / "memory.limit_in_bytes", folder / "memory.usage_in_bytes", folder / "memory.stat",
         "total_inactive_file"))]


def memory_limit(cgroup_files: tuple[str, ...] | None = None) -> int:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit where that is lower.

    Args:
        cgroup_files: limit files to read; default this process's cgroup's and the root's.
    """
    total = psutil.virtual_memory().total
    paths = [Path(p) for p in cgroup_files] if cgroup_files is not None else \
        [limit for limit, *_ in _memory_files(_own_cgroups("memory"))]
    for path in paths:
        with contextlib.suppress(TypeError, ValueError):
            limit = int(_read(path))  # "max" (no limit) is a ValueError, a missing file a TypeError
            if limit > 0:  # the kernel writes no other; a file of some other kind is passed over
                total = min(total, limit)
    return total


def memory_available(folders: list[Path] | None = None) -> int:
    """Bytes this process could still take before its machine or its cgroup runs out: the machine's available
    memory, or less where a cgroup's limit leaves less above its use (its reclaimable page cache counted free, as the
    machine's available memory counts it).

    Args:
        folders: the cgroup folders to read; default this process's own and the root's.
    """
    available = psutil.virtual_memory().available
    for limit, usage, stat, key in _memory_files(_own_cgroups("memory") if folders is None else folders):
        with contextlib.suppress(TypeError, ValueError):
            cap, used = int(_read(limit)), int(_read(usage))
            if cap <= 0:
                continue
            cache = next((int(v) for k, v in (line.split() for line in (_read(stat) or "").splitlines()
                                              if len(line.split()) == 2) if k == key), 0)
            available = min(available, max(0, cap - used + cache))
    return available

"""What this process may use (yolofeed/limits.py): a cgroup's lower CPU quota and memory limit win."""

from __future__ import annotations

import os
from types import SimpleNamespace

import psutil

from yolofeed import limits


def test_memory_limit_takes_a_lower_cgroup_limit(tmp_path):
    ram = psutil.virtual_memory().total
    assert 0 < limits.memory_limit() <= ram
    limit = tmp_path / "memory.max"
    limit.write_text("1073741824\n")
    assert limits.memory_limit((str(tmp_path / "absent"), str(limit))) == min(1 << 30, ram)
    limit.write_text("max\n")  # cgroup v2's "no limit"
    assert limits.memory_limit((str(limit),)) == ram


def test_the_cores_are_the_affinity_or_fewer_where_a_cgroup_quota_grants_fewer(tmp_path):
    """A container on a host of many cores with ``--cpus=1.5`` may use 2; no quota (v2's "max", v1's -1) or one above
    the affinity leaves the affinity; the lowest of several cgroups' quotas counts."""
    affinity = len(os.sched_getaffinity(0))
    v2, v1, nested = tmp_path / "v2", tmp_path / "v1", tmp_path / "nested"
    for folder in (v2, v1, nested):
        folder.mkdir()
    assert limits.usable_cores([tmp_path / "absent"]) == affinity
    (v2 / "cpu.max").write_text("max 100000\n")
    assert limits.usable_cores([v2]) == affinity
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert limits.usable_cores([v2]) == min(2, affinity)
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert limits.usable_cores([v1]) == affinity
    (v1 / "cpu.cfs_quota_us").write_text("50000\n")
    assert limits.usable_cores([v1]) == 1  # half a core's time: one process, not none
    (nested / "cpu.max").write_text(f"{1000 * 100000} 100000\n")  # more than the machine: the affinity
    assert limits.usable_cores([nested]) == affinity
    assert limits.usable_cores([nested, v1]) == 1
    assert limits.usable_cores() >= 1


def test_the_memory_available_is_the_machines_or_less_left_under_a_cgroups_limit(tmp_path, monkeypatch):
    """What a cgroup's limit leaves above its use, its inactive page cache counted free (v2 and v1 names); never
    more than the machine's available memory, never below zero."""
    assert 0 <= limits.memory_available() <= psutil.virtual_memory().total
    machine = 64 << 30
    monkeypatch.setattr(limits.psutil, "virtual_memory", lambda: SimpleNamespace(available=machine, total=2 * machine))
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    v2.mkdir(), v1.mkdir()
    assert limits.memory_available([tmp_path / "absent"]) == machine
    (v2 / "memory.max").write_text(f"{8 << 30}\n")
    (v2 / "memory.current").write_text(f"{7 << 30}\n")
    (v2 / "memory.stat").write_text(f"anon {5 << 30}\ninactive_file {1 << 29}\nactive_file 0\n")
    assert limits.memory_available([v2]) == min(machine, (1 << 30) + (1 << 29))
    (v2 / "memory.max").write_text("max\n")
    assert limits.memory_available([v2]) == machine
    (v1 / "memory.limit_in_bytes").write_text(f"{4 << 30}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{5 << 30}\n")  # above the limit (reclaim under way)
    (v1 / "memory.stat").write_text("total_inactive_file 0\n")
    assert limits.memory_available([v1]) == 0


def test_the_figure_children_are_counted_on_what_the_cgroup_leaves(monkeypatch):
    """Two cores' worth of quota on a host of many: no child (one core is the run's); a GiB left under the memory
    limit: none either."""
    import sys

    from yolofeed.train import plots

    monkeypatch.setattr(sys, "frozen", False, raising=False)
    monkeypatch.setattr(plots, "usable_cores", lambda: 64)
    monkeypatch.setattr(plots, "memory_available", lambda: 64 << 30)
    assert plots.FigureDrawers.count() == plots.MAX_FIGURE_CHILDREN
    monkeypatch.setattr(plots, "usable_cores", lambda: 2)
    assert plots.FigureDrawers.count() == 0
    monkeypatch.setattr(plots, "usable_cores", lambda: 64)
    monkeypatch.setattr(plots, "memory_available", lambda: 1 << 30)
    assert plots.FigureDrawers.count() == 0


def test_values_no_kernel_writes_are_passed_over(tmp_path, monkeypatch):
    """A period of 0, a quota too large for a float, a negative or zero memory limit, garbage: each passed over as
    no limit, never an error or a count of none (the figure children's count, an optional speed-up, takes 0 on any
    error)."""
    affinity = len(os.sched_getaffinity(0))
    folder = tmp_path / "cg"
    folder.mkdir()
    for text in ("100000 0", "0 100000", "-5 100000", "9" * 400 + " 1", "garbage", "", "\x00\x01"):
        (folder / "cpu.max").write_text(text)
        assert limits.usable_cores([folder]) == affinity, text
    (folder / "cpu.max").unlink()
    (folder / "cpu.cfs_quota_us").write_text("50000")
    (folder / "cpu.cfs_period_us").write_text("0")
    assert limits.usable_cores([folder]) == affinity
    ram = psutil.virtual_memory().total
    limit = folder / "memory.max"
    for text in ("-1", "0", "nonsense"):
        limit.write_text(text)
        assert limits.memory_limit((str(limit),)) == ram, text
    machine = 64 << 30
    monkeypatch.setattr(limits.psutil, "virtual_memory", lambda: SimpleNamespace(available=machine, total=2 * machine))
    (folder / "memory.current").write_text("100")
    for text in ("-1", "0"):
        limit.write_text(text)
        assert limits.memory_available([folder]) == machine, text

    from yolofeed.train import plots

    def broken():
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(plots, "usable_cores", broken)
    assert plots.FigureDrawers.count() == 0


def test_a_limit_on_a_cgroup_above_this_ones_binds_it(tmp_path, monkeypatch):
    """/proc/self/cgroup names this process's cgroup; a quota set on its parent (a systemd slice) counts, and a line of
    another form does not hide the lines after it."""
    root = tmp_path / "cgroup"
    (root / "user.slice" / "session.scope").mkdir(parents=True)
    (root / "user.slice" / "cpu.max").write_text("100000 100000\n")
    monkeypatch.setattr(limits, "ROOT", root)
    real = limits._read

    def read(path):
        if str(path) == "/proc/self/cgroup":
            return "garbage without colons\n0::/user.slice/session.scope\n"
        return real(path)

    monkeypatch.setattr(limits, "_read", read)
    folders = limits._own_cgroups("cpu")
    assert folders[:2] == [root / "user.slice" / "session.scope", root / "user.slice"]
    assert limits.usable_cores() == 1

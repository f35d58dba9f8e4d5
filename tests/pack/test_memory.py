"""How much memory this process may use (pack/memory.py): a lower cgroup limit wins."""

from __future__ import annotations

import psutil


def test_memory_limit_takes_a_lower_cgroup_limit(tmp_path):
    from yolofeed.pack import memory

    ram = psutil.virtual_memory().total
    assert 0 < memory.memory_limit() <= ram
    limit = tmp_path / "memory.max"
    limit.write_text("1073741824\n")
    assert memory.memory_limit((str(tmp_path / "absent"), str(limit))) == min(1 << 30, ram)
    limit.write_text("max\n")  # cgroup v2's "no limit"
    assert memory.memory_limit((str(limit),)) == ram

"""A pack's size estimated before it is built (pack/space.py), against the free space where it goes.
RELIABILITY.md lists these tests with their outcomes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import Free
from yolofeed.errors import PackSpaceError
from yolofeed.pack import Pack, disk, open_or_build, source, space
from yolofeed.pack.layout import align
from yolofeed.pack.paths import store_dir


def _build(root: Path, imgsz: int = 64, workers: int = 1, **kw) -> Pack:
    return open_or_build(root / "data.yaml", "train", imgsz, rebuild="auto", workers=workers, progress=False, **kw)


def _no_temp_files(folder: Path) -> bool:
    return not list(folder.glob(".*.tmp-*"))


def test_too_little_space_is_refused_before_writing(dataset):
    folder = store_dir(dataset / "data.yaml", 64, "raw")
    with disk.using(Free(10**5)), pytest.raises(
            PackSpaceError, match=rf"not enough free space for the train pack in {folder}: it needs "
                                  r"[\d.]+ [MK]B \([\d,]+ bytes\), 100 KB \(100,000 bytes\) are free\. Free "
                                  r"some space, or .*out=/path \(yolofeed pack\) or pack_dir=/path"):
        _build(dataset)
    assert not (folder / "train.yfpack").exists() and _no_temp_files(folder)


@pytest.mark.parametrize("imgsz", [32, 96])
def test_space_estimate_is_exact_for_small_splits(dataset, imgsz):
    """The up-front size (from image headers) against the pack actually built: above its payloads, below the
    upper bound, and not far above the real size, so a build that fits a tight disk is not refused (a fixed
    1 MB margin made the estimate of a 32-px pack ten times its size)."""
    src = source.split_source(dataset / "data.yaml", "train")
    planned = space.plan_space(src, dataset, imgsz, "raw")
    pack = _build(dataset, imgsz=imgsz)
    payloads = int(sum(align(int(n)) for n in pack.index["nbytes"]))
    assert payloads <= planned.estimate <= planned.bound
    assert planned.estimate <= 1.5 * pack.path.stat().st_size

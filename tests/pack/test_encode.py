"""A build worker's side (pack/encode.py): the populate advice asked until the kernel refuses it, and payloads
written through pwrite where pages cannot be backed, with the same pixels either way.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import yolofeed.pack.encode as encode
from helpers import OnDisk
from yolofeed.pack import Pack, disk, open_or_build


def _build(root: Path, split="train", imgsz=160, storage="raw", workers=2, **kw) -> Pack:
    return open_or_build(root / "data.yaml", split, imgsz, storage, rebuild="auto", workers=workers,
                         progress=False, **kw)


@pytest.mark.skipif(disk.MADV_POPULATE_WRITE is None, reason="Linux only")
def test_populate_asks_until_the_kernel_refuses_and_says_where_pages_cannot_be_backed(tmp_path, monkeypatch):
    import errno
    import mmap

    class Advice(OnDisk):
        def __init__(self, advice):
            self.advice = advice

    f = tmp_path / "file"
    f.write_bytes(bytes(1 << 20))
    with open(f, "r+b") as fh, mmap.mmap(fh.fileno(), 1 << 20) as mm:
        monkeypatch.setitem(encode._W, "populate", True)
        monkeypatch.setitem(encode._W, "disk", OnDisk())
        assert encode.populate(mm, 100, 50_000)  # an unaligned payload: its pages from the one holding byte 100
        if not encode._W["populate"]:
            pytest.skip("this kernel has no MADV_POPULATE_WRITE (before Linux 5.14)")
        monkeypatch.setitem(encode._W, "disk", Advice(999))  # an advice no kernel knows: EINVAL
        assert encode.populate(mm, 100, 50_000) and encode._W["populate"] is False  # stops asking

    class Spy:
        def __init__(self):
            self.calls, self.error = [], 0

        def madvise(self, *a):
            self.calls.append(a)
            if self.error:
                raise OSError(self.error, os.strerror(self.error))

    spy = Spy()
    monkeypatch.setitem(encode._W, "disk", Advice(23))
    assert encode.populate(spy, 100, 10) and spy.calls == []  # refused once: this worker asks no more
    monkeypatch.setitem(encode._W, "populate", True)
    page = mmap.PAGESIZE
    assert encode.populate(spy, 2 * page + 100, 10) and spy.calls == [(23, 2 * page, 110)]  # its page's start
    spy.error = errno.ENOSPC  # a reservation the filesystem did not keep: the copy would die of SIGBUS
    assert encode.populate(spy, 0, 10) is False and encode._W["populate"]  # pwrite then; asks again
    monkeypatch.setitem(encode._W, "backed", False)  # a tmpfs file extended, not reserved: the advice is the
    spy.error = errno.EINVAL  # only guard, so where the kernel refuses it, every payload goes through pwrite
    assert encode.populate(spy, 0, 10) is False and encode._W["populate"] is False
    assert encode.populate(spy, 0, 10) is False


@pytest.mark.parametrize("advice", [None, 999, "unbacked"], ids=["no-populate", "refused-advice", "unbacked-pages"])
def test_pages_populated_or_not_the_pixels_are_the_same(dataset, advice):
    """MADV_POPULATE_WRITE only faults pages in early: without it, or where the kernel refuses it, the copy writes the
    same bytes (a refused advice is an EINVAL the workers stop asking after)."""
    import errno

    ref = _build(dataset, workers=2)
    images = [ref.image(i).copy() for i in range(len(ref))]
    reserved = []

    class Pages(OnDisk):
        def populate(self, mm, start, nbytes):
            if advice == "unbacked":  # the kernel says no page can be backed: every payload goes through pwrite
                raise OSError(errno.EFAULT, "Bad address")
            super().populate(mm, start, nbytes)

        def allocate(self, fd, nbytes):
            reserved.append(super().allocate(fd, nbytes))
            return reserved[-1]

    pages = Pages()
    if advice != "unbacked":
        pages.advice = advice  # given to the workers with their arguments
    with disk.using(pages):
        pack = open_or_build(dataset / "data.yaml", "train", 160, rebuild="always", workers=2, progress=False)
    assert reserved == [True]  # the workers wrote through the mapping, where the advice applies
    assert len(pack) == len(images)
    for i, im in enumerate(images):
        np.testing.assert_array_equal(pack.image(i), im)

"""The pack: same pixels and labels as Ultralytics, bad samples reported, stale packs refused."""

from __future__ import annotations

import json
import os
import shutil
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

import yolofeed.pack.build as build_module
import yolofeed.pack.encode as encode
from helpers import BAD_CASES, OnDisk, add_bad_samples, copy_dataset, ultralytics_dataset
from yolofeed.errors import DatasetError, PackError, StalePackError
from yolofeed.pack import Pack, disk, open_or_build
from yolofeed.pack.layout import MAGIC, TRAILER
from yolofeed.pack.paths import store_dir
from yolofeed.pack.rebuild import ensure_split
from yolofeed.pack.report import read_report
from yolofeed.pack.summary import summary


def _build(root: Path, split="train", imgsz=160, storage="raw", workers=2, **kw) -> Pack:
    return open_or_build(root / "data.yaml", split, imgsz, storage, rebuild="auto", workers=workers,
                         progress=False, **kw)


@pytest.mark.parametrize("imgsz", [160, 100, 320])  # shrink, odd sizes (ceil), enlarge
def test_pixels_equal_ultralytics_load_image(dataset, imgsz):
    pack = _build(dataset, imgsz=imgsz)
    ref = ultralytics_dataset(dataset / "data.yaml", "train", imgsz)
    assert pack.im_files == ref.im_files
    for i in range(len(pack)):
        bgr, hw0, hw = ref.load_image(i)
        np.testing.assert_array_equal(pack.image(i), bgr[..., ::-1])  # exact: same decoder, same resize
        assert tuple(pack.ori_shapes[i]) == hw0 and tuple(pack.shapes[i]) == hw


def test_labels_equal_ultralytics_label_cache(dataset):
    pack = _build(dataset, split="val")
    ref = ultralytics_dataset(dataset / "data.yaml", "val", 160)
    assert len(pack) == len(ref.labels) == 8
    for i, lb in enumerate(ref.labels):
        assert pack.im_files[i] == lb["im_file"]
        np.testing.assert_array_equal(pack.labels(i)[:, :1], lb["cls"])
        np.testing.assert_array_equal(pack.labels(i)[:, 1:], lb["bboxes"])
        assert tuple(pack.ori_shapes[i]) == lb["shape"]
    assert pack.header["counts"]["boxes"] == sum(len(lb["cls"]) for lb in ref.labels)


def test_duplicate_labels_are_ultralytics_duplicates_for_polygons_too(dataset):
    """Two different polygons of one class with the same box are two labels in Ultralytics' YOLODataset (it compares
    polygons, not boxes); the pack made them one. A polygon given twice is one in both, in Ultralytics' order."""
    from yolofeed.pack.verify import read_labels

    lb_file = sorted((dataset / "labels" / "val").glob("*.txt"))[0]
    square = "0.2 0.2 0.6 0.2 0.6 0.6 0.2 0.6"  # a square, and a diamond with the same box
    diamond = "0.4 0.2 0.6 0.4 0.4 0.6 0.2 0.4"
    lb_file.write_text(f"1 {diamond}\n1 {square}\n1 {diamond}\n2 {square}\n")
    labels, notes = read_labels(str(lb_file), nc=8)
    assert len(labels) == 3 and notes == ["1 duplicate labels removed"]
    pack = _build(dataset, split="val")
    ref = ultralytics_dataset(dataset / "data.yaml", "val", 160)
    for i, lb in enumerate(ref.labels):
        np.testing.assert_array_equal(pack.labels(i), np.concatenate([lb["cls"], lb["bboxes"]], 1))


def test_bad_samples_are_skipped_like_ultralytics_and_reported(synth_root, tmp_path):
    ours_root = copy_dataset(synth_root, tmp_path / "ours")
    theirs_root = copy_dataset(synth_root, tmp_path / "theirs")  # Ultralytics rewrites files: give it a copy
    paths = add_bad_samples(ours_root)
    add_bad_samples(theirs_root)
    before = {p: Path(p).read_bytes() for p in paths.values()}
    pack = _build(ours_root)
    ref = ultralytics_dataset(theirs_root / "data.yaml", "train", 160)

    # the same samples survive, with the same labels and the same pixels
    assert [Path(f).name for f in pack.im_files] == [Path(f).name for f in ref.im_files]
    for i, lb in enumerate(ref.labels):
        np.testing.assert_array_equal(pack.labels(i), np.concatenate([lb["cls"], lb["bboxes"]], 1))
        np.testing.assert_array_equal(pack.image(i), ref.load_image(i)[0][..., ::-1])

    # every skipped case has a report line naming the file and the reason
    report = {Path(row[0]).name: row for row in read_report(pack.path)}
    skipped = {Path(f).name: r for f, r in pack.header["skipped"]}
    for name, (_, _, kept, words) in BAD_CASES.items():
        if kept:
            assert name not in skipped
        else:
            assert name in skipped and report[name][1] == "skipped"
            assert words in skipped[name], (name, skipped[name])
    assert pack.header["counts"]["skipped"] == sum(not c[2] for c in BAD_CASES.values())
    text = summary(ensure_split(ours_root / "data.yaml", "train", 160, rebuild="never", progress=False))
    assert "skipped" in text and "report.txt" in text

    # nothing of the user's was touched (Ultralytics rewrote its copy of trailing.jpg; we did not)
    assert all(Path(p).read_bytes() == b for p, b in before.items())
    assert (theirs_root / "images/train/trailing.jpg").read_bytes() != before[paths["trailing.jpg"]]

    # the good samples survive intact
    good = [i for i, f in enumerate(pack.im_files) if Path(f).name.startswith("train_")]
    assert len(good) == 24


def test_notes_for_backgrounds_duplicates_and_restored(dataset):
    add_bad_samples(dataset)
    pack = _build(dataset)
    notes = {Path(f).name: n for f, n in pack.header["notes"]}
    assert "missing" in notes["no_label.jpg"] and "empty" in notes["empty_label.jpg"]
    assert "duplicate" in notes["dupes.jpg"] and "restored" in notes["trailing.jpg"]


def test_no_usable_image_is_a_clear_error(dataset):
    for p in (dataset / "images" / "val").glob("*.jpg"):
        p.write_bytes(b"not a jpeg")
    with pytest.raises(DatasetError, match="no usable image in split 'val'"):
        _build(dataset, split="val")
    assert not list((store_dir(dataset / "data.yaml", 160, "raw")).glob("*val*.yfpack*"))


class _FakeTime:
    """The build module's ``time`` with a clock that moves only when a test says so."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


def test_header_times_the_build_by_phase(dataset, monkeypatch):
    """Each phase's seconds are the time spent in that phase's work: planning 10 s, 1 s an image, checking 100 s."""
    clock = _FakeTime()
    monkeypatch.setattr(build_module, "time", clock)

    def costs(fn, seconds):
        def timed(*a, **k):
            clock.now += seconds
            return fn(*a, **k)
        return timed

    monkeypatch.setattr(build_module, "plan_space", costs(build_module.plan_space, 10))
    monkeypatch.setattr(encode, "process", costs(encode.process, 1))  # workers=1: in this process
    monkeypatch.setattr(build_module, "_check_written", costs(build_module._check_written, 100))
    pack = _build(dataset, workers=1)
    build, tried = pack.header["build"], pack.header["counts"]["tried"]
    phases = build["phases_s"]
    assert list(phases) == ["plan", "start", "payloads", "check"]
    assert phases["plan"] == 10 and phases["check"] == 100
    assert phases["start"] > 0 and phases["start"] + phases["payloads"] == tried  # the first result, then the rest
    assert sum(phases.values()) == build["seconds"]


def test_gather_into_caller_buffers(dataset):
    pack = _build(dataset)
    idx = [5, 0, 17, 5]
    out = torch.full((6, 160, 160, 3), 7, dtype=torch.uint8)  # a pinned tensor in real use
    hw = pack.codec.gather(pack, idx, out)
    for k, i in enumerate(idx):
        h, w = hw[k]
        np.testing.assert_array_equal(out[k, :h, :w].numpy(), pack.image(i))
        assert (out[k, h:] == 7).all() and (out[k, :, w:] == 7).all()  # the rest is left as it was
    assert (out[4:] == 7).all()
    with pytest.raises(ValueError, match="cannot hold"):
        pack.codec.gather(pack, list(range(7)), out)


@pytest.mark.parametrize("storage", ["raw", "jpeg"])
def test_will_need_asks_for_exactly_each_payload(dataset, storage, monkeypatch):
    import pickle

    pack = _build(dataset, storage=storage)
    calls = []
    real = os.posix_fadvise

    def recording(fd, offset, length, advice):  # the kernel's side cannot be seen from here: record what it is asked
        calls.append((fd, offset, length, advice))
        return real(fd, offset, length, advice)  # and still make the real call: it must be accepted

    monkeypatch.setattr(os, "posix_fadvise", recording)
    idx = [len(pack) - 1, 0, 7, 7]  # the last payload, which ends where the sections start, and a repeat
    pack.will_need(idx)
    assert [(off, n) for _, off, n, _ in calls] == [(int(pack.index[i]["offset"]), int(pack.index[i]["nbytes"]))
                                                    for i in idx]
    assert {advice for *_, advice in calls} == {os.POSIX_FADV_WILLNEED}
    assert os.path.samefile(f"/proc/self/fd/{calls[0][0]}", pack.path)  # the pack's own descriptor
    clone = pickle.loads(pickle.dumps(pack))  # an unpickled copy reopens the file: its descriptor stays open
    del pack
    calls.clear()
    clone.will_need([0])
    assert len(calls) == 1 and os.path.samefile(f"/proc/self/fd/{calls[0][0]}", clone.path)

    def failing(*a):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(os, "posix_fadvise", failing)
    clone.will_need([0, 1])  # advice only: a failure turns it off, the gather goes on
    assert not clone._file.advise
    if storage == "raw":
        out = np.zeros((2, 160, 160, 3), np.uint8)
        hw = clone.codec.gather(clone, [0, 1], out)
        np.testing.assert_array_equal(out[0, :hw[0][0], :hw[0][1]], clone.image(0))


def test_jpeg_storage_keeps_the_bytes(dataset):
    add_bad_samples(dataset)
    raw = _build(dataset)
    jpg = _build(dataset, storage="jpeg")
    assert jpg.im_files == raw.im_files and jpg.path.stat().st_size < raw.path.stat().st_size / 3
    import cv2

    for i, f in enumerate(jpg.im_files):
        dec = cv2.imdecode(jpg.encoded(i), cv2.IMREAD_COLOR)
        assert dec is not None and dec.shape[:2] == tuple(jpg.ori_shapes[i])
        assert tuple(jpg.shapes[i]) == tuple(raw.shapes[i])
        np.testing.assert_array_equal(jpg.labels(i), raw.labels(i))
        if Path(f).name.startswith("train_"):
            assert bytes(jpg.encoded(i)) == Path(f).read_bytes()  # JPEGs kept byte for byte
    reencoded = {Path(f).name for f, n in jpg.header["notes"] if "re-encoded" in n}
    assert {"rotated.jpg", "plain.png", "trailing.jpg"} <= reencoded
    from yolofeed.pack.codecs.jpeg import gather_encoded

    starts, sizes = gather_encoded(jpg, [2, 0], buf := np.zeros(10**6, np.uint8))
    assert bytes(buf[starts[1]:starts[1] + sizes[1]]) == bytes(jpg.encoded(0))
    with pytest.raises(PackError, match="format=raw"):
        jpg.image(0)


def test_reused_when_fresh_refused_or_rebuilt_when_stale(dataset):
    yaml_file = dataset / "data.yaml"
    first = ensure_split(yaml_file, "train", 160, rebuild="auto", progress=False)
    assert first.built
    again = ensure_split(yaml_file, "train", 160, rebuild="auto", progress=False)
    assert not again.built and again.pack.header["created"] == first.pack.header["created"]

    # a changed source file is detected; the message names the rebuild command
    lb = sorted((dataset / "labels" / "train").glob("*.txt"))[3]
    lb.write_text("0 0.5 0.5 0.5 0.5\n")
    with pytest.raises(StalePackError, match=r"source images or labels changed.*yolofeed pack data=.* imgsz=160"):
        open_or_build(yaml_file, "train", 160)
    rebuilt = ensure_split(yaml_file, "train", 160, rebuild="auto", progress=False)
    assert rebuilt.built
    np.testing.assert_array_equal(rebuilt.pack.labels(3), [[0, 0.5, 0.5, 0.5, 0.5]])

    # a pack of another imgsz where this one belongs (moved there by hand: each size has a folder of its own) is
    # refused with a message naming both sizes
    built = store_dir(yaml_file, 160, "raw") / "train.yfpack"
    moved = store_dir(yaml_file, 320, "raw") / "train.yfpack"
    moved.parent.mkdir()
    shutil.copy(built, moved)
    with pytest.raises(StalePackError, match="built for imgsz=160, this run asks for imgsz=320.*imgsz=320"):
        open_or_build(yaml_file, "train", 320)
    # a pack of another dataset of the same name, in a shared out=, is named as such
    other = dataset / "other" / "data.yaml"
    other.parent.mkdir()
    other.write_text((dataset / "data.yaml").read_text())
    out = dataset / "shared"
    store_dir(yaml_file, 160, "raw", out).mkdir(parents=True)
    shutil.copy(built, store_dir(yaml_file, 160, "raw", out) / "train.yfpack")
    with pytest.raises(StalePackError, match=r"was built from .*ds/data.yaml, not from .*other/data.yaml"):
        open_or_build(other, "train", 160, out=out)
    # missing pack with rebuild=never
    with pytest.raises(PackError, match="does not exist.*yolofeed pack"):
        open_or_build(yaml_file, "val", 160)


def _rewrite_header(path: Path, crc: int | None = None, drop: tuple[str, ...] = (), **changes) -> None:
    """Rewrite a pack's header; ``crc``: the trailer's header checksum (None: the right one)."""
    data = bytearray(path.read_bytes())
    magic, _, off, n = TRAILER.unpack(bytes(data[-TRAILER.size:]))
    header = json.loads(bytes(data[off:off + n]))
    header.update(changes)
    for key in drop:
        del header[key]
    blob = json.dumps(header).encode()
    path.write_bytes(bytes(data[:off]) + blob + TRAILER.pack(MAGIC, zlib.crc32(blob) if crc is None else crc, off,
                                                             len(blob)))


def test_foreign_truncated_and_old_packs_are_refused(dataset, tmp_path):
    pack = _build(dataset)
    good = pack.path.read_bytes()
    cases = {
        "foreign": os.urandom(5000),
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "cut-trailer": good[:-5],
        "padded": good + b"\0" * 64,
    }
    for name, data in cases.items():
        f = tmp_path / f"{name}.yfpack"
        f.write_bytes(data)
        with pytest.raises(PackError):
            Pack.open(f)
    old = tmp_path / "old.yfpack"
    old.write_bytes(good)
    _rewrite_header(old, format_version=0, yolofeed_version="0.0.1")
    with pytest.raises(StalePackError, match="format 0 .*reads format 2"):
        Pack.open(old)
    v1 = tmp_path / "v1.yfpack"  # format 1's trailer held b"\0\1\0\0" where the header's checksum now is
    v1.write_bytes(good)
    _rewrite_header(v1, crc=int.from_bytes(b"\x00\x01\x00\x00", "little"), format_version=1)
    with pytest.raises(StalePackError, match=f"format 1 .*reads format 2: rebuild it with: yolofeed pack "
                                             f"data={dataset / 'data.yaml'} imgsz=160 format=raw out={tmp_path}"):
        Pack.open(v1)
    assert len(Pack.open(pack.path)) == 24  # the good file still opens


def test_pickles_by_path(dataset):
    import pickle

    pack = _build(dataset)
    clone = pickle.loads(pickle.dumps(pack))
    assert len(pickle.dumps(pack)) < 1000
    np.testing.assert_array_equal(clone.image(3), pack.image(3))


def test_cli_pack_prints_summary(dataset, capsys):
    from yolofeed.cli import main

    assert main(["pack", f"data={dataset / 'data.yaml'}", "imgsz=128", "workers=2", "sync=True"]) == 0
    out = capsys.readouterr().out
    assert "pack train: 24 images" in out and "pack val: 8 images" in out and "img/s" in out
    assert "synced to disk" in out
    assert main(["pack", f"data={dataset / 'data.yaml'}", "imgsz=128"]) == 0
    assert "up to date" in capsys.readouterr().out


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


def test_pwrite_fallback_when_space_cannot_be_reserved(dataset, caplog):
    import errno
    import logging

    ref = _build(dataset, workers=1)
    images = [ref.image(i).copy() for i in range(len(ref))]

    class NoSpace(OnDisk):
        def allocate(self, fd, nbytes):
            raise OSError(errno.ENOSPC, "No space left on device")

    with caplog.at_level(logging.INFO), disk.using(NoSpace()):
        pack = open_or_build(dataset / "data.yaml", "train", 160, rebuild="always", workers=2, progress=False)
    assert "could not reserve" in caplog.text and "writing with pwrite" in caplog.text
    assert pack.path.stat().st_size == ref.path.stat().st_size
    for i, im in enumerate(images):
        np.testing.assert_array_equal(pack.image(i), im)

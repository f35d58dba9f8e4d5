"""Writing one split's pack (pack/build.py), in parallel and atomically, and the faults a build meets.

A build times its phases, refuses a split with no usable image, checks every payload it wrote, says in one line
that the disk filled up (a simulated disk, and a real 1 MB tmpfs where mounting is allowed), writes a tmpfs through
the map without a reservation, and builds the same pack with spawned workers. Killed at any moment it leaves nothing
a reader accepts, no worker and no lock, and the next run recovers.
RELIABILITY.md lists these tests with their outcomes.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import yolofeed.pack.build as build_module
import yolofeed.pack.encode as encode
from helpers import Free, OnDisk, tmpfs, within
from yolofeed import synth
from yolofeed.config import SynthConfig
from yolofeed.errors import DatasetError, PackError
from yolofeed.pack import Pack, build, disk, open_or_build
from yolofeed.pack.paths import store_dir


def _build160(root: Path, split="train", imgsz=160, storage="raw", workers=2, **kw) -> Pack:
    """A split's pack at 160 px, built by two workers (``_build``: the train split at 64 px, one worker)."""
    return open_or_build(root / "data.yaml", split, imgsz, storage, rebuild="auto", workers=workers,
                         progress=False, **kw)


def _build(root: Path, imgsz: int = 64, workers: int = 1, **kw) -> Pack:
    return open_or_build(root / "data.yaml", "train", imgsz, rebuild="auto", workers=workers, progress=False, **kw)


def _no_temp_files(folder: Path) -> bool:
    return not list(folder.glob(".*.tmp-*"))


def test_no_usable_image_is_a_clear_error(dataset):
    for p in (dataset / "images" / "val").glob("*.jpg"):
        p.write_bytes(b"not a jpeg")
    with pytest.raises(DatasetError, match="no usable image in split 'val'") as e:
        _build160(dataset, split="val")
    assert not list((store_dir(dataset / "data.yaml", 160, "raw")).glob("*val*.yfpack*"))
    first = sorted((dataset / "images" / "val").glob("*.jpg"))[0]
    assert f"(first: {first})" in str(e.value), str(e.value)  # a reason that names no file: its first file


def test_pixel_coordinates_in_every_label_file_are_one_reason_counted_once(dataset):
    """Labels in pixels (a common export mistake): each file's reason quoted its own path and values, so the error
    listed "1x" three times and left the rest unsaid; now one line counts them all."""
    labels = sorted((dataset / "labels" / "val").glob("*.txt"))
    for lb in labels:
        lb.write_text("".join(f"{r.split()[0]} {' '.join(str(float(v) * 160) for v in r.split()[1:])}\n"
                              for r in lb.read_text().splitlines() if r.strip()))
    with pytest.raises(DatasetError) as e:
        _build160(dataset, split="val")
    lines = str(e.value).splitlines()
    assert len(lines) == 2 and lines[1].startswith(f"  {len(labels)}x, the first: {labels[0]} has coordinates above 1")


def test_no_usable_image_in_a_list_read_from_the_current_folder_says_where_it_looked(dataset, monkeypatch, tmp_path):
    """A .txt list of paths relative to the dataset, read from another folder: every image 'not found', and nothing
    said which file or why; now the first file and Ultralytics' rule (lines without ./ from the current folder)."""
    imgs = sorted((dataset / "images" / "val").glob("*.jpg"))
    (dataset / "rel.txt").write_text("\n".join(f"images/val/{p.name}" for p in imgs))
    data = yaml.safe_load((dataset / "data.yaml").read_text())
    (dataset / "data.yaml").write_text(yaml.safe_dump({**data, "path": str(dataset), "val": "rel.txt"}))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError) as e:
        _build160(dataset, split="val")
    said = str(e.value)
    assert f"image file not found (first: images/val/{imgs[0].name})" in said, said
    assert f"read from the current folder, {tmp_path}" in said and "start them with ./" in said, said


@pytest.mark.parametrize("imgsz", [-5, 0, 16, 160.0, "160", True])
def test_the_api_refuses_an_imgsz_before_anything_is_read_or_made(dataset, imgsz):
    """``open_or_build`` takes imgsz as ``yolofeed pack`` does: a whole number, at least 32; otherwise one line, and
    no pack folder."""
    from yolofeed.errors import ConfigError
    from yolofeed.pack import open_or_build

    out = dataset / "packs"
    with pytest.raises(ConfigError, match=rf"imgsz={imgsz!r}: expected a whole number, at least 32"):
        open_or_build(dataset / "data.yaml", imgsz=imgsz, rebuild="auto", out=out)
    assert not out.exists()
    with pytest.raises(ConfigError, match="a dict from yolofeed.pack.load_data_yaml"):
        open_or_build({"train": "images/train"}, imgsz=160, rebuild="auto", out=out)


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
    pack = _build160(dataset, workers=1)
    build, tried = pack.header["build"], pack.header["counts"]["tried"]
    phases = build["phases_s"]
    assert list(phases) == ["plan", "start", "payloads", "check"]
    assert phases["plan"] == 10 and phases["check"] == 100
    assert phases["start"] > 0 and phases["start"] + phases["payloads"] == tried  # the first result, then the rest
    assert sum(phases.values()) == build["seconds"]


def test_workers_past_the_usable_cores_are_capped_at_them_as_ultralytics_caps_its_own(dataset, tmp_path, monkeypatch):
    """``workers=200`` on a machine of 2 usable cores starts 2 processes, not 200 (each with its memory); the pack is
    the same."""
    from yolofeed import config, limits

    monkeypatch.setattr(limits, "usable_cores", lambda: 2)
    assert (config.worker_count(200), config.worker_count(0), config.worker_count(1)) == (2, 2, 1)
    started = []
    real = build_module.Workers
    monkeypatch.setattr(build_module, "Workers", lambda n, *a, **k: started.append(n) or real(n, *a, **k))
    pack = _build(dataset, workers=200, out=tmp_path)
    assert started == [2] and pack.header["build"]["workers"] == 2
    ref = _build(dataset)
    for i in range(len(pack)):
        np.testing.assert_array_equal(pack.image(i), ref.image(i))


def test_a_payload_that_does_not_land_stops_the_build(dataset, monkeypatch):
    """The end-of-build check: a worker's write that did not store what it encoded is caught, nothing published."""
    class Lost(OnDisk):
        def allocate(self, fd, nbytes):
            return False  # payloads through pwrite

        def write_payload(self, fd, data, offset):  # what lands is zeros
            super().write_payload(fd, bytes(len(data)), offset)

    with pytest.raises(PackError, match=r"image\(s\) read back from .* differ from what was written.*Nothing was "
                                        "published"), disk.using(Lost()):
        _build(dataset, workers=2)
    folder = store_dir(dataset / "data.yaml", 64, "raw")
    assert not (folder / "train.yfpack").exists() and _no_temp_files(folder)


# -- disk space: a reservation refused, a disk that fills up, a tmpfs --------------------------------------------------
def test_pwrite_fallback_when_space_cannot_be_reserved(dataset, caplog):
    import errno
    import logging

    ref = _build160(dataset, workers=1)
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


def test_no_room_even_for_the_lock_record_is_one_clear_error(dataset, monkeypatch):
    """A disk with no byte free takes the empty lock file but not its holder record: that used to escape as an
    OSError traceback from the lock, holding the lock; now one PackError, and the lock is free again."""
    from yolofeed.pack.lock import FolderLock

    def full(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(FolderLock, "_write_holder", full)
    folder = store_dir(dataset / "data.yaml", 64, "raw")
    with pytest.raises(PackError, match=rf"no space left in {folder}, not even for the build lock .*free some "
                                        r"space, or put the packs on a disk with room"):
        _build(dataset)
    monkeypatch.undo()
    lock = FolderLock(folder)
    assert lock.try_acquire()  # released: neither this thread's guard nor the record lock is left held
    lock.release()
    assert len(_build(dataset)) == 24


class FillsUp(OnDisk):
    """A disk that fails with ENOSPC after ``writes`` payload writes in each process (a disk filling up), and
    reserves nothing."""

    def __init__(self, writes: int, code: int = errno.ENOSPC):
        self.writes, self.code = writes, code

    def allocate(self, fd, nbytes):
        raise OSError(errno.ENOSPC, "No space left on device")

    def write_payload(self, fd, data, offset):
        if self.writes <= 0:
            raise OSError(self.code, os.strerror(self.code))
        self.writes -= 1
        super().write_payload(fd, data, offset)


@pytest.mark.parametrize("workers", [1, 2])
def test_disk_full_mid_build_is_one_clear_error(dataset, workers):
    """Room for the estimate, not for the upper bound: no reservation, no mmap, and a write meets ENOSPC."""
    import psutil

    def alive() -> set[int]:
        return {p.pid for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE}

    earlier = alive()  # an earlier test's long-lived helpers (multiprocessing's resource tracker): not this build's
    folder = store_dir(dataset / "data.yaml", 64, "raw")
    with disk.using(FillsUp(3)), pytest.raises(
            PackError, match=rf"the disk filled up while writing the train pack in {folder} \(No space "
                             r"left on device\): it needs about [\d.]+ [KMG]B, [\d.,]+ [KMG]B were free "
                             r"when the build started\. Nothing was published and the temporary file is "
                             r"removed\. .*"
                             r"pack_dir="):
        _build(dataset, workers=workers)
    assert not (folder / "train.yfpack").exists() and _no_temp_files(folder)
    assert not alive() - earlier  # no build worker left


def test_a_file_size_limit_mid_build_is_named_as_such_not_as_a_full_disk(dataset):
    """EFBIG (``ulimit -f``) is not a full disk: the message says which limit and how to raise it."""
    folder = store_dir(dataset / "data.yaml", 64, "raw")
    with disk.using(FillsUp(3, errno.EFBIG)), pytest.raises(
            PackError, match=rf"writing the train pack in {folder} passed this process's file-size limit \(ulimit -f; "
                             r"File too large\): .* Raise the limit \(ulimit -f unlimited\) and build again"):
        _build(dataset, workers=1)
    assert not (folder / "train.yfpack").exists() and _no_temp_files(folder)


@pytest.fixture()
def small_disk(tmp_path):
    """A real 1 MB filesystem (tmpfs), where mounting is allowed (root); skipped elsewhere."""
    with tmpfs(tmp_path / "small", "1m") as mnt:
        yield mnt


def test_a_pack_in_memory_is_written_through_the_map_without_a_reservation(dataset, tmp_path):
    """On a tmpfs the workers fault in what they write (populate advice) instead of the building process allocating
    the whole bound first: no posix_fallocate, no payload through pwrite, the same pixels as on disk."""
    if disk.MADV_POPULATE_WRITE is None:
        pytest.skip("Linux only")
    ref = _build(dataset, imgsz=160, workers=2)
    reserved = []

    class MapOnly(OnDisk):
        def allocate(self, fd, nbytes):
            reserved.append(nbytes)
            return True

        def write_payload(self, fd, data, offset):  # forked workers inherit it: a dead worker
            os._exit(3)

    with tmpfs(tmp_path / "shm", "64m") as mnt, disk.using(MapOnly()) as on:
        assert on.in_memory(mnt) and not on.in_memory(tmp_path)  # pytest's folder: a disk (conftest)
        pack = _build(dataset, imgsz=160, workers=2, out=mnt)
        assert pack.path.parent == mnt / "data-raw-160" and not reserved and len(pack) == len(ref)
        for i in range(len(ref)):
            np.testing.assert_array_equal(pack.image(i), ref.image(i))
        assert shutil.disk_usage(mnt).used < 2 * pack.path.stat().st_size  # only what was written is allocated


@pytest.mark.parametrize("workers", [1, 2])
def test_real_full_disk(dataset, small_disk, workers):
    """A real 1 MB tmpfs. First the up-front check refuses; then, with the check fooled, the real
    posix_fallocate and pwrite meet ENOSPC: one PackError, no SIGBUS (it would kill this process or a
    worker), the temporary file removed and the disk empty again."""
    with pytest.raises(PackError, match=f"not enough free space for the train pack in {small_disk}"):
        _build(dataset, imgsz=160, workers=workers, out=small_disk)
    reserved = []

    class Fooled(Free):  # the up-front check fooled; a reservation that would only be pretended
        def allocate(self, fd, nbytes):
            reserved.append(nbytes)
            return True

    with (disk.using(Fooled(10**12)),
          pytest.raises(PackError, match=f"the disk filled up while writing the train pack in {small_disk}")):
        _build(dataset, imgsz=160, workers=workers, out=small_disk)
    assert not reserved  # two workers: the populate advice met the full tmpfs, and pwrite reported it
    folder = store_dir(dataset / "data.yaml", 160, "raw", small_disk)
    assert _no_temp_files(folder) and not (folder / "train.yfpack").exists()
    usage = shutil.disk_usage(small_disk)
    assert usage.used < 64 * 1024, usage  # the tmpfs is empty again but for the lock file


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("advice", ["real", "refused", "absent"])
def test_a_full_tmpfs_never_kills_a_worker(dataset, small_disk, workers, advice):
    """Nothing reserved on a tmpfs: whatever the populate advice does (works, refused, missing from Python), a payload
    whose pages are not faulted in goes through pwrite, so a full tmpfs is the disk-full error, not a SIGBUS."""
    fooled = Free(10**12)  # the up-front check fooled
    if advice != "real":
        fooled.advice = 999 if advice == "refused" else None  # EINVAL / none
    with (disk.using(fooled),
          pytest.raises(PackError, match=f"the disk filled up while writing the train pack in {small_disk}")):
        _build(dataset, imgsz=160, workers=workers, out=small_disk)
    folder = store_dir(dataset / "data.yaml", 160, "raw", small_disk)
    assert _no_temp_files(folder) and not (folder / "train.yfpack").exists()


# -- spawned workers, as on macOS and Windows (last: spawn leaves its resource tracker running) ------------------------
@pytest.mark.slow
def test_spawned_workers_build_the_same_pack(dataset, tmp_path, monkeypatch):
    """Workers started by spawn, as on macOS and Windows: same bytes, and they end with the build."""
    import multiprocessing as mp

    ref = _build(dataset)
    monkeypatch.setattr(build, "mp_context", lambda: mp.get_context("spawn"))
    pack = _build(dataset, workers=2, out=tmp_path / "spawned")
    for i in range(len(pack)):
        np.testing.assert_array_equal(pack.image(i), ref.image(i))


# -- killed at any moment: nothing a reader accepts is published, and the next run recovers ----------------------------
@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("killme")
    synth.run(SynthConfig(out=str(root), n_train=240, n_val=0, imgsz=320, seed=1, workers=2))
    return root


def _start(yaml_file: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "yolofeed", "pack", f"data={yaml_file}", "imgsz=320", "splits=train",
           "workers=1", "rebuild=always"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _kill_after(proc: subprocess.Popen, folder: Path, delay: float, timeout: float = 120) -> bool:
    """SIGKILL the build ``delay`` seconds after its temporary file appears; False if it was gone first."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and proc.poll() is None:
        if any(folder.glob(".train.yfpack.tmp-*")):
            time.sleep(delay)
            alive = proc.poll() is None
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return alive
        time.sleep(0.0005)
    proc.kill()
    proc.wait()
    return False


@pytest.fixture(scope="module")
def reference(big) -> tuple[float, int, list[np.ndarray]]:
    """The build the killed ones are measured against, made once for every moment: its seconds, its length and three
    of its images (first, middle, last)."""
    t0 = time.perf_counter()
    ref = open_or_build(big / "data.yaml", "train", 320, rebuild="always", progress=False, workers=1)
    seconds = time.perf_counter() - t0  # what the subprocess's build will take, start-up aside
    images = [ref.image(i).copy() for i in (0, len(ref) // 2, len(ref) - 1)]
    n = len(ref)
    ref.path.unlink()
    return seconds, n, images


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.6, 0.9])
def test_killed_build_is_never_accepted(big, reference, fraction):
    yaml_file = big / "data.yaml"
    folder = store_dir(yaml_file, 320, "raw")
    seconds, n_ref, ref_images = reference
    (folder / "train.yfpack").unlink(missing_ok=True)  # the pack a test before this one left

    killed = _kill_after(_start(yaml_file), folder, fraction * seconds)
    final = folder / "train.yfpack"
    if fraction <= 0.3:  # later moments may land after the build on a fast run: either outcome is checked below
        assert killed and not final.exists(), "the build finished before it could be killed"
    if final.exists():  # killed after publishing: then it must be the whole pack
        assert len(Pack.open(final)) == n_ref
        final.unlink()
    for f in folder.glob(".train.yfpack.tmp-*"):  # even opened by name, a temp file is refused unless it is whole
        try:  # (killed between writing the trailer and the rename, it is a finished pack under a temp name)
            whole = Pack.open(f)
        except PackError:
            continue
        assert len(whole) == n_ref
        np.testing.assert_array_equal(whole.image(n_ref - 1), ref_images[-1])
    with pytest.raises(PackError, match="does not exist"):
        open_or_build(yaml_file, "train", 320, rebuild="never")

    # the next run rebuilds, cleans up, and gives the same content
    pack = open_or_build(yaml_file, "train", 320, rebuild="auto", progress=False, workers=2)
    assert not list(folder.glob(".train.yfpack.tmp-*"))
    assert len(pack) == n_ref
    for k, i in enumerate((0, n_ref // 2, n_ref - 1)):
        np.testing.assert_array_equal(pack.image(i), ref_images[k])


@pytest.mark.slow
def test_kill_at_random_moments_never_publishes_a_bad_pack(big):
    """Whatever the moment, the published name holds either nothing or a complete, valid pack."""
    yaml_file = big / "data.yaml"
    folder = store_dir(yaml_file, 320, "raw")
    ref = open_or_build(yaml_file, "train", 320, rebuild="auto", progress=False)
    n = len(ref)
    rng = np.random.default_rng(0)
    for delay in rng.uniform(1.0, 4.0, size=3):  # interpreter start-up is ~2 s of this
        (folder / "train.yfpack").unlink(missing_ok=True)
        proc = _start(yaml_file)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        final = folder / "train.yfpack"
        if final.exists():
            assert len(Pack.open(final)) == n
        for f in folder.glob(".train.yfpack.tmp-*"):
            with pytest.raises(PackError):
                Pack.open(f)
    assert len(open_or_build(yaml_file, "train", 320, rebuild="auto", progress=False)) == n
    assert os.listdir(folder)  # sanity: the folder still exists


# -- killed by PID alone: the build's parent dies, its workers are not signalled ---------------------------------------
KILL_BOUND = 60.0  # s: only to tell a hang from a slow machine; the builds below take about a second


_STACKS: list = []


def _build_until(moment: str, entry: str, yaml_file: Path, marker: Path, parent_watch: str,
                 signals_to_other_threads: bool = False) -> None:
    """The body of a build process (forked from the test): build, and stop for good at ``moment``.

    Args:
        moment: "early" (lock held, temporary file made, no worker yet), "mid" (each worker has
            written two images) or "publish" (the tail is written, the file not yet renamed).
        entry: "pack" (what ``yolofeed pack`` runs) or "train" (``open_or_build``, as ``yolofeed train``
            does on first use).
        parent_watch: "linux" (PR_SET_PDEATHSIG and the watch thread), "watch" (the watch thread only,
            as on macOS and Windows) or "none" (workers outlive the parent).
        signals_to_other_threads: the main thread blocks SIGINT and SIGTERM once it waits for workers,
            so the kernel hands them to another thread (as it may at any time): Python runs the handler
            only when the main thread wakes.
    """
    from helpers import OnDisk
    from yolofeed.pack import disk, encode, workers

    os.setsid()  # a process group of its own (it and its workers), for the Ctrl-C case
    sys.stderr = open(marker.with_suffix(".err"), "w")  # what the user would read
    _STACKS.append(open(marker.with_suffix(".stack"), "w"))  # kept open: faulthandler writes to its descriptor
    faulthandler.register(signal.SIGUSR1, file=_STACKS[-1], all_threads=True)  # _join: where a hang waits

    def pause(*_: object) -> None:
        marker.touch()
        time.sleep(600)

    class Paused(OnDisk):
        """Stops for good where the moment is: at the reservation ("early"), or just before the rename ("publish")."""

        def allocate(self, fd: int, nbytes: int) -> bool:
            if moment == "early":
                pause()
            return super().allocate(fd, nbytes)

        def publish(self, *a: object) -> None:
            if moment == "publish":
                pause()
            super().publish(*a)

    if moment == "mid":
        real_load, seen = encode.load_sample, []

        def load(*a, **k):
            seen.append(1)
            if len(seen) == 3:
                pause()
            return real_load(*a, **k)

        encode.load_sample = load
    if signals_to_other_threads:
        import multiprocessing.connection
        import threading

        real_wait = multiprocessing.connection.wait  # what Workers.imap waits in (this process only)

        def wait(*a, **k):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            return real_wait(*a, **k)

        multiprocessing.connection.wait = wait
        # the thread the kernel then hands the signal to (in real use: tqdm's monitor, a library's thread)
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
    if parent_watch == "watch":
        sys.platform = "darwin"  # this process only: no prctl, the watch thread alone
    elif parent_watch == "none":
        workers.die_with_parent = lambda *a: None
    with disk.using(Paused()):
        if entry == "pack":
            from yolofeed.cli import main

            sys.exit(main(["pack", f"data={yaml_file}", "imgsz=64", "splits=train", "workers=2", "rebuild=always"]))
        open_or_build(yaml_file, "train", 64, rebuild="auto", workers=2, progress=False)


def _join(proc: Any, marker: Path) -> None:
    """Wait for a build process to exit; one still running after KILL_BOUND fails the test with its stacks."""
    proc.join(KILL_BOUND)
    if proc.exitcode is None:
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(1.0)
        stacks = marker.with_suffix(".stack").read_text()
        proc.kill()
        pytest.fail(f"the build process did not exit within {KILL_BOUND:.0f} s; its threads:\n{stacks}")


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # a killed orphan may wait for a reaper
    except psutil.NoSuchProcess:
        return False


def _wait_for(condition, seconds: float = KILL_BOUND) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.mark.parametrize("entry, moment, sig, parent_watch", [
    ("pack", "mid", signal.SIGINT, "linux"),  # Ctrl-C: the whole process group
    ("pack", "early", signal.SIGKILL, "linux"),
    ("pack", "mid", signal.SIGKILL, "linux"),
    ("pack", "publish", signal.SIGKILL, "linux"),
    ("pack", "early", signal.SIGTERM, "linux"),
    ("pack", "mid", signal.SIGTERM, "linux"),
    ("pack", "publish", signal.SIGTERM, "linux"),
    ("train", "mid", signal.SIGKILL, "linux"),
    ("train", "mid", signal.SIGTERM, "linux"),
    ("pack", "mid", signal.SIGKILL, "watch"),
])
def test_killing_the_builder_alone_leaves_no_worker_and_no_lock(dataset, tmp_path, caplog, entry, moment, sig,
                                                                parent_watch):
    import logging
    import multiprocessing as mp

    import psutil

    yaml_file = dataset / "data.yaml"
    ref = open_or_build(yaml_file, "train", 64, out=tmp_path / "ref", rebuild="auto", workers=1, progress=False)
    folder = store_dir(yaml_file, 64, "raw")
    marker = tmp_path / "paused"
    proc = mp.get_context("fork").Process(target=_build_until, args=(moment, entry, yaml_file, marker, parent_watch))
    proc.start()
    assert _wait_for(marker.exists), "the build never reached the moment to kill it"
    workers = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    assert len(workers) == {"early": 0, "mid": 2, "publish": 0}[moment]
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)  # as a terminal does
    else:
        os.kill(proc.pid, sig)  # the parent alone: its workers get no signal from us
    _join(proc, marker)
    assert proc.exitcode == {signal.SIGKILL: -signal.SIGKILL, signal.SIGTERM: 143, signal.SIGINT: 130}[sig]
    assert _wait_for(lambda: not any(map(_running, workers))), "workers outlived their parent"
    assert not (folder / "train.yfpack").exists()
    temps = list(folder.glob(".train.yfpack.tmp-*"))
    assert bool(temps) == (sig == signal.SIGKILL)  # SIGTERM, SIGINT: removed by the build itself, at once
    assert "Traceback" not in marker.with_suffix(".err").read_text()

    with caplog.at_level(logging.INFO):
        pack = within(KILL_BOUND, lambda: open_or_build(yaml_file, "train", 64, rebuild="auto", workers=2,
                                                         progress=False))
    assert not list(folder.glob(".*.tmp-*"))
    if sig == signal.SIGKILL:
        assert "left by a build that did not finish" in caplog.text
        assert f"PID {proc.pid} on this host" in caplog.text and "died without finishing" in caplog.text
    assert pack.im_files == ref.im_files
    for i in range(len(pack)):
        np.testing.assert_array_equal(pack.image(i), ref.image(i))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_delivered_to_another_thread_still_stops_the_build(dataset, tmp_path, sig):
    """Every worker stuck, the signal taken by a thread other than the main one: the build still stops."""
    import multiprocessing as mp

    import psutil

    yaml_file = dataset / "data.yaml"
    marker = tmp_path / "paused"
    proc = mp.get_context("fork").Process(target=_build_until, args=("mid", "pack", yaml_file, marker, "linux", True))
    proc.start()
    assert _wait_for(marker.exists)
    workers = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, sig)
    _join(proc, marker)
    assert proc.exitcode == {signal.SIGTERM: 143, signal.SIGINT: 130}[sig], "the signal was not acted on: a hang"
    assert _wait_for(lambda: not any(_running(w.pid) for w in workers))
    assert not list(store_dir(yaml_file, 64, "raw").glob(".*.tmp-*"))


def test_a_worker_killed_mid_build_is_one_clear_error(dataset, tmp_path):
    """The OOM killer takes one worker: one line that says so, no BrokenProcessPool traceback, nothing left."""
    import multiprocessing as mp

    import psutil

    yaml_file = dataset / "data.yaml"
    marker = tmp_path / "paused"
    proc = mp.get_context("fork").Process(target=_build_until, args=("mid", "pack", yaml_file, marker, "linux"))
    proc.start()
    assert _wait_for(marker.exists)
    workers = psutil.Process(proc.pid).children(recursive=True)
    workers[0].kill()
    _join(proc, marker)
    assert proc.exitcode == 1
    err = marker.with_suffix(".err").read_text()
    assert "yolofeed pack: error: a worker process building the train pack died (killed by signal 9 (SIGKILL))" in err
    assert "out-of-memory killer" in err and "Traceback" not in err and "BrokenProcessPool" not in err
    assert _wait_for(lambda: not any(_running(w.pid) for w in workers))
    folder = store_dir(yaml_file, 64, "raw")
    assert not list(folder.glob(".*.tmp-*")) and not (folder / "train.yfpack").exists()


def test_orphaned_workers_never_hold_the_lock(dataset, tmp_path):
    """Even workers that outlive their parent (no PR_SET_PDEATHSIG, no watch) do not block the next build."""
    import multiprocessing as mp

    import psutil

    yaml_file = dataset / "data.yaml"
    marker = tmp_path / "paused"
    proc = mp.get_context("fork").Process(target=_build_until, args=("mid", "pack", yaml_file, marker, "none"))
    proc.start()
    assert _wait_for(marker.exists)
    workers = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    assert _wait_for(lambda: not _running(proc.pid))  # not join(): the orphans hold its sentinel pipe open
    try:
        assert any(_running(w.pid) for w in workers)  # they live on, as they did with flock
        pack = within(KILL_BOUND, lambda: open_or_build(yaml_file, "train", 64, rebuild="auto", workers=2,
                                                         progress=False))
        assert len(pack) == 24
    finally:
        for w in workers:  # ours to end: the test made them orphans
            with contextlib.suppress(psutil.NoSuchProcess):
                w.kill()
        proc.join(KILL_BOUND)


@pytest.mark.slow
def test_cli_build_killed_by_pid_then_the_next_one_finishes(big):
    """The real command line, killed by PID mid-write with SIGKILL: no worker left, the next build finishes."""
    import psutil

    yaml_file = big / "data.yaml"
    folder = store_dir(yaml_file, 320, "raw")
    cmd = [sys.executable, "-m", "yolofeed", "pack", f"data={yaml_file}", "imgsz=320", "splits=train", "workers=2",
           "rebuild=always"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_for(lambda: any(folder.glob(".train.yfpack.tmp-*")) or proc.poll() is not None, 120)
        workers = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        pytest.skip("the build finished before it could be killed")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _wait_for(lambda: not any(_running(w.pid) for w in workers))
    r = subprocess.run(cmd[:-1], capture_output=True, text=True, timeout=300)  # rebuild=auto: may reuse an older pack
    assert r.returncode == 0, r.stderr[-2000:]
    assert not list(folder.glob(".*.tmp-*"))  # removed by the next run, built or reused
    assert len(Pack.open(folder / "train.yfpack")) == 240


def test_a_second_build_waits_for_the_first_and_says_for_whom(dataset, tmp_path, caplog):
    import logging
    import multiprocessing as mp
    import threading

    yaml_file = dataset / "data.yaml"
    marker = tmp_path / "paused"
    proc = mp.get_context("fork").Process(target=_build_until, args=("mid", "train", yaml_file, marker, "linux"))
    proc.start()
    assert _wait_for(marker.exists)
    done = threading.Event()
    with caplog.at_level(logging.INFO):
        t = threading.Thread(target=lambda: (open_or_build(yaml_file, "train", 64, rebuild="auto", workers=1,
                                                           progress=False), done.set()), daemon=True)
        t.start()
        assert _wait_for(lambda: f"waiting for PID {proc.pid} on this host" in caplog.text)
        assert "(running)" in caplog.text and "to finish building in" in caplog.text and not done.is_set()
        os.kill(proc.pid, signal.SIGTERM)
        _join(proc, marker)
        assert done.wait(KILL_BOUND), "the waiter did not go on after the first build was stopped"
    assert len(Pack.open(store_dir(yaml_file, 64, "raw") / "train.yfpack")) == 24


# -- pose packs --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("storage", ["raw", "jpeg"])
def test_a_pose_pack_holds_a_keypoints_section_aligned_with_its_labels(pose_dataset, storage):
    """task=pose writes the keypoints section after the detection sections, with its CRC32, one (K, 3) row per labels
    row; the header says the task and the yaml's kpt_shape; the detection sections mean what they mean in a detection
    pack of the same yaml, whose header names no keypoints (and whose folder is another)."""
    pose = open_or_build(pose_dataset / "data.yaml", "train", 64, storage, rebuild="auto", workers=2, progress=False,
                         task="pose")
    plain = open_or_build(pose_dataset / "data.yaml", "train", 64, storage, rebuild="auto", workers=2, progress=False)
    h = pose.header
    assert h["task"] == "pose" and h["kpt_shape"] == [5, 3] and pose.kpt_shape == (5, 3)
    assert list(h["sections"]) == ["index", "labels", "files", "label_crc", "keypoints", "source_files",
                                   "source_stats"]
    off, n = h["sections"]["keypoints"]
    assert n == h["counts"]["boxes"] * 5 * 3 * 4 and h["checksums"]["keypoints"] == zlib.crc32(pose.buffer[off:off + n])
    assert pose.keypoint_table.shape == (len(pose.label_table), 5, 3) and pose.keypoint_table.dtype == np.float32
    assert plain.task == "detect" and plain.keypoint_table is None and plain.keypoints(0) is None
    assert "keypoints" not in plain.header["sections"] and "kpt_shape" not in plain.header
    assert plain.path.parent.name.endswith("-64") and pose.path.parent.name.endswith("-64-pose")
    assert pose.im_files == plain.im_files
    for i in range(len(pose)):
        rows = np.loadtxt(pose_dataset / "labels" / "train" / f"{Path(pose.im_files[i]).stem}.txt", dtype=np.float32,
                          ndmin=2)
        np.testing.assert_array_equal(pose.labels(i), rows[:, :5])  # the file's order: no duplicates here
        np.testing.assert_array_equal(pose.keypoints(i), rows[:, 5:].reshape(-1, 5, 3))
        np.testing.assert_array_equal(plain.labels(i), rows[:, :5])  # a box task keeps the boxes of pose rows
        np.testing.assert_array_equal(pose.encoded(i), plain.encoded(i))


# -- OBB packs ---------------------------------------------------------------------------------------------------------
def test_an_obb_pack_holds_a_corners_section_aligned_with_its_labels(obb_dataset):
    """task=obb writes the corners section after the detection sections, with its CRC32, one (4, 2) row per labels
    row; the labels rows are the boxes Ultralytics' OBB dataset gives (segments2boxes of the corners) and the
    corners its segments; the header says the task; the folder is <stem>-<format>-<imgsz>-obb."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.dataset import YOLODataset
    from ultralytics.data.utils import check_det_dataset

    pack = open_or_build(obb_dataset / "data.yaml", "train", 64, "raw", rebuild="auto", workers=2, progress=False,
                         task="obb")
    h = pack.header
    assert h["task"] == "obb" and pack.task == "obb" and "kpt_shape" not in h and pack.keypoint_table is None
    assert list(h["sections"]) == ["index", "labels", "files", "label_crc", "corners", "source_files",
                                   "source_stats"]
    off, n = h["sections"]["corners"]
    assert n == h["counts"]["boxes"] * 4 * 2 * 4 and h["checksums"]["corners"] == zlib.crc32(pack.buffer[off:off + n])
    assert pack.corner_table.shape == (len(pack.label_table), 4, 2) and pack.corner_table.dtype == np.float32
    assert pack.path.parent.name.endswith("-raw-64-obb")
    data = check_det_dataset(str(obb_dataset / "data.yaml"), autodownload=False)
    ref = YOLODataset(img_path=data["train"], imgsz=64, augment=False, data=data, hyp=get_cfg(), batch_size=4,
                      rect=False, task="obb")
    assert [Path(f).name for f in pack.im_files] == [Path(lb["im_file"]).name for lb in ref.labels]
    for i, lb in enumerate(ref.labels):
        np.testing.assert_array_equal(pack.labels(i), np.concatenate([lb["cls"], lb["bboxes"]], 1))
        np.testing.assert_array_equal(pack.corners(i), np.stack(lb["segments"]))


# -- segment packs -----------------------------------------------------------------------------------------------------
def test_a_segment_pack_holds_its_polygons_as_ultralytics_reads_them(segment_dataset):
    """task=segment writes the polygon_lengths and polygon_points sections after the detection sections, each with its
    CRC32, one polygon per labels row; the labels rows and polygons are those Ultralytics' segment dataset reads
    (its label cache: boxes by segments2boxes, the polygons as written, before its 1,000-point resample), including
    a duplicate polygon removed and two polygons of one box kept; the folder is <stem>-<format>-<imgsz>-segment."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.dataset import YOLODataset
    from ultralytics.data.utils import check_det_dataset

    label = sorted((segment_dataset / "labels" / "train").glob("*.txt"))[0]
    rows = label.read_text().splitlines()
    twin = rows[0].split()  # the same box, another polygon: its points in reverse order
    twin = [twin[0], *[v for k in range(len(twin[1:]) // 2 - 1, -1, -1) for v in twin[1 + 2 * k:3 + 2 * k]]]
    label.write_text("\n".join([*rows, rows[0], " ".join(twin)]) + "\n")
    pack = open_or_build(segment_dataset / "data.yaml", "train", 64, "raw", rebuild="auto", workers=2,
                         progress=False, task="segment")
    h = pack.header
    assert h["task"] == "segment" and pack.task == "segment" and pack.corner_table is None
    assert list(h["sections"]) == ["index", "labels", "files", "label_crc", "polygon_lengths", "polygon_points",
                                   "source_files", "source_stats"]
    for name in ("polygon_lengths", "polygon_points"):
        off, n = h["sections"][name]
        assert h["checksums"][name] == zlib.crc32(pack.buffer[off:off + n])
    assert len(pack.polygon_lengths) == len(pack.label_table) == h["counts"]["boxes"]
    assert pack.path.parent.name.endswith("-raw-64-segment")
    data = check_det_dataset(str(segment_dataset / "data.yaml"), autodownload=False)
    ref = YOLODataset(img_path=data["train"], imgsz=64, augment=False, data=data, hyp=get_cfg(), batch_size=4,
                      rect=False, task="segment")
    assert [Path(f).name for f in pack.im_files] == [Path(lb["im_file"]).name for lb in ref.labels]
    for i, lb in enumerate(ref.labels):
        np.testing.assert_array_equal(pack.labels(i), np.concatenate([lb["cls"], lb["bboxes"]], 1))
        polygons = pack.polygons(i)
        assert len(polygons) == len(lb["segments"]) and all(len(p) >= 3 for p in polygons)
        for ours, theirs in zip(polygons, lb["segments"]):
            np.testing.assert_array_equal(ours, theirs)
    first = pack.im_files.index(str(label.with_suffix(".jpg")).replace(f"{os.sep}labels{os.sep}",
                                                                       f"{os.sep}images{os.sep}"))
    assert len(pack.labels(first)) == len(rows) + 1  # the duplicate removed, the twin kept
    assert any("1 duplicate labels removed" in note for _, note in h["notes"])


@pytest.mark.parametrize("rows, why", [
    (["0 0.5 0.5 0.2 0.2"], "holds box rows of 5 columns.*segment labels require a polygon each.*task=detect"),
    (["0 0.1 0.1 0.3 0.1 0.2 0.3", "1 0.5 0.5 0.2 0.2"], "mixes segment and box rows"),
    (["0 0.1 0.1 0.3 0.1 0.2 0.3 0.4"], "odd number of coordinates"),  # quoted, in polygon words
    (["0 0.1 0.1 1.3 0.1 0.2 0.3"], "coordinates above 1"),
    (["9 0.1 0.1 0.3 0.1 0.2 0.3"], "uses class 9 but the data yaml has nc=8"),
], ids=["boxes", "mixed", "odd", "outside", "class"])
def test_bad_segment_labels_are_skipped_with_the_file_and_the_fix(segment_dataset, rows, why):
    """Each file Ultralytics' segment dataset would not use is skipped and reported with its reason; the other images
    are packed. A file of box rows is ours to skip: Ultralytics refuses the whole run on it."""
    from ultralytics.data.utils import verify_image_label

    label = sorted((segment_dataset / "labels" / "train").glob("*.txt"))[1]
    label.write_text("\n".join(rows) + "\n")
    image = str(label.with_suffix(".jpg")).replace(f"{os.sep}labels{os.sep}", f"{os.sep}images{os.sep}")
    theirs = verify_image_label((image, str(label), "", False, 8, 0, 0, False))
    assert (theirs[0] is None) == (not why.startswith("holds box rows"))  # Ultralytics skips the file, but box rows
    pack = open_or_build(segment_dataset / "data.yaml", "train", 64, "raw", rebuild="auto", workers=1,
                         progress=False, task="segment")
    skipped = dict(pack.header["skipped"])
    assert image in skipped and re.search(why, skipped[image]) and str(label) in skipped[image]
    assert image not in pack.im_files and len(pack.im_files) == 11


def test_pack_at_a_size_yolo_train_rounds_is_built_at_the_size_it_trains_at(dataset, caplog):
    """yolo train rounds imgsz up to a multiple of the stride (check_imgsz): a pack built at imgsz=63 would never be
    opened (training asks for the 64 one). Was: built at 63 without a word, gigabytes for nothing."""
    import logging

    from yolofeed.config import PackConfig
    from yolofeed.pack.command import run

    caplog.set_level(logging.WARNING)
    (result,) = run(PackConfig(data=str(dataset / "data.yaml"), imgsz=63, splits="val", workers=1))
    assert result.pack.imgsz == 64 and store_dir(dataset / "data.yaml", 64, "raw").is_dir()
    assert not store_dir(dataset / "data.yaml", 63, "raw").exists()
    assert "imgsz=63 is not a multiple of 32, the models' stride: yolo train and yolofeed train round it up to 64" \
        in caplog.text

"""A pack build killed at any moment leaves nothing a reader accepts, and the next run recovers."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import within
from yolofeed import synth
from yolofeed.config import SynthConfig
from yolofeed.errors import PackError
from yolofeed.pack import Pack, open_or_build
from yolofeed.pack.paths import store_dir


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


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.6, 0.9])
def test_killed_build_is_never_accepted(big, fraction):
    yaml_file = big / "data.yaml"
    folder = store_dir(yaml_file, 320, "raw")
    t0 = time.perf_counter()
    ref = open_or_build(yaml_file, "train", 320, rebuild="always", progress=False, workers=1)
    seconds = time.perf_counter() - t0  # what the subprocess's build will take, start-up aside
    ref_images = [ref.image(i).copy() for i in (0, len(ref) // 2, len(ref) - 1)]
    ref.path.unlink()

    killed = _kill_after(_start(yaml_file), folder, fraction * seconds)
    final = folder / "train.yfpack"
    if fraction <= 0.3:  # later moments may land after the build on a fast run: either outcome is checked below
        assert killed and not final.exists(), "the build finished before it could be killed"
    if final.exists():  # killed after publishing: then it must be the whole pack
        assert len(Pack.open(final)) == len(ref)
        final.unlink()
    for f in folder.glob(".train.yfpack.tmp-*"):  # even opened by name, a temp file is refused unless it is whole
        try:  # (killed between writing the trailer and the rename, it is a finished pack under a temp name)
            whole = Pack.open(f)
        except PackError:
            continue
        assert len(whole) == len(ref)
        np.testing.assert_array_equal(whole.image(len(ref) - 1), ref_images[-1])
    with pytest.raises(PackError, match="does not exist"):
        open_or_build(yaml_file, "train", 320, rebuild="never")

    # the next run rebuilds, cleans up, and gives the same content
    pack = open_or_build(yaml_file, "train", 320, rebuild="auto", progress=False, workers=2)
    assert not list(folder.glob(".train.yfpack.tmp-*"))
    assert len(pack) == len(ref)
    for k, i in enumerate((0, len(ref) // 2, len(ref) - 1)):
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


# -- killed by PID alone: the build's parent dies, its workers are not signalled -----------------------------
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
    from yolofeed.pack import disk, encode

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
        encode.die_with_parent = lambda *a: None
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

"""The pack folder lock: who holds it is recorded, waiters say whom they wait for, dead holders are replaced.

Both mechanisms run here: the kernel record lock (``fcntl.lockf``) and the file lock used where there
is no ``fcntl`` (Windows) or the filesystem refuses record locks; the second is selected by hiding
``fcntl`` from the module.

The lock files themselves are tried with what a shared folder can hold under their names (a symbolic link, a
folder, a FIFO, a hard link, a file of the user's own, another user's file): one line that names the file, nothing
written through, emptied or deleted. RELIABILITY.md lists these tests with their outcomes.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

import yolofeed.pack.lock as lock
from helpers import VICTIM, as_another_user, cli_lines, copy_dataset, within, world_readable_dir
from helpers import build_out as _build
from helpers import pack_args as _pack_args
from helpers import planted_folder as _folder
from yolofeed.errors import PackError
from yolofeed.pack.lock import FolderLock, Holder
from yolofeed.processes import process_start

BOUND = 60.0  # s: only to tell a hang from a slow machine


class _Stop(Exception):
    """Raised by the fake sleep to end a wait the test has seen enough of."""


def _hold(folder: Path, ready: Path, mechanism: str) -> None:
    """Child process: take the folder's lock, say so, and keep it until killed."""
    if mechanism == "file":
        lock.fcntl = None
    lk = FolderLock(folder)
    if mechanism == "file":
        lk.mechanism = "file"
    lk.acquire()
    ready.touch()
    time.sleep(600)


def _holding_child(folder: Path, tmp_path: Path, mechanism: str = "kernel") -> mp.Process:
    ready = tmp_path / "held"
    child = mp.get_context("fork").Process(target=_hold, args=(folder, ready, mechanism))
    child.start()
    t0 = time.monotonic()
    while not ready.exists():
        assert time.monotonic() - t0 < BOUND and child.is_alive()
        time.sleep(0.01)
    return child


def _dead_pid() -> int:
    """The PID of a process that has exited."""
    child = mp.get_context("fork").Process(target=os._exit, args=(0,))
    child.start()
    child.join()
    return child.pid


def test_a_holder_is_alive_dead_reused_or_unknown():
    me = Holder.me()
    assert me.pid == os.getpid() and me.host == socket.gethostname() and me.state() == "alive"
    assert Holder(_dead_pid(), me.host, 0.0, time.time(), "x").state() == "dead"
    reused = Holder(os.getpid(), me.host, me.started - 3600, time.time(), "x")  # our PID, an older process
    assert reused.state() == "dead"
    assert Holder(os.getpid(), "another-host", me.started, time.time(), "x").state() == "unknown"
    assert Holder.parse(me.dumps()) == me and Holder.parse("") is None and Holder.parse("{}") is None
    assert process_start(_dead_pid()) is None


def test_holder_is_recorded_and_cleared(tmp_path):
    with FolderLock(tmp_path) as lk:
        record = json.loads((tmp_path / ".lock").read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        assert record["started"] == pytest.approx(process_start(os.getpid()), abs=1.0) and record["command"]
        assert lk.previous is None
    assert (tmp_path / ".lock").read_text() == ""  # released: nobody to blame


def test_waiter_names_the_live_holder_then_takes_over_when_it_is_killed(tmp_path, caplog):
    folder = tmp_path / "packs"
    child = _holding_child(folder, tmp_path)
    got = threading.Event()

    def wait():
        with FolderLock(folder, poll=0.02) as lk:
            got.previous = lk.previous
            got.set()

    with caplog.at_level(logging.INFO, logger="yolofeed.pack.lock"):
        t = threading.Thread(target=wait, daemon=True)
        t.start()
        t0 = time.monotonic()
        while f"waiting for PID {child.pid} on this host" not in caplog.text:
            assert time.monotonic() - t0 < BOUND, caplog.text
            time.sleep(0.01)
        assert "(running)" in caplog.text and "waited 0 s" in caplog.text and not got.is_set()
        os.kill(child.pid, signal.SIGKILL)
        assert got.wait(BOUND), "the waiter did not take over from a killed holder"
    child.join()
    assert got.previous.pid == child.pid
    assert f"PID {child.pid} on this host" in caplog.text and "died without finishing; taking over" in caplog.text


def test_try_acquire_takes_a_free_lock_and_leaves_a_held_one(tmp_path):
    folder = tmp_path / "packs"
    child = _holding_child(folder, tmp_path)
    try:
        assert not FolderLock(folder).try_acquire()
        assert Holder.parse((folder / ".lock").read_text()).pid == child.pid  # the holder's record untouched
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    lk = FolderLock(folder)
    assert lk.try_acquire() and Holder.parse((folder / ".lock").read_text()).pid == os.getpid()
    lk.release()


def test_waiter_reports_every_interval_by_the_clock():
    """A waiter logs once, then again each ``report_every`` seconds of its clock (a fake one here)."""
    clock = [0.0]
    folder_lock = FolderLock("unused", poll=5.0, report_every=30.0, clock=lambda: clock[0])
    reports = []
    folder_lock._report = lambda holder, waited: reports.append(waited)
    attempts = iter([False] * 8 + [True])
    folder_lock._try = lambda: next(attempts)
    folder_lock._write_holder = lambda: None
    folder_lock._read_holder = lambda: None

    def sleep(seconds):
        clock[0] += seconds

    folder_lock.sleep = sleep
    folder_lock.folder = Path(os.getcwd())  # mkdir of an existing folder: nothing written
    folder_lock.acquire()
    folder_lock._thread_lock.release()
    assert reports == [0.0, 30.0]  # polls at 0, 5, ..., 35 s: reported at 0 and 30


def test_threads_of_one_process_take_turns(tmp_path):
    """Record locks belong to the process, so threads are serialised separately."""
    inside, most = [0], [0]

    def work():
        with FolderLock(tmp_path, poll=0.01):
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            time.sleep(0.02)
            inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    assert most[0] == 1


# -- the file mechanism: no fcntl (Windows), or record locks refused (NFS without lockd) -------------------------------
@pytest.fixture()
def file_mechanism(monkeypatch):
    monkeypatch.setattr(lock, "fcntl", None)


def _write_owner(folder: Path, holder: Holder) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".lock.owner").write_text(holder.dumps())


@pytest.mark.parametrize("how", ["pid gone", "pid reused"])
def test_file_lock_of_a_dead_holder_is_taken_over(tmp_path, caplog, file_mechanism, how):
    me = Holder.me()
    dead = (Holder(_dead_pid(), me.host, me.started, time.time() - 60, "yolofeed pack ...") if how == "pid gone"
            else Holder(os.getpid(), me.host, me.started - 3600, time.time() - 60, "yolofeed pack ..."))
    _write_owner(tmp_path, dead)
    with caplog.at_level(logging.INFO, logger="yolofeed.pack.lock"):
        with FolderLock(tmp_path, poll=0.01) as lk:
            assert lk.mechanism == "file" and lk.previous == dead
            assert Holder.parse((tmp_path / ".lock.owner").read_text()).pid == os.getpid()
    assert "gone" in caplog.text and "died without finishing; taking over" in caplog.text
    assert not (tmp_path / ".lock.owner").exists() and not (tmp_path / ".lock.break").exists()


def test_file_lock_waits_for_a_live_holder_and_for_another_host(tmp_path, caplog, file_mechanism):
    child = _holding_child(tmp_path / "a", tmp_path, mechanism="file")
    other = Holder(4242, "build-node-7", 1.0, time.time(), "yolofeed pack ...")
    _write_owner(tmp_path / "b", other)

    def give_up_after(n):
        calls = []

        def sleep(_):
            calls.append(1)
            if len(calls) >= n:
                raise _Stop
        return sleep

    try:
        with caplog.at_level(logging.INFO, logger="yolofeed.pack.lock"):
            for folder in (tmp_path / "a", tmp_path / "b"):
                with pytest.raises(_Stop):
                    FolderLock(folder, poll=0.01, sleep=give_up_after(3)).acquire()
        assert f"waiting for PID {child.pid} on this host" in caplog.text and "(running)" in caplog.text
        assert "PID 4242 on host build-node-7" in caplog.text and "cannot be checked from here" in caplog.text
        assert f"delete it: rm {tmp_path / 'b' / '.lock.owner'}" in caplog.text
        assert Holder.parse((tmp_path / "b" / ".lock.owner").read_text()) == other  # left alone
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        with FolderLock(tmp_path / "a", poll=0.01) as lk:  # the killed holder's file is taken over
            assert lk.previous.pid == child.pid
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)


def test_file_lock_left_unrecorded_is_broken_after_a_while(tmp_path, file_mechanism):
    """A holder killed between creating the file and writing its record leaves an empty file: stale in time."""
    (tmp_path / ".lock.owner").write_text("")
    old = time.time() - lock.STALE_BREAK - 5
    os.utime(tmp_path / ".lock.owner", (old, old))
    with FolderLock(tmp_path, poll=0.01):
        assert Holder.parse((tmp_path / ".lock.owner").read_text()).pid == os.getpid()


@pytest.mark.parametrize("planted", ["fifo", "junk", "folder", "junk break file"])
def test_a_file_lock_that_is_not_yolofeeds_is_refused_never_broken(tmp_path, file_mechanism, planted):
    """The file mechanism read a waiting lock's record with read_text (a FIFO there blocked the waiter for good),
    and broke a stale lock by deleting the file whatever it held (a folder was an IsADirectoryError). Now a record is
    read without blocking, and a lock file (or a break file) that is not yolofeed's is one line, left as it is."""
    owner = tmp_path / ".lock.owner"
    target = tmp_path / ".lock.break" if planted == "junk break file" else owner
    if planted == "fifo":
        os.mkfifo(owner)
    elif planted == "folder":
        owner.mkdir()
    else:
        target.write_bytes(b"my own notes\n")
        if planted == "junk break file":
            owner.write_text("")  # a holder that never recorded itself: broken once stale
    old = time.time() - lock.STALE_BREAK - 5
    os.utime(target, (old, old), follow_symlinks=False)
    os.utime(owner, (old, old), follow_symlinks=False)
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(error=_raised(FolderLock(tmp_path, poll=0.01).acquire)),
                         daemon=True)
    t.start()
    t.join(BOUND)
    assert not t.is_alive(), "the waiter blocked on the lock file"
    assert isinstance(result["error"], PackError), result
    assert f"{target} is " in str(result["error"]) and "its build lock" in str(result["error"])
    assert os.path.lexists(target) and (planted != "junk" or target.read_bytes() == b"my own notes\n")


def _raised(fn) -> BaseException | None:
    try:
        fn()
    except BaseException as e:  # returned to the test
        return e
    return None


def test_record_locks_refused_fall_back_to_the_file_lock(tmp_path, monkeypatch, caplog):
    import errno

    class NoLocks:
        LOCK_EX, LOCK_NB, LOCK_UN = 2, 4, 8

        @staticmethod
        def lockf(fd, op):
            raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock, "fcntl", NoLocks)
    with caplog.at_level(logging.INFO, logger="yolofeed.pack.lock"):
        with FolderLock(tmp_path) as lk:
            assert lk.mechanism == "file" and (tmp_path / ".lock.owner").exists()
    assert "refuses record locks" in caplog.text


# -- the lock files: what a shared pack folder may hold under their names ----------------------------------------------
@pytest.mark.parametrize("target", ["a file", "a missing file"])
def test_a_lock_that_is_a_link_is_refused_and_its_target_never_written(dataset, tmp_path, target):
    """A ``.lock`` linked to a file was emptied (opened with O_CREAT and truncated through the link); linked to a
    missing file, that file was created. Now: one line naming the link, the target as it was."""
    yaml_file, out = dataset / "data.yaml", tmp_path / "packs"
    victim = tmp_path / "victim.txt"
    if target == "a file":
        victim.write_bytes(VICTIM)
    (_folder(yaml_file, out) / ".lock").symlink_to(victim)
    with pytest.raises(PackError, match=rf"{_folder(yaml_file, out) / '.lock'} is a symbolic link to {victim} .*not a "
                                        r"file yolofeed made: yolofeed keeps its build lock under that name .*Move it "
                                        r"away \(mv .*\), or give yolofeed another folder: out="):
        _build(yaml_file, out)
    rc, lines = cli_lines(_pack_args(yaml_file, out))
    assert rc == 1 and len(lines) == 1 and ".lock is a symbolic link" in lines[0], lines
    assert victim.read_bytes() == VICTIM if target == "a file" else not victim.exists()


@pytest.mark.parametrize("planted", ["folder", "fifo", "hard link", "foreign file"])
def test_a_lock_that_is_not_yolofeeds_is_one_line_and_left_as_it_is(dataset, tmp_path, planted):
    """A folder (was an IsADirectoryError traceback), a FIFO (must not block), a hard link to another file (would be
    written through) and a file of the user's own named .lock (was emptied)."""
    yaml_file, out = dataset / "data.yaml", tmp_path / "packs"
    lock = _folder(yaml_file, out) / ".lock"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    words = {"folder": "is a folder", "fifo": "is a FIFO (named pipe)",
             "foreign file": "is a file yolofeed did not write",
             "hard link": "is a regular file with 2 hard links"}[planted]
    if planted == "folder":
        lock.mkdir()
    elif planted == "fifo":
        os.mkfifo(lock)
    elif planted == "hard link":
        os.link(victim, lock)
    else:
        lock.write_bytes(VICTIM)
    rc, lines = within(BOUND, lambda: cli_lines(_pack_args(yaml_file, out)))
    assert rc == 1 and len(lines) == 1 and f"{lock} {words}" in lines[0] and "its build lock" in lines[0], lines
    with pytest.raises(PackError, match=re.escape(words)):
        within(BOUND, lambda: _build(yaml_file, out))
    assert victim.read_bytes() == VICTIM
    if planted == "foreign file":
        assert lock.read_bytes() == VICTIM
    assert not (lock.parent / "train.yfpack").exists()


def _pack_as_other_user(yaml_file: Path, out: Path) -> tuple:
    return cli_lines(_pack_args(yaml_file, out))


def test_a_lock_another_user_owns_is_one_line(synth_root):
    """A shared pack folder (world-writable, sticky) whose .lock belongs to another user and is closed to this one
    (mode 0600): was a PermissionError traceback. Root is refused nothing by a mode, so as root the build runs as
    user nobody."""
    with world_readable_dir() as shared:
        root = copy_dataset(synth_root, shared / "ds")
        subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)  # the dataset: readable by every user
        yaml_file, out = root / "data.yaml", shared / "packs"
        folder = _folder(yaml_file, out)
        for p in (out, folder):
            p.chmod(0o1777)
        lock = folder / ".lock"
        lock.write_bytes(b"")
        lock.chmod(0o600 if os.geteuid() == 0 else 0o000)
        rc, lines = as_another_user(_pack_as_other_user, yaml_file, out)
        assert rc == 1 and len(lines) == 1, lines
        assert f"cannot open {lock} (Permission denied; owned by " in lines[0]
        assert "yolofeed needs to read and write it (its build lock)" in lines[0] and "out=" in lines[0]

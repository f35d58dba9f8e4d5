"""What is already in a pack folder is not yolofeed's to write through, overwrite or delete.

``out=`` and ``pack_dir=`` take any folder, and a dataset folder may be shared with other users; so each file a build
writes there (the lock, the temporary pack, the pack, the report) is tried here with a symbolic link, a hard link, a
folder, a FIFO, a file of the user's own and another user's file planted under its name. Each ends in a correct build
or in one line that names the file and what to do; no planted link's target, and no file yolofeed did not make, is
ever changed or deleted. RELIABILITY.md lists these tests with their outcomes.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from pathlib import Path

import pytest

from helpers import as_another_user, cli_lines, copy_dataset, world_readable_dir
from yolofeed.errors import PackError
from yolofeed.pack import open_or_build
from yolofeed.pack.build import store_dir

VICTIM = b"precious: not yolofeed's\n"
BOUND = 60.0  # s: only to tell a hang from a slow machine


def _build(yaml_file: Path, out: Path, **kw):
    kw = {"rebuild": "auto", "workers": 1, "progress": False, **kw}
    return open_or_build(yaml_file, "train", 64, "raw", out=out, **kw)


def _pack_args(yaml_file: Path, out: Path) -> list[str]:
    return ["pack", f"data={yaml_file}", "imgsz=64", "format=raw", "splits=train", "workers=1", f"out={out}"]


def _folder(yaml_file: Path, out: Path) -> Path:
    """The folder the train pack of ``out=`` goes to, made (so that files can be planted in it first)."""
    folder = store_dir(yaml_file, 64, "raw", out)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _within(seconds: float, fn):
    """fn(), or a test failure if it has not returned after ``seconds`` (a hang)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # re-raised in the test's thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still waiting after {seconds} s: a hang"
    if "error" in out:
        raise out["error"]
    return out["value"]


# -- the lock --------------------------------------------------------------------------------------------------
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
    rc, lines = _within(BOUND, lambda: cli_lines(_pack_args(yaml_file, out)))
    assert rc == 1 and len(lines) == 1 and f"{lock} {words}" in lines[0] and "its build lock" in lines[0], lines
    with pytest.raises(PackError, match=re.escape(words)):
        _within(BOUND, lambda: _build(yaml_file, out))
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

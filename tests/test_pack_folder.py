"""What is already in a pack folder is not yolofeed's to write through, overwrite or delete.

``out=`` and ``pack_dir=`` take any folder, and a dataset folder may be shared with other users; so each file a build
writes there (the lock, the temporary pack, the pack, the report) is tried here with a symbolic link, a hard link, a
folder, a FIFO, a file of the user's own and another user's file planted under its name. Each ends in a correct build
or in one line that names the file and what to do; no planted link's target, and no file yolofeed did not make, is
ever changed or deleted. RELIABILITY.md lists these tests with their outcomes.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from pathlib import Path

import pytest

from helpers import as_another_user, cli_lines, copy_dataset, within, world_readable_dir
from yolofeed.errors import PackError
from yolofeed.pack import open_or_build
from yolofeed.pack.layout import PREAMBLE
from yolofeed.pack.paths import store_dir

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
    rc, lines = within(BOUND, lambda: cli_lines(_pack_args(yaml_file, out)))
    assert rc == 1 and len(lines) == 1 and f"{lock} {words}" in lines[0] and "its build lock" in lines[0], lines
    with pytest.raises(PackError, match=re.escape(words)):
        within(BOUND, lambda: _build(yaml_file, out))
    assert victim.read_bytes() == VICTIM
    if planted == "foreign file":
        assert lock.read_bytes() == VICTIM
    assert not (lock.parent / "train.yfpack").exists()


def test_yolofeed_train_refuses_a_lock_that_is_not_yolofeeds_before_the_run_folder(dataset, tmp_path):
    """The pack is built after Ultralytics made the run folder and the model: the check before them (``check_split``,
    in the trainer's ``__init__``) looks at the lock file a build would take, as it looks at the free space."""
    from yolofeed.train import FastDetectionTrainer

    yaml_file, out = dataset / "data.yaml", tmp_path / "packs"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    (_folder(yaml_file, out) / ".lock").symlink_to(victim)
    overrides = dict(model="yolo11n.yaml", data=str(yaml_file), imgsz=64, device="cpu", project=str(tmp_path / "runs"),
                     name="r")
    with pytest.raises(PackError, match=r"\.lock is a symbolic link to .*its build lock"):
        FastDetectionTrainer.with_options(pack_dir=str(out), pack_format="raw")(overrides=overrides)
    assert not (tmp_path / "runs").exists() and victim.read_bytes() == VICTIM


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


# -- the report --------------------------------------------------------------------------------------------------
def test_the_report_is_never_written_through_a_link_or_over_a_file_yolofeed_did_not_make(dataset, tmp_path, caplog):
    """The report's temporary name was predictable (``.train.report.txt.tmp-<pid>``) and written through a link;
    ``train.report.txt`` itself was overwritten whatever it was. Now: a new name taken with O_EXCL; a report name
    that holds someone else's file or a link is left as it is, with a warning, and the pack is still built."""
    yaml_file, out = dataset / "data.yaml", tmp_path / "packs"
    folder = _folder(yaml_file, out)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    (folder / f".train.report.txt.tmp-{os.getpid()}").symlink_to(victim)  # the old name of this process's report
    pack = _build(yaml_file, out)
    assert victim.read_bytes() == VICTIM
    assert (folder / "train.report.txt").read_text().startswith("# train.yfpack: 0 skipped, 0 notes.")

    for planted in ("own notes", "link"):
        report = folder / "train.report.txt"
        report.unlink()
        if planted == "own notes":
            report.write_bytes(VICTIM)
        else:
            report.symlink_to(victim)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert _build(yaml_file, out, rebuild="always") and pack.path.exists()
        assert "did not write its report" in caplog.text and f"{report} is" in caplog.text
        assert victim.read_bytes() == VICTIM and (report.is_symlink() == (planted == "link"))
        if planted == "own notes":
            assert report.read_bytes() == VICTIM


# -- the temporary file and the leftover sweep -------------------------------------------------------------------
def test_a_planted_temporary_name_is_passed_over(dataset, tmp_path, monkeypatch):
    """Someone who guesses the build's temporary name and plants a link there first: the build draws another name
    (O_EXCL never opens what is there), and the link's target is untouched."""
    import secrets

    yaml_file, out = dataset / "data.yaml", tmp_path / "packs"
    folder = _folder(yaml_file, out)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    tokens = iter(["0badc0de", "0badc0de", "1234abcd"] + [None] * 10)
    real = secrets.token_hex
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(tokens) or real(n))
    planted = folder / f".train.yfpack.tmp-{os.getpid()}-0badc0de"
    planted.symlink_to(victim)
    assert len(_build(yaml_file, out)) == 24
    assert victim.read_bytes() == VICTIM and planted.is_symlink()


def test_only_yolofeeds_own_temporary_files_are_swept(dataset, tmp_path, caplog):
    """The sweep deleted every ``.*.tmp-*`` file of the folder (out= may be any folder). Now only a regular file
    named as a build names its temporary files and starting as yolofeed writes them: a dead build's pack or report."""
    yaml_file, out = dataset / "data.yaml", tmp_path / "packs"
    folder = _folder(yaml_file, out)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    theirs = {
        ".notes.tmp-1": VICTIM,  # an editor's, a sync tool's
        ".train.yfpack.tmp-1-deadbeef": VICTIM,  # named as ours, not ours
        ".train.report.txt.tmp-1-deadbeef": VICTIM,
    }
    for name, data in theirs.items():
        (folder / name).write_bytes(data)
    (folder / ".train.yfpack.tmp-2-deadbeef").symlink_to(victim)  # a link named as ours: not followed, not deleted
    (folder / ".val.yfpack.tmp-3-deadbeef").mkdir()
    dead = {".train.yfpack.tmp-4-0123abcd": PREAMBLE + b"\0" * 1000,  # what a killed build leaves
            ".train.report.txt.tmp-4-0123abcd": b"# train.yfpack: 1 skipped, 0 notes. file<TAB>status<TAB>reason\nx\n"}
    for name, data in dead.items():
        (folder / name).write_bytes(data)
    with caplog.at_level(logging.INFO):
        _build(yaml_file, out)
    for name, data in theirs.items():
        assert (folder / name).read_bytes() == data, name
    assert (folder / ".train.yfpack.tmp-2-deadbeef").is_symlink() and victim.read_bytes() == VICTIM
    assert (folder / ".val.yfpack.tmp-3-deadbeef").is_dir()
    assert not any((folder / name).exists() for name in dead)
    assert "removed .train.yfpack.tmp-4-0123abcd" in caplog.text
    assert f"left {folder / '.train.yfpack.tmp-1-deadbeef'} alone (a regular file)" in caplog.text


# -- the pack's own name -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("planted", ["own file", "link to a pack"])
def test_a_pack_name_holding_what_yolofeed_did_not_write_is_never_replaced(dataset, tmp_path, planted):
    """A file of the user's own named train.yfpack was replaced by a rebuild=auto build (it is not a pack, so it was
    "rebuilt"); a link to a pack on another disk was replaced by a file here. Now: refused before the build, with
    one line, and left as it is."""
    yaml_file, out = dataset / "data.yaml", tmp_path / "packs"
    dest = _folder(yaml_file, out) / "train.yfpack"
    elsewhere = tmp_path / "other-disk"
    if planted == "own file":
        dest.write_bytes(VICTIM)
        before = VICTIM
    else:
        real = _build(yaml_file, elsewhere)
        before = real.path.read_bytes()
        dest.symlink_to(real.path)
        sorted((dataset / "labels" / "train").glob("*.txt"))[0].write_text("1 0.5 0.5 0.2 0.2\n")  # now stale
    words = "is a file yolofeed did not write" if planted == "own file" else "is a symbolic link to"
    rc, lines = cli_lines(_pack_args(yaml_file, out))
    assert rc == 1 and len(lines) == 1 and f"{dest} {words}" in lines[0] and "the train pack" in lines[0], lines
    with pytest.raises(PackError, match=words):
        _build(yaml_file, out)
    assert (dest.resolve().read_bytes() if planted == "link to a pack" else dest.read_bytes()) == before
    assert dest.is_symlink() == (planted == "link to a pack")
    assert not [p for p in dest.parent.iterdir() if ".tmp-" in p.name]


def test_a_pack_yolofeed_wrote_before_the_preamble_is_still_replaced(dataset, tmp_path):
    """Packs written before the preamble (payloads from byte 0) are known by their trailer: rebuilt as before."""
    yaml_file, out = dataset / "data.yaml", tmp_path / "packs"
    pack = _build(yaml_file, out)
    data = pack.path.read_bytes()
    assert data.startswith(PREAMBLE)
    old = bytearray(data)
    old[:len(PREAMBLE)] = bytes(len(PREAMBLE))  # as an older build left those bytes: no preamble, same trailer
    pack.path.write_bytes(bytes(old))
    assert _build(yaml_file, out, rebuild="always").path.read_bytes().startswith(PREAMBLE)


# -- one out= folder for several datasets and sizes --------------------------------------------------------------
def test_two_datasets_and_two_sizes_in_one_pack_folder_keep_their_packs(dataset, tmp_path, caplog):
    """``out=``/``pack_dir=`` put every pack directly in the folder: a second dataset or imgsz replaced the first's
    pack, and each run rebuilt the other's. Now each gets <yaml stem>-<format>-<imgsz> there, as the default
    location always had; a pack left directly in out= by an older yolofeed is named, not used nor deleted."""
    from yolofeed.pack.rebuild import check_split, ensure_split

    a = dataset / "data.yaml"
    b = dataset / "coco.yaml"
    b.write_text(a.read_text())
    out = tmp_path / "shared"
    runs = [(a, 64), (a, 96), (b, 64)]

    def each(**kw):
        return [ensure_split(y, "train", s, "raw", out=out, workers=1, progress=False, **kw) for y, s in runs]

    first = each(rebuild="auto")
    assert all(r.built for r in first) and len({r.pack.path for r in first}) == 3
    assert [r.pack.path.parent for r in first] == [out / "data-raw-64", out / "data-raw-96", out / "coco-raw-64"]
    assert not any(r.built for r in each(rebuild="auto"))  # nothing rebuilt: no pack replaced another
    for y, s in runs:  # yolofeed train's own check (pack_dir= is out=) finds each
        check_split(y, "train", s, "raw", out, "never")
    rc, lines = cli_lines(["pack", f"data={b}", "imgsz=64", "format=raw", "splits=train", f"out={out}"])
    assert rc == 0 and not lines

    old = out / "train.yfpack"  # where an older yolofeed put the pack
    old.write_bytes(first[0].pack.path.read_bytes())
    with pytest.raises(PackError, match=rf"{out / 'data-raw-32' / 'train.yfpack'} does not exist \({old} is where "
                                        r"packs of out= went before .*delete it once nothing needs it\)"):
        ensure_split(a, "train", 32, "raw", out=out, rebuild="never")
    with caplog.at_level(logging.INFO):
        ensure_split(a, "train", 32, "raw", out=out, rebuild="auto", workers=1, progress=False)
    assert f"building the train pack in {out / 'data-raw-32'} ({old} is where packs of out= went" in caplog.text
    assert old.read_bytes() == first[0].pack.path.read_bytes()

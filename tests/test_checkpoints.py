"""A run's checkpoints survive a kill mid-write, and a resume of a damaged one names the checkpoint to go on from.

Ultralytics writes last.pt, best.pt and epochN.pt in place (truncate, then write): a SIGKILL in that window left an
empty or truncated last.pt, with the previous one gone. RELIABILITY.md lists these tests.
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from yolofeed import atomic
from yolofeed.atomic import write_atomically
from yolofeed.cli import main
from yolofeed.errors import WriteError
from yolofeed.train import checkpoints
from yolofeed.train.checkpoints import AtomicPath, sweep, write_run_file


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if checkpoints.TEMP.fullmatch(p.name))


@pytest.mark.parametrize("fault", [KeyboardInterrupt, OSError])
def test_a_write_stopped_half_way_leaves_the_old_file_whole(tmp_path, monkeypatch, fault):
    """Ctrl-C (or a full disk) after half the bytes: the old checkpoint is untouched and no temporary file is left."""
    last = tmp_path / "last.pt"
    last.write_bytes(b"old checkpoint")
    real, calls = os.write, []

    def half(fd, data):
        calls.append(len(data))
        if len(calls) > 1:
            raise fault(28, "No space left on device") if fault is OSError else fault()
        return real(fd, bytes(data[: len(data) // 2]))

    monkeypatch.setattr(atomic.os, "write", half)
    with pytest.raises(fault):
        write_atomically(last, b"x" * 1000)
    assert last.read_bytes() == b"old checkpoint" and _temps(tmp_path) == []
    monkeypatch.undo()
    assert write_atomically(last, b"new") == 3 and last.read_bytes() == b"new" and _temps(tmp_path) == []


@pytest.mark.parametrize("code, meaning, fix", [
    (errno.ENOSPC, "the disk is full", "free some space, or train with project= on another disk"),
    (errno.EFBIG, "file-size limit (ulimit -f)", "raise the limit (ulimit -f unlimited)"),
    (errno.EROFS, "the disk is read-only", "mount the disk read-write again, or train with project= a folder you "
                                           "can write"),
    (errno.EACCES, "no permission to write there", "make the run's weights folder writable again, or train with "
                                                   "project= a folder you can write"),  # first what lets it resume
])
def test_a_failed_write_a_user_can_fix_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys, code, meaning, fix):
    """A full disk, a file-size limit or a read-only disk at a checkpoint: a WriteError (an OSError too) naming the
    file, what the error means and the fix; the CLI prints it as one line."""
    last = tmp_path / "last.pt"
    last.write_bytes(b"old checkpoint")

    def fail(fd, data):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(atomic.os, "write", fail)
    with pytest.raises(WriteError) as caught:
        write_run_file(last, b"x" * 1000)
    assert isinstance(caught.value, OSError) and caught.value.errno == code
    again = pickle.loads(pickle.dumps(caught.value))  # as a bench mode's error comes back from its process
    assert (type(again), str(again), again.errno, again.filename) == (WriteError, str(caught.value), code, str(last))
    text = str(caught.value)
    assert text.startswith(f"could not write {last}: ") and meaning in text and fix in text
    assert last.read_bytes() == b"old checkpoint" and _temps(tmp_path) == []
    with pytest.raises(WriteError) as caught:  # a file of no training run (bench.json): no training run's fix
        write_atomically(last, b"x" * 1000)
    assert str(caught.value) == (f"could not write {last}: {atomic.MEANINGS[code]} ({os.strerror(code)}); the file is "
                                 "as it was before, nothing half-written is left")
    monkeypatch.setattr(atomic, "create_temp", lambda path: (_ for _ in ()).throw(OSError(code, "refused")))
    with pytest.raises(WriteError, match=f"could not write {last}.*{re.escape(fix)}"):
        write_run_file(last, b"x")  # the temporary file cannot even be made
    first = tmp_path / "best.pt"  # no such file yet (the first epoch's): not "as it was before"
    with pytest.raises(WriteError) as caught:
        write_run_file(first, b"x")
    assert "; no file is there, nothing half-written is left: " in str(caught.value) and not first.exists()
    assert "resume" not in str(caught.value)  # whether a run resumes is the trainer's line to say: epoch 1 cannot


def test_the_replaced_checkpoint_keeps_its_mode(tmp_path):
    last = tmp_path / "last.pt"
    last.write_bytes(b"old")
    last.chmod(0o600)  # a user who keeps their weights private: an in-place write kept that
    write_atomically(last, b"new")
    assert last.stat().st_mode & 0o777 == 0o600


def test_a_link_at_the_checkpoint_is_replaced_never_written_through(tmp_path):
    target = tmp_path / "elsewhere.pt"
    target.write_bytes(b"not yours")
    (tmp_path / "last.pt").symlink_to(target)
    write_atomically(tmp_path / "last.pt", b"ckpt")
    assert target.read_bytes() == b"not yours" and not (tmp_path / "last.pt").is_symlink()


def test_the_trainers_checkpoint_paths_write_atomically_epoch_files_too(tmp_path):
    from yolofeed.ultralytics_seam import write_checkpoints_as

    wdir = tmp_path / "weights"
    trainer = SimpleNamespace(wdir=wdir, last=wdir / "last.pt", best=wdir / "best.pt")
    write_checkpoints_as(trainer, AtomicPath)
    write_checkpoints_as(trainer, AtomicPath)  # every save calls it: the paths stay as they are
    assert all(type(p) is AtomicPath for p in (trainer.wdir, trainer.last, trainer.best, trainer.wdir / "epoch3.pt"))
    assert trainer.last == wdir / "last.pt"  # the same path for every reader
    with pytest.raises(Exception, match=r"trainer\.best"):
        write_checkpoints_as(SimpleNamespace(wdir=wdir, last=wdir / "last.pt"), AtomicPath)


def test_only_a_dead_writers_temporary_checkpoints_are_swept(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(done.stdout)  # a process that has ended (its PID is free, or reused by something alive: then kept)
    files = {f".last.pt.tmp-{dead}-0123abcd": b"", f".best.pt.tmp-{dead}-89abcdef": checkpoints.ZIP + b"rest",
             f".last.pt.tmp-{dead}-00000000": b"the user's own bytes", f".last.pt.tmp-{os.getppid()}-11111111": b"",
             f".last.pt.tmp-{os.getpid()}-22222222": b""}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / f".epoch1.pt.tmp-{dead}-33333333").symlink_to(tmp_path / f".last.pt.tmp-{dead}-00000000")
    removed = sweep(tmp_path)
    if checkpoints._alive(dead):
        pytest.skip(f"PID {dead} was reused at once")
    assert sorted(p.name for p in removed) == sorted(list(files)[:2])
    assert (tmp_path / f".last.pt.tmp-{dead}-00000000").read_bytes() == b"the user's own bytes"
    assert len(_temps(tmp_path)) == 4  # the user's file, the link, a live writer's and our own


def _fake_checkpoint(path: Path, epoch: int, optimizer: bool = True) -> Path:
    torch.save({"epoch": epoch, "optimizer": {"state": {}} if optimizer else None, "ema": None, "model": None}, path)
    return path


def test_resuming_a_damaged_last_pt_names_the_newest_checkpoint_that_loads(tmp_path, capsys):
    weights = tmp_path / "run" / "weights"
    weights.mkdir(parents=True)
    last = _fake_checkpoint(weights / "last.pt", 7)
    last.write_bytes(last.read_bytes()[:40])  # what an in-place write killed half-way left
    _fake_checkpoint(weights / "best.pt", 2)
    _fake_checkpoint(weights / "epoch4.pt", 4)
    (weights / "epoch6.pt").write_bytes(b"")  # killed too: the newest epoch file that loads is epoch 4's
    _fake_checkpoint(weights / "epoch5.pt", -1, optimizer=False)  # stripped: a finished run's, cannot resume
    assert main(["train", f"resume={last}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"resume={last}: damaged: truncated" in err[0], err
    command = err[0].split("continue from it with: ")[1]
    assert "(saved after epoch 5)" in err[0] and shlex.split(command) == ["yolofeed", "train",
                                                                         f"resume={weights / 'epoch4.pt'}"]
    for p in weights.glob("epoch*.pt"):
        p.unlink()
    assert main(["train", f"resume={last}"]) == 1
    assert f"resume={weights / 'best.pt'}" in capsys.readouterr().err
    (weights / "best.pt").unlink()
    assert main(["train", f"resume={last}"]) == 1
    assert f"no other checkpoint in {weights} loads" in capsys.readouterr().err


def _loads(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["epoch"]


def _kill_during_a_checkpoint_write(cmd: list[str], weights: Path, env: dict) -> tuple[int, str]:
    """Start ``cmd`` (a training), wait until a checkpoint exists there (the one before), then SIGKILL the training
    process alone while it writes the next one. Returns the epoch last.pt held before the kill, and what showed the
    write in progress."""
    last = weights / "last.pt"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t0 = time.monotonic()
        before = None
        while before is None and time.monotonic() - t0 < 300 and proc.poll() is None:
            try:
                before, size = _loads(last), last.stat().st_size
            except Exception:  # not there yet, or being written
                time.sleep(0.05)
        assert before is not None, "no checkpoint to keep was ever written"
        seen = ""
        while not seen and time.monotonic() - t0 < 300 and proc.poll() is None:  # poll as fast as we can
            with os.scandir(weights) as entries:
                if any(checkpoints.TEMP.fullmatch(e.name) for e in entries):
                    seen = "a temporary checkpoint being written"
            try:
                if last.stat().st_size < size:
                    seen = "last.pt shorter than the checkpoint before (written in place)"
            except FileNotFoundError:
                seen = "last.pt gone"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert seen, f"the training ended (rc {proc.returncode}) before a write could be caught"
        return before, seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_killing_the_trainer_during_checkpoint_writes_never_loses_the_checkpoint_before(synth_root, tmp_path):
    """SIGKILL to the training process alone, three times, each while it writes a checkpoint (the test watches the
    weights folder and kills at the first sign of a write); each time the last.pt before still loads, and the run
    resumes from it and finishes. Ultralytics' in-place write left last.pt truncated here."""
    env = os.environ | {"YOLO_OFFLINE": "1"}
    weights = tmp_path / "killed" / "weights"
    start = [sys.executable, "-m", "yolofeed", "train", "model=yolo11n.yaml", f"data={synth_root / 'data.yaml'}",
             "epochs=3", "imgsz=64", "batch=8", "device=cpu", "workers=0", "plots=False", f"project={tmp_path}",
             "name=killed", "exist_ok=True"]
    resume = [sys.executable, "-m", "yolofeed", "train", f"resume={weights / 'last.pt'}"]
    for cycle in range(3):
        before, seen = _kill_during_a_checkpoint_write(start if cycle == 0 else resume, weights, env)
        after = _loads(weights / "last.pt")  # a truncated file raises here
        assert after >= before, (cycle, seen)
        if (weights / "best.pt").exists():
            _loads(weights / "best.pt")
    # the run finished by the command line's main in this process (a resume in a fresh one: test_train.py's
    # test_cli_resumes_a_killed_run); the killed writers' leftovers are what this checks
    assert main(["train", f"resume={weights / 'last.pt'}"]) == 0
    assert torch.load(weights / "best.pt", map_location="cpu", weights_only=False)["epoch"] == -1  # stripped: done
    assert _temps(weights) == []  # the killed writers' temporary files were swept by the next saves


def _saved_last(tmp_path: Path) -> tuple[Path, bytes]:
    """A run's weights folder holding an untrained yolo11n's last.pt, and its bytes."""
    from ultralytics import YOLO

    weights = tmp_path / "weights"
    weights.mkdir()
    YOLO("yolo11n.yaml").save(weights / "last.pt")
    return weights, (weights / "last.pt").read_bytes()


def _finishing(weights: Path) -> SimpleNamespace:
    """What ``final_eval`` reads of a trainer whose run folder's weights are ``weights`` (no plots)."""
    return SimpleNamespace(wdir=AtomicPath(weights), last=AtomicPath(weights / "last.pt"),
                           best=AtomicPath(weights / "best.pt"), args=SimpleNamespace(plots=False))


def test_the_final_strip_stopped_half_way_leaves_last_and_best_whole(tmp_path, monkeypatch):
    """At the end Ultralytics rewrites last.pt and best.pt in place without their optimizer (``strip_optimizer``); a
    kill there truncated the run's best weights. Here a save that writes half its file, then stops."""
    from yolofeed import FastDetectionTrainer

    weights, whole = _saved_last(tmp_path)
    real = torch.save

    def half(obj, f, *a, **k):
        real(obj, f, *a, **k)
        Path(f).write_bytes(Path(f).read_bytes()[:1000])
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", half)
    trainer = _finishing(weights)
    with pytest.raises(KeyboardInterrupt):
        FastDetectionTrainer.final_eval(trainer)
    assert (weights / "last.pt").read_bytes() == whole and _temps(weights) == []
    monkeypatch.undo()
    FastDetectionTrainer.final_eval(trainer)  # no best.pt: nothing validated
    stripped = torch.load(weights / "last.pt", map_location="cpu", weights_only=False)
    assert stripped["optimizer"] is None and stripped["epoch"] == -1 and _temps(weights) == []


@pytest.mark.parametrize("fault", ["torch's writer", "ENOSPC", "another RuntimeError"])
def test_a_final_strip_without_room_beside_strips_in_place_as_stock_and_the_run_goes_on(tmp_path, monkeypatch,
                                                                                          caplog, fault):
    """The strip writes a new file beside last.pt, where stock's rewrites it in place and so frees the optimizer's
    room: on a disk without room for the copy stock's run finished (its figures written in the room freed) and this
    one stopped, first with torch's C++ traceback, then, the checkpoint left whole, at the final validation's first
    figure. Now last.pt is stripped in place as stock strips it, one line says so, and the final steps go on; an error
    the disk does not explain is still raised, the checkpoint whole."""
    from yolofeed import FastDetectionTrainer

    weights, whole = _saved_last(tmp_path)
    real, real_statvfs = torch.save, os.statvfs

    def full(obj, f, *a, **k):  # no room for a new file; the file itself is rewritten (its own room)
        if not Path(f).name.startswith("."):
            return real(obj, f, *a, **k)
        real(obj, f, *a, **k)
        Path(f).write_bytes(Path(f).read_bytes()[:1000])
        if fault == "ENOSPC":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4223744 vs 4223640\nframe #0")

    def statvfs(path):  # a disk with 1,000 bytes left, or with plenty
        room = real_statvfs(path)
        left = 1000 if fault != "another RuntimeError" else 10**12
        return SimpleNamespace(f_bavail=left // room.f_frsize, f_frsize=room.f_frsize)

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(os, "statvfs", statvfs)
    trainer = _finishing(weights)
    if fault == "another RuntimeError":
        with pytest.raises(RuntimeError, match="unexpected pos"):
            FastDetectionTrainer.final_eval(trainer)
        assert (weights / "last.pt").read_bytes() == whole and _temps(weights) == []
        return
    with caplog.at_level("WARNING"):
        FastDetectionTrainer.final_eval(trainer)  # no best.pt: nothing validated, and no exception
    said = [r.getMessage() for r in caplog.records if "stripped in place" in r.getMessage()]
    assert len(said) == 1 and "the disk is full" in said[0] and str(weights / "last.pt") in said[0], said
    assert "\n" not in said[0]
    stripped = torch.load(weights / "last.pt", map_location="cpu", weights_only=False)
    assert stripped["optimizer"] is None and stripped["epoch"] == -1 and _temps(weights) == []


def test_a_strip_in_place_that_fails_too_writes_the_checkpoint_back(tmp_path, monkeypatch, caplog):
    """No room beside last.pt, and the in-place write fails half way as well (a disk filled meanwhile): the bytes held
    are written back, and one line says the file is left whole."""
    from yolofeed import FastDetectionTrainer

    weights, whole = _saved_last(tmp_path)
    real = torch.save

    def full(obj, f, *a, **k):
        real(obj, f, *a, **k)
        Path(f).write_bytes(Path(f).read_bytes()[:1000])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    trainer = _finishing(weights)
    with caplog.at_level("WARNING"):
        FastDetectionTrainer.final_eval(trainer)
    said = [r.getMessage() for r in caplog.records if "could not strip" in r.getMessage()]
    assert len(said) == 1 and "left whole" in said[0] and str(weights / "last.pt") in said[0], said
    assert (weights / "last.pt").read_bytes() == whole and _temps(weights) == []


def test_a_ctrl_c_in_a_strip_in_place_writes_the_checkpoint_back_and_stops(tmp_path, monkeypatch):
    """The in-place write truncates the file first: a Ctrl-C in it (no room beside, so in place) would leave last.pt
    cut short, where its bytes are held. They are written back, and the interruption goes on."""
    from yolofeed import FastDetectionTrainer

    weights, whole = _saved_last(tmp_path)
    real = torch.save

    def interrupted(obj, f, *a, **k):
        if Path(f).name.startswith("."):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(obj, f, *a, **k)
        Path(f).write_bytes(Path(f).read_bytes()[:1000])
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    trainer = _finishing(weights)
    with pytest.raises(KeyboardInterrupt):
        FastDetectionTrainer.final_eval(trainer)
    assert (weights / "last.pt").read_bytes() == whole and _temps(weights) == []


def test_a_strip_without_room_never_writes_through_a_link_planted_at_the_checkpoint(tmp_path, monkeypatch):
    from yolofeed import FastDetectionTrainer

    weights, whole = _saved_last(tmp_path)
    outside = tmp_path / "outside.pt"
    (weights / "last.pt").rename(outside)
    (weights / "last.pt").symlink_to(outside)
    real = torch.save

    def full(obj, f, *a, **k):
        if not Path(f).name.startswith("."):
            return real(obj, f, *a, **k)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    trainer = _finishing(weights)
    FastDetectionTrainer.final_eval(trainer)
    assert outside.read_bytes() == whole and (weights / "last.pt").is_symlink()


# -- results.csv on resume: the rows of epochs trained again ----------------------------------------------------------
def test_trim_results_drops_the_rows_after_an_epoch_and_keeps_every_other_byte(tmp_path):
    csv = tmp_path / "results.csv"
    head = b"epoch,time,train/box_loss,metrics/mAP50(B)\n"
    rows = [b"1,3.1,1.5,0.1\n", b"2,6.2,1.4,nan\n", b"3,9.3,1.3,0.3\n", b"4,12.4,1.2,0.4"]  # the last without "\n"
    csv.write_bytes(head + b"".join(rows))
    assert checkpoints.trim_results(csv, 4) == [] and csv.read_bytes() == head + b"".join(rows)
    assert checkpoints.trim_results(csv, 2) == [3, 4]
    assert csv.read_bytes() == head + rows[0] + rows[1]
    assert checkpoints.trim_results(csv, 0) == [1, 2] and csv.read_bytes() == head
    assert checkpoints.trim_results(tmp_path / "none.csv", 1) == [] and not (tmp_path / "none.csv").exists()
    # a row is a whole number first: every other line stays (float("inf") once made the resume an OverflowError)
    odd = b"not a row\ninf,1\n1e999,1\n2.7,1\n1_0,1\n-3,1\n\n"
    csv.write_bytes(head + b"1,1,1,1\n" + odd + b"2,2,2,2\n")
    assert checkpoints.trim_results(csv, 1) == [2] and csv.read_bytes() == head + b"1,1,1,1\n" + odd


def _stopped_between_row_and_checkpoint(synth_root, tmp_path) -> Path:
    """A 3-epoch run stopped after epoch 2's results.csv row, before its last.pt; returns the run folder."""
    import csv

    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    class StopInSecondSave(FastDetectionTrainer):
        def save_model(self):
            if self.epoch == 1:
                raise KeyboardInterrupt  # epoch 2's row is written, its last.pt not
            return super().save_model()

    args = dict(data=str(synth_root / "data.yaml"), imgsz=64, batch=8, workers=0, plots=False, verbose=False,
                device="cpu", seed=0, epochs=3, project=str(tmp_path), name="stopped", exist_ok=True)
    with pytest.raises(KeyboardInterrupt):
        YOLO("yolo11n.yaml").train(trainer=StopInSecondSave, **args)
    run = tmp_path / "stopped"
    with open(run / "results.csv") as f:
        assert [r[0].strip() for r in list(csv.reader(f))[1:]] == ["1", "2"]
    assert torch.load(run / "weights" / "last.pt", weights_only=False)["epoch"] == 0
    return run


@pytest.mark.slow
def test_a_resume_that_cannot_rewrite_results_csv_says_so_and_goes_on(synth_root, tmp_path, caplog, monkeypatch):
    """A run folder this user cannot write (a full disk, a read-only mount): stock resumes, appending; so does this,
    saying the rows it could not drop. Was: the resume refused, with "train with project=" (no use to a resume)."""
    import csv
    import logging

    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    run = _stopped_between_row_and_checkpoint(synth_root, tmp_path)

    real = checkpoints.write_run_file

    def refused(path, data):  # results.csv only: the run's other files (yolofeed.yaml, last.pt) are written
        if Path(path).name == "results.csv":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, data)

    monkeypatch.setattr(checkpoints, "write_run_file", refused)
    caplog.set_level(logging.WARNING)
    YOLO(str(run / "weights" / "last.pt")).train(resume=True, trainer=FastDetectionTrainer)
    with open(run / "results.csv") as f:
        assert [r[0].strip() for r in list(csv.reader(f))[1:]] == ["1", "2", "2", "3"]  # as stock writes them
    assert (f"could not drop the rows of epochs after 1 from {run / 'results.csv'} (Permission denied); the run "
            "resumes, and those epochs' rows will be there twice") in caplog.text


@pytest.mark.slow
def test_a_run_stopped_between_an_epochs_row_and_its_checkpoint_resumes_without_a_second_row(synth_root, tmp_path,
                                                                                              caplog):
    """Ultralytics appends an epoch's results.csv row, then saves its last.pt. Stopped between the two, the resumed
    run trains that epoch again: stock then writes its row twice (1, 2, 2, 3); here once (1, 2, 3)."""
    import csv
    import logging

    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    run = _stopped_between_row_and_checkpoint(synth_root, tmp_path)
    caplog.set_level(logging.INFO)
    YOLO(str(run / "weights" / "last.pt")).train(resume=True, trainer=FastDetectionTrainer)
    with open(run / "results.csv") as f:
        assert [r[0].strip() for r in list(csv.reader(f))[1:]] == ["1", "2", "3"]
    assert f"dropped epoch 2 from {run / 'results.csv'}" in caplog.text


def test_a_training_is_refused_a_run_folder_another_live_process_trains_into(tmp_path):
    """A resume of a run still training (or exist_ok=True into it) interleaved the two runs' results.csv rows and
    overwrote each other's weights: the second is refused with the folder, the holder and the fix, and once the
    first process is gone (killed: the kernel drops its lock) the folder is free again."""
    from types import SimpleNamespace

    from yolofeed.errors import ConfigError
    from yolofeed.train.trainer import FastTrainer

    folder = tmp_path / "runs" / "live"
    folder.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from yolofeed.pack.lock import FolderLock; "
                               f"l = FolderLock({str(folder)!r}); assert l.try_acquire(); print('held', flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"another training writes into the run folder {re.escape(str(folder))} "
                                              rf"\(PID {holder.pid} on this host.*train into another folder"):
            FastTrainer.hold_run_folder(SimpleNamespace(save_dir=folder))
    finally:
        holder.kill()
        holder.wait()
    lock = FastTrainer.hold_run_folder(SimpleNamespace(save_dir=folder))
    try:
        assert lock is not None
    finally:
        lock.release()


def _flip(path: Path, entry_part: str) -> str:
    """Flip a byte inside the stored data of the archive entry whose name ends with ``entry_part``; its name."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(entry_part) and i.file_size > 8)
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)  # the local header, then data
    data[start + info.compress_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return info.filename


def test_a_checkpoint_with_flipped_bytes_is_refused_naming_the_entry_and_the_way_on(tmp_path, capsys):
    """torch.load does not check the archive's CRCs: a last.pt with flipped bytes resumed with damaged weights and
    optimizer state (found by a hostile pass). Now it is refused in one line naming the entry, and the run's
    checkpoint to go on from skips a damaged one too."""
    from yolofeed.errors import ConfigError
    from yolofeed.train.checkpoints import check_intact, damage

    weights = tmp_path / "run" / "weights"
    weights.mkdir(parents=True)
    last = weights / "last.pt"
    torch.save({"epoch": 7, "optimizer": {"state": {0: torch.arange(4096.0)}}, "ema": None, "model": None}, last)
    assert damage(last) is None
    check_intact(last)  # intact: no error
    entry = _flip(last, "data/0")
    assert damage(last).startswith(f"its entry {entry} fails the checksum")
    assert torch.load(last, map_location="cpu", weights_only=False)["epoch"] == 7  # torch.load reads it anyway
    best = _fake_checkpoint(weights / "best.pt", 2)
    _fake_checkpoint(weights / "epoch4.pt", 4)
    _flip(weights / "epoch4.pt", "data.pkl")  # the newest epoch file is damaged too: best.pt is the way on
    said = rf"resume={re.escape(str(last))}: damaged: its entry {re.escape(entry)} fails the checksum"
    with pytest.raises(ConfigError, match=said + r".*continue from it with: yolofeed train resume=.*best.pt"):
        check_intact(last)
    assert main(["train", f"resume={last}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "damaged: its entry" in err[0] and f"resume={best}" in err[0], err
    assert damage(tmp_path / "absent.pt") is None and damage(best) is None
    (tmp_path / "legacy.pt").write_bytes(b"\x80\x02not a zip")  # torch's legacy format: torch.load's to judge
    assert damage(tmp_path / "legacy.pt") is None


def test_a_truncated_checkpoint_is_refused_before_ultralytics_reads_it(tmp_path, capsys, monkeypatch):
    """Ultralytics' refusal of a truncated .pt first looks its name up on GitHub (offline: warnings, a wait); the
    check names the truncation first, in the CLI and in the Python API's ``resume=path``."""
    from yolofeed.errors import ConfigError
    from yolofeed.train import trainer as trainer_module
    from yolofeed.train.checkpoints import check_intact, damage

    weights = tmp_path / "run" / "weights"
    weights.mkdir(parents=True)
    last = weights / "last.pt"
    torch.save({"epoch": 7, "optimizer": {"state": {0: torch.arange(4096.0)}}, "ema": None, "model": None}, last)
    whole = last.read_bytes()
    best = _fake_checkpoint(weights / "best.pt", 2)
    for cut in (len(whole) // 2, len(whole) - 10, 8):
        last.write_bytes(whole[:cut])
        assert damage(last).startswith("truncated"), cut
        with pytest.raises(ConfigError, match=rf"resume={re.escape(str(last))}: damaged: truncated.*resume={best}"):
            check_intact(last)
    assert damage(best) is None
    monkeypatch.setattr(trainer_module.DetectionTrainer, "check_resume",
                        lambda *_: pytest.fail("Ultralytics read the truncated checkpoint first"))
    stub = trainer_module.FastDetectionTrainer.__new__(trainer_module.FastDetectionTrainer)
    stub.args = SimpleNamespace(resume=str(last))
    with pytest.raises(ConfigError, match="damaged: truncated"):
        stub.check_resume({})
    assert main(["train", f"resume={last}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "damaged: truncated" in err[0] and f"resume={best}" in err[0], err
    best.unlink()  # none to go on from: nothing is looked up for the missing best.pt either
    monkeypatch.setattr("ultralytics.utils.downloads.get_github_assets",
                        lambda *_, **__: pytest.fail("a missing checkpoint was looked up on GitHub"))
    assert main(["train", f"resume={last}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "damaged: truncated" in err[0] and "no other checkpoint" in err[0], err


@pytest.mark.slow
def test_the_python_api_refuses_to_resume_a_checkpoint_with_flipped_bytes(synth_root, tmp_path):
    """``YOLO(last.pt)`` reads the checkpoint without checking its CRCs; the trainer's resume check refuses it before
    anything is built or written."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer
    from yolofeed.errors import ConfigError

    run = _stopped_between_row_and_checkpoint(synth_root, tmp_path)
    last = run / "weights" / "last.pt"
    entry = _flip(last, "data/0")
    rows = (run / "results.csv").read_bytes()
    with pytest.raises(ConfigError, match=rf"resume={re.escape(str(last))}: damaged: its entry {re.escape(entry)}"):
        YOLO(str(last)).train(resume=True, trainer=FastDetectionTrainer)
    assert (run / "results.csv").read_bytes() == rows


def test_a_killed_trainings_file_lock_does_not_block_the_next(tmp_path, monkeypatch):
    """Where record locks are refused (Windows, NFS without locking) the lock is a file its holder leaves behind
    when killed: the next training into the folder takes it over from the dead holder instead of being refused."""
    import socket
    from types import SimpleNamespace

    from yolofeed.pack import lock as lock_module
    from yolofeed.train.trainer import FastTrainer

    monkeypatch.setattr(lock_module, "fcntl", None)
    folder = tmp_path / "runs" / "killed"
    folder.mkdir(parents=True)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = lock_module.Holder(gone.pid, socket.gethostname(), 0.0, time.time(), "yolofeed train name=killed")
    (folder / lock_module.OWNER_NAME).write_text(dead.dumps())
    lock = FastTrainer.hold_run_folder(SimpleNamespace(save_dir=folder))
    try:
        assert lock is not None and lock.mechanism == "file" and lock.holder().pid == os.getpid()
    finally:
        lock.release()
    alive = lock_module.Holder(os.getppid(), socket.gethostname(), lock_module.process_start(os.getppid()) or 0.0,
                               time.time(), "yolofeed train name=killed")
    (folder / lock_module.OWNER_NAME).write_text(alive.dumps())  # a live holder is not taken over
    from yolofeed.errors import ConfigError

    with pytest.raises(ConfigError, match="another training writes into the run folder"):
        FastTrainer.hold_run_folder(SimpleNamespace(save_dir=folder))


def test_a_link_planted_at_the_run_folders_lock_is_refused_with_the_run_folders_fix(tmp_path):
    """A link at <run>/.lock is not written through; the line names the run folder's lock and its way out, not a
    pack's (it said "its build lock" and "pack_dir= (yolofeed train)", which moves no run folder)."""
    from types import SimpleNamespace

    from yolofeed.errors import PackError
    from yolofeed.train.trainer import FastTrainer

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PackError, match=r"keeps the lock of a run folder a training writes under that name.*"
                                        r"or train into another folder \(name=, project=\)$"):
        FastTrainer.hold_run_folder(SimpleNamespace(save_dir=folder))
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("name", ["args.yaml", "val_batch0_pred.jpg", "BoxPR_curve.png", "confusion_matrix.png"])
def test_a_link_planted_where_ultralytics_writes_in_the_run_folder_is_refused(dataset, tmp_path, capsys, name):
    """Ultralytics writes args.yaml and its plots in place: a link planted at one of those names in a run folder that
    is already there (exist_ok, a resume) would be written through, to a file outside the run. Refused in one line
    before anything is written; the target and the link stay as they were; a link at another name is left alone."""
    from yolofeed.cli import main
    from yolofeed.errors import ConfigError
    from yolofeed.train import FastDetectionTrainer

    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    target = tmp_path / "precious.txt"
    target.write_text("the user's own")
    (run / "notes.txt").symlink_to(target)  # not a name Ultralytics writes
    (run / name).symlink_to(target)
    said = (rf"the run folder {re.escape(str(run))} holds a symbolic link at {re.escape(name)} "
            rf"\(to {re.escape(str(target))}\)")
    args = {"data": str(dataset / "data.yaml"), "model": "yolo11n.yaml", "imgsz": 64, "epochs": 1, "device": "cpu",
            "project": str(tmp_path / "runs"), "name": "r", "exist_ok": True}
    with pytest.raises(ConfigError, match=said + ".*remove the link, or train into another folder"):
        FastDetectionTrainer(overrides=args)
    assert main(["train", *(f"{k}={v}" for k, v in args.items())]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(said, err[0]), err
    assert target.read_text() == "the user's own" and (run / name).is_symlink()
    assert sorted(p.name for p in run.iterdir()) == sorted(["notes.txt", name])


@pytest.mark.parametrize("plant", ["fifo results.csv", "folder results.csv", "file weights", "link weights",
                                   "loop weights"])
def test_a_fifo_or_a_file_where_ultralytics_writes_in_the_run_folder_is_refused(dataset, tmp_path, capsys, plant):
    """A FIFO at results.csv (a resume hung before training, silently), a file or a dangling link at weights (a
    FileExistsError traceback from Ultralytics' mkdir, under exist_ok=True): one line before anything is written,
    nothing removed (found by an adversarial tester)."""
    from yolofeed.cli import main

    kind, name = plant.split()
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    {"fifo": lambda p: os.mkfifo(p), "file": lambda p: p.write_text("hi"), "folder": lambda p: p.mkdir(),
     "link": lambda p: p.symlink_to(tmp_path / "gone"), "loop": lambda p: p.symlink_to(p)}[kind](run / name)
    args = [f"data={dataset / 'data.yaml'}", "model=yolo11n.yaml", "imgsz=64", "epochs=1", "device=cpu",
            f"project={tmp_path / 'runs'}", "name=r", "exist_ok=True"]
    assert main(["train", *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    what = {"fifo": "a FIFO (named pipe)", "file": "a regular file", "link": "a symbolic link to",
            "folder": "a folder", "loop": "a symbolic link to"}[kind]
    assert len(err) == 1 and f"the run folder {run} holds {what}" in err[0] and f"at {name}, where Ultralytics " \
        "writes" in err[0] and "train into another folder (name=, project=)" in err[0], err
    assert sorted(p.name for p in run.iterdir()) == [name]


def test_a_fifo_or_device_at_the_runs_options_is_one_line_not_a_hang(tmp_path):
    """``<run>/yolofeed.yaml`` as a FIFO hung every resume for ever (a read that waits for a writer); as a link to
    /dev/zero it filled the memory. Read back only where it is a regular file of bounded size."""
    from yolofeed.errors import ConfigError
    from yolofeed.train import options

    fifo = tmp_path / "yolofeed.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"yolofeed.yaml: not this run's yolofeed options \(it is a FIFO \(named "
                                          r"pipe\), not a file yolofeed writes\); delete it"):
        options.read(fifo)
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="a symbolic link to /dev/zero \\(a character device\\)"):
        options.read(zero)
    from yolofeed.train.checkpoints import trim_results

    assert trim_results(fifo, 1) == []  # results.csv read the same way: left as it is, not waited on


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.EPERM])
def test_a_final_strip_whose_rename_fails_leaves_the_checkpoint_whole_and_the_run_goes_on(tmp_path, monkeypatch,
                                                                                         caplog, code):
    """The folder made read-only (or immutable) between the stripped file's write and its rename over last.pt: the
    rename's failure is the write's, last.pt stays whole with its optimizer, one line says so, the run goes on."""
    from yolofeed import FastDetectionTrainer

    weights, whole = _saved_last(tmp_path)
    real = os.replace

    def refused(src, dst, *a, **k):
        if Path(dst).name == "last.pt":
            raise OSError(code, os.strerror(code))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", refused)
    trainer = _finishing(weights)
    with caplog.at_level("WARNING"):
        FastDetectionTrainer.final_eval(trainer)
    assert (weights / "last.pt").read_bytes() == whole
    assert "could not strip the optimizer from" in caplog.text and "left whole" in caplog.text
    assert sorted(p.name for p in weights.iterdir()) == ["last.pt"]  # the stripped copy removed
    # a folder that refuses the removal too (read-only for real, as root's tests cannot make it): the copy is named
    real_unlink = Path.unlink

    def kept(self, *a, **k):
        if self.parent == weights:
            raise OSError(code, os.strerror(code))
        return real_unlink(self, *a, **k)

    monkeypatch.setattr(Path, "unlink", kept)
    caplog.clear()
    with caplog.at_level("WARNING"):
        FastDetectionTrainer.final_eval(trainer)
    left = [p for p in weights.iterdir() if p.name != "last.pt"]
    assert len(left) == 1 and f"could not remove {left[0]}" in caplog.text and "may be deleted" in caplog.text

"""The checkpoints written in a thread beside the training (train/writes.py): in order, read whole, failures raised.

RELIABILITY.md lists these tests.
"""

from __future__ import annotations

import errno
import io
import threading
from pathlib import Path

import pytest
import torch

from yolofeed import atomic
from yolofeed.errors import WriteError
from yolofeed.train import checkpoints, writes
from yolofeed.train.writes import THREAD, Writes


def _full(path, data):
    """A write to a full disk, as ``write_run_file`` raises it (the file left as it was)."""
    raise atomic.write_failure(Path(path), OSError(errno.ENOSPC, "No space left on device"), checkpoints.RUN_FIXES)


def _full_at_the_second_last_pt(monkeypatch) -> None:
    """``WRITES``' second write of a last.pt fails, as to a full disk; the other writes are made."""
    lasts = []

    def write(path, data):
        if Path(path).name == "last.pt":
            lasts.append(path)
            if len(lasts) == 2:
                _full(path, data)
        return checkpoints.write_run_file(path, data)

    monkeypatch.setattr(writes.WRITES, "_write", write)


def _gated(monkeypatch) -> tuple[threading.Event, list[tuple[str, str]]]:
    """``WRITES``' writes held until the returned event is set; the (file, thread) of each write made, in order."""
    gate, made = threading.Event(), []

    def held(path, data):
        assert gate.wait(60)
        made.append((str(path), threading.current_thread().name))
        return checkpoints.write_run_file(path, data)

    monkeypatch.setattr(writes.WRITES, "_write", held)
    return gate, made


def test_queued_checkpoints_end_in_order_in_their_thread_and_a_read_through_the_path_waits(tmp_path, monkeypatch):
    """``write_bytes`` returns while its write is held; the writes run in the writer thread in the order queued; any
    read of the file through its path (``read_bytes``, ``open``, ``exists``, ``torch.load``) waits for them and sees the
    last bytes queued, whole."""
    gate, made = _gated(monkeypatch)
    last = writes.QueuedPath(tmp_path / "last.pt")
    assert last.write_bytes(b"epoch 1") == 7 and last.write_bytes(b"epoch 2") == 7
    assert not gate.is_set() and made == []  # both queued, neither written
    threading.Timer(0.2, gate.set).start()
    assert last.read_bytes() == b"epoch 2"
    assert [f for f, _ in made] == [str(last)] * 2 and all(t.startswith(THREAD) for _, t in made)
    best = writes.QueuedPath(tmp_path / "best.pt")
    buffer = io.BytesIO()
    torch.save({"epoch": 3}, buffer)
    best.write_bytes(buffer.getvalue())
    assert torch.load(best, weights_only=False) == {"epoch": 3}
    best.write_bytes(b"x")
    with open(best, "rb") as f:
        assert f.read() == b"x"
    assert writes.WRITES.wait(tmp_path) is None
    assert not [p for p in tmp_path.iterdir() if checkpoints.TEMP.fullmatch(p.name)]


def test_a_failed_write_is_handed_over_once_as_its_own_line_whatever_waits_for_it(tmp_path):
    """A write that fails (a full disk) is kept for its folder before its future completes: the wait that returns has
    it, raised as the write's own one-line error (naming the file and the fix), once; a read of the file meanwhile
    leaves it to be handed over; another folder's writes know nothing of it."""
    queue = Writes(write=_full)
    queue.write(tmp_path / "last.pt", b"epoch 2")
    with pytest.raises(WriteError, match=r"could not write .*last\.pt: the disk is full .*free some space"):
        queue.wait(tmp_path)
    assert queue.wait(tmp_path) is None  # handed over once
    queue.write(tmp_path / "last.pt", b"epoch 3")
    queue.write(tmp_path / "other" / "last.pt", b"epoch 3")
    queue.wait_file(tmp_path / "last.pt")
    queue.wait_file(tmp_path / "other" / "last.pt")
    error = queue.wait(tmp_path, raise_failure=False)
    assert isinstance(error, WriteError) and error.errno == errno.ENOSPC
    queue.raise_failure(tmp_path)  # nothing left: no exception
    with pytest.raises(WriteError):
        queue.raise_failure(tmp_path / "other")


def test_a_wait_for_slow_writes_is_said_once_and_goes_on_to_their_end(tmp_path):
    """A stop that waits for writes still held after ``SLOW_S`` says how many (a slow or hung disk: silence there
    looked like a hang); writes that end at once are not said."""
    gate, said = threading.Event(), []
    queue = Writes(write=lambda path, data: gate.wait(60) and checkpoints.write_run_file(path, data))
    queue.write(tmp_path / "last.pt", b"epoch 1")
    queue.write(tmp_path / "best.pt", b"epoch 1")
    threading.Timer(writes.SLOW_S + 0.5, gate.set).start()
    assert queue.wait(tmp_path, slow=said.append) is None
    assert said == [2] and (tmp_path / "best.pt").read_bytes() == b"epoch 1"
    queue.write(tmp_path / "last.pt", b"epoch 2")
    queue.wait(tmp_path, slow=said.append)
    assert said == [2] and (tmp_path / "last.pt").read_bytes() == b"epoch 2"


def _train(synth_root, tmp_path, name: str, epochs: int, callbacks: dict | None = None):
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    model = YOLO("yolo11n.yaml")
    for event, fn in (callbacks or {}).items():
        model.add_callback(event, fn)
    model.train(trainer=FastDetectionTrainer, data=str(synth_root / "data.yaml"), imgsz=64, batch=8, workers=0,
                plots=False, verbose=False, device="cpu", seed=0, epochs=epochs, project=str(tmp_path), name=name,
                exist_ok=True)


@pytest.mark.parametrize(("event", "expected"), [("on_model_save", [(0, 0), (1, 1)]),
                                               ("on_train_epoch_start", [(0, None), (1, 0)])])
def test_a_callback_reading_last_pt_by_its_name_finds_the_epoch_saved_before_it(synth_root, tmp_path, monkeypatch,
                                                                                event, expected):
    """A callback reading last.pt by its name (a logger's upload as an epoch ends; a user's as the next starts) finds
    the checkpoint of the epoch saved before it, though each write is held a while in the writer thread (a slow disk):
    where any callback of the user's is, ``save_model`` waits for its writes (found by the adversarial tester: a
    reader at ``on_train_epoch_start`` found no file, then the epoch before's)."""
    made = []

    def slow(path, data):
        threading.Event().wait(0.3)
        made.append((str(path), threading.current_thread().name))
        return checkpoints.write_run_file(path, data)

    monkeypatch.setattr(writes.WRITES, "_write", slow)
    seen = []

    def read(trainer):
        last = str(trainer.last)
        seen.append((trainer.epoch, torch.load(last, weights_only=False)["epoch"] if Path(last).exists() else None))

    _train(synth_root, tmp_path, "read", 2, {event: read})
    assert seen == expected
    assert made and all(t.startswith(THREAD) for _, t in made)


def test_a_write_failing_beside_the_training_stops_it_at_the_next_batch_with_its_line(synth_root, tmp_path,
                                                                                     monkeypatch, caplog):
    """Epoch 2's last.pt cannot be written (the disk is full) beside epoch 3's training: the run stops at the end of
    one of epoch 3's batches, before its last, with the write's own line, and the resume line names last.pt, whole,
    of epoch 1."""
    import logging

    batches = []

    def count(trainer):
        batches.append(trainer.epoch)

    count.__module__ = "yolofeed.monitor"  # counted as yolofeed's own (as the monitor's): a user's would make
    _full_at_the_second_last_pt(monkeypatch)  # save_model wait for its writes, and fail there
    caplog.set_level(logging.INFO)
    with pytest.raises(WriteError, match=r"could not write .*last\.pt: the disk is full .*free some space"):
        _train(synth_root, tmp_path, "full", 3, {"on_train_batch_end": count})
    last = tmp_path / "full" / "weights" / "last.pt"
    assert torch.load(last, weights_only=False)["epoch"] == 0
    assert batches.count(0) == 3 and 1 <= batches.count(2) < 3  # 24 images, batch 8: stopped inside epoch 3
    assert f"The last epoch saved is in {last}" in caplog.text and "training stopped in epoch 3" in caplog.text


def test_the_last_epochs_failed_write_is_raised_before_the_final_validation(synth_root, tmp_path, monkeypatch):
    """The last epoch's last.pt cannot be written: the final validation's wait raises it, and last.pt is the epoch
    before's, whole (never stripped as if the run had finished)."""
    _full_at_the_second_last_pt(monkeypatch)  # 2 epochs: the last one's
    with pytest.raises(WriteError, match=r"last\.pt: the disk is full"):
        _train(synth_root, tmp_path, "end", 2)
    ckpt = torch.load(tmp_path / "end" / "weights" / "last.pt", weights_only=False)
    assert ckpt["epoch"] == 0 and ckpt["optimizer"] is not None  # epoch 1's, not stripped


def test_the_cli_says_a_failed_writes_stop_once_as_its_error_line_with_the_resume(synth_root, tmp_path, monkeypatch,
                                                                                  capsys, caplog):
    """``yolofeed train`` stopped by a failed write: one line on stderr says what failed, where it stopped and the
    command that resumes it; the training's own log line (the Python API's) does not say it again."""
    import logging

    from yolofeed.cli import main

    _full_at_the_second_last_pt(monkeypatch)
    caplog.set_level(logging.INFO)
    assert main(["train", "model=yolo11n.yaml", f"data={synth_root / 'data.yaml'}", "imgsz=64", "batch=8",
                 "workers=0", "plots=False", "device=cpu", "epochs=2", f"project={tmp_path}", "name=cli"]) == 1
    err = capsys.readouterr().err
    last = tmp_path / "cli" / "weights" / "last.pt"
    lines = [x for x in err.splitlines() if "could not write" in x]
    assert len(lines) == 1 and lines[0].startswith("yolofeed train: error: training stopped"), err
    assert "the disk is full" in lines[0] and f"continue with: yolofeed train resume={last}" in lines[0]
    assert "Epoch" in caplog.text or "epochs" in caplog.text, "the log is captured"
    assert "training stopped" not in caplog.text and "could not write" not in caplog.text

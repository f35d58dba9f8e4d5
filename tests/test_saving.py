"""Checkpoints saved beside the next epoch (train/saving.py): the file stock's save writes, with the values of the
epoch it saves, whatever the training does meanwhile; waited for wherever the file may be read; a failure raised."""

from __future__ import annotations

import inspect
import re
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ultralytics.engine.trainer import BaseTrainer
from ultralytics.utils.callbacks.base import default_callbacks

from yolofeed import ultralytics_seam as seam
from yolofeed.errors import WriteError
from yolofeed.train import saving
from yolofeed.train.checkpoints import AtomicPath


class _Stock:
    """What of Ultralytics' trainer the mixin calls: its save_model, callbacks, validate and capture wait."""

    save_model = BaseTrainer.save_model
    read_results_csv = BaseTrainer.read_results_csv

    def run_callbacks(self, event: str) -> None:
        for fn in self.callbacks.get(event, []):
            fn(self)

    def validate(self):
        return self.metrics, self.fitness

    def _settle_overlapped(self) -> None:
        pass


class _Trainer(saving.SavesBeside, _Stock):
    """A trainer at an epoch's end, as save_model reads it: yolo11n (2 classes), its EMA, AdamW after one step."""

    save_beside = True

    def __init__(self, folder: Path, device: str = "cpu"):
        from ultralytics.nn.tasks import DetectionModel
        from ultralytics.utils.torch_utils import ModelEMA

        torch.manual_seed(0)
        self.device = torch.device(device)
        self.model = DetectionModel("yolo11n.yaml", nc=2, verbose=False).to(self.device)
        self.ema = ModelEMA(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        for p in self.model.parameters():
            p.grad = torch.randn_like(p)
        self.optimizer.step()
        self.ema.update(self.model)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=False)
        self.args = SimpleNamespace(epochs=3, save=True, name="t")
        self.epoch, self.best_fitness, self.fitness = 1, 0.5, 0.5
        self.metrics = {"metrics/mAP50(B)": 0.5}
        self.stopper = SimpleNamespace(best_fitness=0.5, best_epoch=1)
        weights = folder / "weights"
        self.wdir, self.last, self.best = AtomicPath(weights), AtomicPath(weights / "last.pt"), AtomicPath(
            weights / "best.pt")
        self.save_period = -1
        self.csv = folder / "results.csv"
        folder.mkdir(parents=True, exist_ok=True)
        self.csv.write_text("epoch,metrics/mAP50(B)\n1,0.4\n2,0.5\n")
        self.callbacks: dict[str, list] = {"on_model_save": []}

    def live_tensors(self) -> list[torch.Tensor]:
        """What the next epoch changes: the EMA's and the model's values, the optimiser's state."""
        state = [t for s in self.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        return [t for t in (*self.ema.ema.state_dict().values(), *self.model.parameters(), *state)
                if t.is_floating_point()]


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def _same(a, b) -> bool:
    """Equal values, tensors bit for bit (the checkpoint's date and the modules' identity aside)."""
    if isinstance(a, torch.nn.Module):
        return type(a) is type(b) and _same(a.state_dict(), b.state_dict())
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _same_checkpoint(a: Path, b: Path) -> bool:
    x, y = _load(a), _load(b)
    return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x if k != "date")


@pytest.fixture
def held(monkeypatch):
    """The save thread held before it saves, until ``held.set()``."""
    gate = threading.Event()
    real = saving._save

    def after_gate(*args):
        assert gate.wait(30)
        real(*args)

    monkeypatch.setattr(saving, "_save", after_gate)
    yield gate
    gate.set()


def test_save_model_reads_only_what_the_view_holds():
    """The view refuses any other name (so a release that read more would fail loudly, not read the moving
    trainer): the installed release's save_model reads only ``SAVE_READS``."""
    source = inspect.getsource(BaseTrainer.save_model)
    assert set(re.findall(r"self\.(\w+)", source)) <= set(seam.SAVE_READS)


def _device_cases():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", _device_cases())
def test_a_checkpoint_saved_beside_is_stocks_with_the_epochs_values_whatever_the_next_epoch_does(tmp_path, held,
                                                                                                   device):
    """The save runs while the next epoch changes the EMA, the model and the optimiser's state: the file holds
    what stock's save, made at the epoch's end, writes."""
    trainer = _Trainer(tmp_path / "beside", device)
    stock = _Trainer(tmp_path / "stock", device)
    _Stock.save_model(stock)
    assert trainer.save_model() is True and trainer._saving is not None  # queued, held
    assert not trainer.last.exists()
    with torch.no_grad():  # the next epoch, on the training thread's stream
        torch._foreach_add_(trainer.live_tensors(), 1.0)
    trainer.epoch, trainer.best_fitness, trainer.fitness = 2, 0.7, 0.7  # and its end: its row, its metrics
    trainer.metrics["metrics/mAP50(B)"] = 0.7
    trainer.stopper.best_fitness, trainer.stopper.best_epoch = 0.7, 2
    trainer.args.epochs = 9  # time= recounts the epochs
    trainer.ema.updates += 10
    with trainer.csv.open("a") as f:
        f.write("3,0.7\n")
    held.set()
    trainer.wait_for_saves()
    for name in ("last.pt", "best.pt"):
        assert _same_checkpoint(tmp_path / "beside" / "weights" / name, tmp_path / "stock" / "weights" / name)
    trainer._close_saves(finished=True)


def test_an_epoch_ended_late_hands_over_its_snapshots_copies_and_nothing_is_copied_again(tmp_path, monkeypatch):
    """With val_overlap the epoch's EMA and state dicts are already copies of their own (the snapshot): the save
    takes them as they are."""
    trainer = _Trainer(tmp_path)
    seen = {}
    real = saving.save_view

    def recording(trainer_, model, updates, optimizer_state, scaler_state):
        seen.update(model=model, optimizer=optimizer_state)
        return real(trainer_, model, updates, optimizer_state, scaler_state)

    monkeypatch.setattr(saving, "save_view", recording)
    snapshot_state = trainer.optimizer.state_dict()
    trainer._ending_snapshot = SimpleNamespace(model=trainer.ema.ema)
    monkeypatch.setattr(trainer.optimizer, "state_dict", lambda: snapshot_state)  # as beside._epoch_state sets it
    trainer.save_model()
    trainer.wait_for_saves()
    assert seen["model"] is trainer.ema.ema and seen["optimizer"] is snapshot_state
    trainer._ending_snapshot = None
    trainer.save_model()
    trainer.wait_for_saves()
    assert seen["model"] is not trainer.ema.ema and seen["optimizer"] is not snapshot_state
    trainer._close_saves(finished=True)


def test_a_failed_save_beside_is_raised_in_the_training_thread_its_previous_checkpoint_whole(tmp_path, monkeypatch,
                                                                                             held):
    """A save that fails (the disk full) is raised at the next batch's end, or the next epoch's end, with its one
    line; last.pt is the checkpoint before, whole."""
    trainer = _Trainer(tmp_path)
    held.set()
    trainer.save_model()
    trainer.wait_for_saves()
    before = trainer.last.read_bytes()
    held.clear()

    def full(self, data):
        raise WriteError(f"could not write {self}: the disk is full (No space left on device); the file is as it was "
                         "before, nothing half-written is left: free some space, or train with project= on another "
                         "disk")

    monkeypatch.setattr(AtomicPath, "write_bytes", full)
    trainer.epoch = 2
    trainer.save_model()
    trainer._saved_yet()  # not ended yet: nothing raised
    held.set()
    trainer._saving.future.exception(30)  # ended
    with pytest.raises(WriteError, match="last.pt: the disk is full"):
        trainer._saved_yet()
    assert trainer.last.read_bytes() == before and _load(trainer.last)["epoch"] == 1
    trainer.save_model()
    with pytest.raises(WriteError, match="disk is full"):
        trainer._saved_by_epoch_end()
    trainer._close_saves(finished=False)


def test_an_ema_not_finite_is_saved_in_place_as_stocks_which_mends_the_live_ema(tmp_path):
    """Ultralytics' save copies the model's finite values into an EMA tensor that is not finite: the live EMA, which
    the training goes on with. That save is made in place."""
    trainer = _Trainer(tmp_path)
    name, tensor = next((k, v) for k, v in trainer.ema.ema.state_dict().items() if v.is_floating_point())
    tensor.view(-1)[0] = float("nan")
    assert trainer.save_model() is True and trainer._saving is None and trainer._saver is None
    assert trainer.ema.ema.state_dict()[name].isfinite().all()
    assert _load(trainer.last)["ema"].state_dict()[name].isfinite().all()


@pytest.mark.parametrize("event", ["on_model_save", "on_fit_epoch_end", "on_train_epoch_end"])
def test_where_a_callback_at_an_epochs_end_may_read_the_files_the_save_is_stocks_in_place(tmp_path, event):
    """A logger that uploads best.pt as an epoch ends (Comet's at on_fit_epoch_end, one of yours at on_model_save):
    the checkpoint is on the disk before, as stock's."""
    trainer = _Trainer(tmp_path)
    trainer.callbacks[event] = [lambda t: None]
    assert trainer.save_model() is True and trainer._saving is None and _load(trainer.last)["epoch"] == 1


def test_ultralytics_idle_callbacks_leave_the_save_beside(tmp_path, held):
    trainer = _Trainer(tmp_path)
    trainer.callbacks["on_model_save"].append(default_callbacks["on_model_save"][0])
    trainer.save_model()
    assert trainer._saving is not None and not trainer._saving.future.done()
    held.set()
    trainer._close_saves(finished=True)
    assert _load(trainer.last)["epoch"] == 1


def test_a_save_the_thread_could_not_make_is_made_in_place_from_the_same_copies(tmp_path, monkeypatch, caplog):
    """Out of GPU memory in the save thread (its copies beside the next epoch's activations): the epoch's checkpoint
    is made in the training thread at the wait, with one line, and the next ones between the epochs."""
    trainer = _Trainer(tmp_path)
    stock = _Trainer(tmp_path / "stock")
    _Stock.save_model(stock)
    monkeypatch.setattr(saving, "_save", lambda *a: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory")))
    trainer.save_model()
    with torch.no_grad():
        torch._foreach_add_(trainer.live_tensors(), 1.0)
    trainer._saved_by_epoch_end()
    assert "could not be saved beside the training (OutOfMemoryError" in caplog.text
    assert _same_checkpoint(trainer.last, stock.last) and trainer.save_beside is False
    trainer.epoch = 2
    assert trainer.save_model() is True and trainer._saving is None and _load(trainer.last)["epoch"] == 2
    trainer._close_saves(finished=True)


def test_a_ctrl_c_in_the_wait_leaves_the_save_to_the_close_which_says_its_failure(tmp_path, monkeypatch, held, caplog):
    trainer = _Trainer(tmp_path)
    monkeypatch.setattr(AtomicPath, "write_bytes", lambda self, data: (_ for _ in ()).throw(
        WriteError(f"could not write {self}: the disk is full")))
    trainer.save_model()
    real = saving.processes.result

    def interrupted(future):
        raise KeyboardInterrupt

    monkeypatch.setattr(saving.processes, "result", interrupted)
    with pytest.raises(KeyboardInterrupt):
        trainer.wait_for_saves()
    monkeypatch.setattr(saving.processes, "result", real)
    assert trainer._saving is not None
    held.set()
    trainer._close_saves(finished=False)
    assert "the last checkpoint was not saved: WriteError: could not write" in caplog.text


def test_a_stopped_run_finishes_the_checkpoint_in_flight(tmp_path, held):
    """Ctrl-C or an error beside a save: the run closes after the save, so it resumes from that epoch."""
    trainer = _Trainer(tmp_path)
    trainer.save_model()
    threading.Timer(0.3, held.set).start()
    trainer._close_saves(finished=False)
    assert _load(trainer.last)["epoch"] == 1 and trainer._saver is None


def test_a_capture_and_the_next_save_wait_for_the_save_in_flight(tmp_path, held):
    """A CUDA graph capture in the training thread fails where another thread allocates meanwhile: it waits; and one
    save is in flight at most."""
    trainer = _Trainer(tmp_path)
    trainer.save_model()
    threading.Timer(0.3, held.set).start()
    trainer._settle_overlapped()
    assert trainer._saving is None and _load(trainer.last)["epoch"] == 1
    held.clear()
    trainer.epoch = 2
    trainer.save_model()
    first = trainer._saving.future
    threading.Timer(0.3, held.set).start()
    trainer.epoch = 3
    trainer.save_model()  # waits for epoch 2's first
    assert first.done() and _load(trainer.last)["epoch"] == 2
    trainer.wait_for_saves()
    assert _load(trainer.last)["epoch"] == 3
    trainer._close_saves(finished=True)


def test_save_beside_off_saves_in_place_as_stock(tmp_path):
    trainer = _Trainer(tmp_path)
    trainer.save_beside = False
    assert trainer.save_model() is True and trainer._saver is None and _load(trainer.last)["epoch"] == 1


def test_a_training_saves_every_epoch_beside_the_next_and_ends_with_stocks_files(synth_root, tmp_path, monkeypatch):
    """The real trainer, end to end on the CPU: each epoch's checkpoint goes through the save thread, the last one is
    on the disk before final_eval strips it, and the run's files are those of a run saved in place."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    saved = []
    real = saving._save

    def counted(save_model, view, ready, thread):
        saved.append(view.epoch)
        real(save_model, view, ready, thread)

    monkeypatch.setattr(saving, "_save", counted)
    trainer = FastDetectionTrainer.with_options(save_beside=True)
    YOLO("yolo11n.yaml").train(trainer=trainer, data=str(synth_root / "data.yaml"), project=str(tmp_path),
                               name="beside", epochs=3, imgsz=64, batch=8, device="cpu", workers=0, plots=False,
                               verbose=False, exist_ok=True)
    assert saved == [0, 1, 2]
    weights = tmp_path / "beside" / "weights"
    last, best = _load(weights / "last.pt"), _load(weights / "best.pt")
    assert last["optimizer"] is None and last["epoch"] == -1 and best["epoch"] == -1  # stripped at the end
    assert len(last["train_results"]["epoch"]) == 3 and sorted(p.name for p in weights.iterdir()) == ["best.pt",
                                                                                                       "last.pt"]

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
    """A save that fails (the disk full) is raised at the next batch's end, or the next validation, with its one
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
    trainer._saving.exception(30)  # ended
    with pytest.raises(WriteError, match="last.pt: the disk is full"):
        trainer._saved_yet()
    assert trainer.last.read_bytes() == before and _load(trainer.last)["epoch"] == 1
    trainer.save_model()
    with pytest.raises(WriteError, match="disk is full"):
        trainer.validate()
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


def test_a_callback_at_on_model_save_reads_the_epochs_own_checkpoint(tmp_path, held):
    """A logger that uploads last.pt at on_model_save: the save is waited for first."""
    trainer = _Trainer(tmp_path)
    read = []
    trainer.callbacks["on_model_save"].append(lambda t: read.append(_load(t.last)["epoch"]))
    trainer.save_model()
    threading.Timer(0.3, held.set).start()
    trainer.run_callbacks("on_model_save")
    assert read == [1]
    trainer._close_saves(finished=True)


def test_without_a_reader_at_on_model_save_the_save_is_not_waited_for(tmp_path, held):
    """Ultralytics' own idle callback there does not hold the training."""
    trainer = _Trainer(tmp_path)
    trainer.callbacks["on_model_save"].append(default_callbacks["on_model_save"][0])
    trainer.save_model()
    trainer.run_callbacks("on_model_save")
    assert trainer._saving is not None and not trainer._saving.done()
    held.set()
    trainer._close_saves(finished=True)
    assert _load(trainer.last)["epoch"] == 1


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
    first = trainer._saving
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

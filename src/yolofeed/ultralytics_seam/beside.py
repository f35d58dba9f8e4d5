"""An epoch validated beside the next, and ended late (train/overlap.py): whether the installed release serves it,
a validation that neither draws its bar nor syncs the whole device in its thread (``validation_beside``), the trainer
as that validation reads it (``validator_view``), and the epoch's end run once it returns (``end_epoch_late``)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import torch

from yolofeed.ultralytics_seam.names import _validator_module
from yolofeed.ultralytics_seam.pins import VAL_OVERLAP_SINCE
from yolofeed.ultralytics_seam.state import _state
from yolofeed.ultralytics_seam.version import since


# -- an epoch validated beside the next, and ended late (train/overlap.py) -------------------------------------------
def overlap_serves() -> bool:
    """Whether an epoch's validation can run beside the next one under the installed release (``VAL_OVERLAP_SINCE``)."""
    return since(VAL_OVERLAP_SINCE)


_beside = threading.local()  # validation_beside's flag, one a thread
# Ultralytics' own, which _validator_bar and _validator_profile wrap. validation_beside leaves the wrappers in the
# validator module, so a second import of this module (a test's fresh import) takes the originals from them.
_STOCK_BAR = getattr(_validator_module.TQDM, "yolofeed_stock", _validator_module.TQDM)
_STOCK_PROFILE = getattr(_validator_module.Profile, "yolofeed_stock", _validator_module.Profile)


def _validator_bar(*args: Any, **kwargs: Any) -> Any:
    """Ultralytics' TQDM, as ``BaseValidator.__call__`` makes its bar; not drawn in a thread validating beside."""
    if getattr(_beside, "on", False):
        kwargs["disable"] = True
    return _STOCK_BAR(*args, **kwargs)


class _StreamProfile(_STOCK_PROFILE):
    """Ultralytics' ``Profile``, its sync before each clock read narrowed from the device to this thread's CUDA
    stream: the phases of a validation beside the training are timed on its own work (``Profile.time`` syncs every
    stream of the device: 8 times a batch, each waiting for the training's queued steps)."""

    def time(self) -> float:
        if getattr(self, "accelerator", None) is torch.cuda:
            torch.cuda.current_stream(self.device).synchronize()
            return time.perf_counter()
        return super().time()


def _validator_profile(*args: Any, **kwargs: Any) -> Any:
    """Ultralytics' Profile, as ``BaseValidator.__call__`` makes its timers; ``_StreamProfile`` in a thread validating
    beside."""
    return (_StreamProfile if getattr(_beside, "on", False) else _STOCK_PROFILE)(*args, **kwargs)


_validator_bar.yolofeed_stock, _validator_profile.yolofeed_stock = _STOCK_BAR, _STOCK_PROFILE


@contextlib.contextmanager
def validation_beside():
    """In this thread, meanwhile: a validator's progress bar is not drawn, and its timers sync this thread's CUDA
    stream, not the device (``BaseValidator.__call__`` makes both with its module's ``TQDM`` and ``Profile``, which
    this wraps; other threads' validations are as before)."""
    _validator_module.TQDM, _validator_module.Profile = _validator_bar, _validator_profile
    _beside.on = True
    try:
        yield
    finally:
        _beside.on = False


class _ValidatorView:
    """The trainer as a training validation reads it (``BaseValidator.__call__`` and ``get_model``, RELIED_ON: the EMA,
    the epoch and epochs, the loss items, early stopping's ``possible_stop``), with an epoch's snapshot's values;
    anything else is the trainer's (its device, data, amp, arguments, world size, ``label_loss_items``), which the
    training does not change."""

    def __init__(self, trainer: Any, snapshot: Any):
        self._trainer = trainer
        self.ema = _SnapshotEma(snapshot.model, snapshot.updates)
        self.epoch, self.epochs = snapshot.epoch, snapshot.epochs
        self.loss_items, self.loss, self.tloss = snapshot.loss_items, snapshot.loss, snapshot.tloss
        self.stopper = _NoStop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)


class _SnapshotEma:
    def __init__(self, ema: Any, updates: int):
        self.ema, self.updates = ema, updates


class _NoStop:
    possible_stop = False  # an epoch validated beside the next is one early stopping cannot end the run after


def validating_beside() -> bool:
    """Whether this thread is in ``validation_beside``."""
    return getattr(_beside, "on", False)


def validator_view(trainer: Any, snapshot: Any) -> Any:
    """What a validation of ``snapshot``'s epoch (``train.overlap.Snapshot``) run beside the training takes for the
    trainer (``_ValidatorView``)."""
    return _ValidatorView(trainer, snapshot)


@contextlib.contextmanager
def _epoch_state(trainer: Any, snapshot: Any, ended: float):
    """Epoch ``snapshot.epoch``'s end state on the trainer meanwhile (``train.overlap.Snapshot``): its epoch, losses,
    learning rates, epoch time and EMA, the optimiser's and the scaler's state dicts as ``save_model`` reads them, and a
    start time that makes ``save_metrics``' time column ``ended`` (when the validation ended). All put back after."""
    ema = _state(trainer, "ema")
    names = ("epoch", "tloss", "loss", "loss_items", "lr", "epoch_time", "train_time_start")
    saved = {name: getattr(trainer, name, None) for name in names}
    saved_ema = ema.ema, ema.updates
    trainer.epoch, trainer.tloss, trainer.loss = snapshot.epoch, snapshot.tloss, snapshot.loss
    trainer.loss_items, trainer.lr, trainer.epoch_time = snapshot.loss_items, snapshot.lr, snapshot.epoch_time
    trainer.train_time_start = saved["train_time_start"] + (time.time() - ended)
    ema.ema, ema.updates = snapshot.model, snapshot.updates
    states = [(owner, state) for owner, state in ((trainer.optimizer, snapshot.optimizer),
                                                  (_state(trainer, "scaler"), snapshot.scaler)) if state is not None]
    for owner, state in states:  # an instance attribute over the method, until the finally
        owner.state_dict = lambda state=state: state
    try:
        yield
    finally:
        for owner, _ in states:
            del owner.state_dict
        ema.ema, ema.updates = saved_ema
        for name, value in saved.items():
            setattr(trainer, name, value)


def end_epoch_late(trainer: Any, snapshot: Any, metrics: dict, ended: float) -> None:
    """End epoch ``snapshot.epoch`` as ``BaseTrainer._do_train`` (RELIED_ON) ends an epoch after its validation, with
    that epoch's state put back (``_epoch_state``), once its validation, run beside the next epoch, returned
    ``metrics``: the fitness and the best fitness (``BaseTrainer.validate``'s rule, RELIED_ON), the results.csv row
    (``save_metrics``), early stopping's check, the checkpoints and ``on_model_save`` (with ``save``), then
    ``on_fit_epoch_end``. Never the last epoch (``final_epoch`` is False); NaN recovery is not run (the loss and the
    EMA were finite: ``train.overlap.reason_not``). The trainer keeps the metrics, the fitness and early stopping's
    state this sets: they are the newest validation's."""
    with _epoch_state(trainer, snapshot, ended):
        fitness = metrics.pop("fitness", -trainer.loss.detach().cpu().numpy())
        if trainer.best_fitness is None or trainer.best_fitness < fitness:
            trainer.best_fitness = fitness
        trainer.metrics, trainer.fitness = metrics, fitness
        trainer.save_metrics(metrics={**trainer.label_loss_items(trainer.tloss), **trainer.metrics, **trainer.lr})
        trainer.stop |= trainer.stopper(trainer.epoch + 1, trainer.fitness)
        if trainer.args.save and trainer.save_model():
            trainer.run_callbacks("on_model_save")
        trainer.run_callbacks("on_fit_epoch_end")

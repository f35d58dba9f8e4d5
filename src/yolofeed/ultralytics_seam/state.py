"""The trainer's state: the attributes of a trainer that Ultralytics sets in its methods and yolofeed reads
(``TRAINER_STATE``), checked in the installed source when the seam is imported, and each read through a function here
that names it (``checkpoint``, ``start_epoch``, ``step_autocast``, ``may_stop``...)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from yolofeed.errors import UltralyticsVersionError
from yolofeed.ultralytics_seam import source
from yolofeed.ultralytics_seam.names import AutoBackend, DetectionTrainer, EarlyStopping, get_flops
from yolofeed.ultralytics_seam.required import _missing

# The files Ultralytics writes at the top of a run folder (fnmatch patterns): its arguments, results, plots and its
# platform logger's model id, written in place, through a symbolic link planted at the name. yolofeed's own writes
# there (results.csv's rewrite) replace a link.
RUN_FILES = ("args.yaml", "results.csv", "results.png", "labels*.jpg", "train_batch*.jpg", "val_batch*.jpg",
             "confusion_matrix*.png", "*_curve.png", "predictions.json", "platform_model_id.txt")

# -- the trainer's state -------------------------------------------------------------------------------------------
# Attributes of a trainer that Ultralytics sets in its methods (not on the class, so REQUIRED cannot see them) and
# yolofeed reads: (the class that sets them, what yolofeed does with it). Checked at import in the installed source:
# an attribute no method of that class (or an Ultralytics base of it) assigns any more fails in one line. yolofeed
# reads each through the function below that names it.
TRAINER_STATE: dict[str, tuple[type, str]] = {
    "last": (DetectionTrainer, "yolofeed names it as the checkpoint a stopped run resumes from and strips it "
                               "atomically at the end"),
    "best": (DetectionTrainer, "yolofeed strips it atomically at the end and validates it"),
    "wdir": (DetectionTrainer, "yolofeed removes the temporary files of a killed checkpoint writer there"),
    "start_epoch": (DetectionTrainer, "yolofeed's warm-up loads the first batches of the epoch training starts at "
                                      "(not 0 after a resume)"),
    "amp": (DetectionTrainer, "yolofeed's warm-up runs under the step's autocast"),
    "ema": (DetectionTrainer, "yolofeed's validation thread warms copies of the models validated from it"),
    "accumulate": (DetectionTrainer, "yolofeed's validation thread starts its set-up once the optimiser has stepped "
                                     "twice (FastMuSGD's capture)"),
    "test_loader": (DetectionTrainer, "yolofeed's validation thread sets up cuDNN for its batches' shapes"),
    "world_size": (DetectionTrainer, "yolofeed's train loader shards the pack by it under DDP"),
    "stopper": (DetectionTrainer, "yolofeed validates wherever early stopping may stop the run"),
    "stop": (DetectionTrainer, "yolofeed validates wherever the run is about to stop"),
    "possible_stop": (EarlyStopping, "yolofeed validates wherever early stopping may stop the run"),
    "best_epoch": (EarlyStopping, "val_overlap validates in the training thread wherever early stopping could stop "
                                  "the run"),
    "patience": (EarlyStopping, "val_overlap validates in the training thread wherever early stopping could stop "
                                "the run"),
    "tloss": (DetectionTrainer, "val_overlap writes an epoch's row late, with that epoch's mean losses"),
    "loss": (DetectionTrainer, "val_overlap's fitness without a validator's is the epoch's last loss, as stock's"),
    "loss_items": (DetectionTrainer, "val_overlap validates an epoch beside the next with that epoch's loss items"),
    "lr": (DetectionTrainer, "val_overlap writes an epoch's row late, with that epoch's learning rates"),
    "epoch_time": (DetectionTrainer, "val_overlap runs an epoch's on_fit_epoch_end late, with that epoch's time"),
    "train_time_start": (DetectionTrainer, "val_overlap writes an epoch's row late, its time column when its "
                                           "validation ended"),
    "scaler": (DetectionTrainer, "val_overlap writes an epoch's checkpoints late, with that epoch's scaler state"),
    "resume": (DetectionTrainer, "yolofeed restores a resumed run's options and drops the results.csv rows of epochs "
                                 "it trains again"),
    "csv": (DetectionTrainer, "yolofeed draws results.png from it beside the final validation, and drops from it the "
                              "rows of epochs a resumed run trains again"),
}


def check_trainer_state(state: dict[str, tuple[type, str]] = TRAINER_STATE) -> None:
    """Raise on the first attribute of ``state`` that no method of its class assigns in the installed source.

    Raises:
        UltralyticsVersionError: one line naming the attribute, what yolofeed does with it, and the range that works.
    """
    assigned: dict[type, set[str]] = {}
    for cls, _ in state.values():
        if cls not in assigned:
            try:
                assigned[cls] = source.assigned_attributes(cls)
            except (OSError, TypeError):  # no source to read (compiled): the readers below still fail in one line
                assigned[cls] = set(state)
    source.clear_cache()
    for name, (cls, why) in state.items():
        if name not in assigned[cls]:
            raise UltralyticsVersionError(str(_missing(f"{cls.__name__}.{name}", why)))


check_trainer_state()


def _state(obj: Any, name: str, where: str = "trainer") -> Any:
    """``obj.<name>`` (an attribute of ``TRAINER_STATE``), or one line saying which is missing and why it matters.

    Raises:
        UltralyticsError: the object has no such attribute (yet: Ultralytics sets some during set-up).
    """
    try:
        return getattr(obj, name)
    except AttributeError:
        raise _missing(f"{where}.{name}", TRAINER_STATE[name][1]) from None


def checkpoint(trainer: Any, which: str) -> Any:
    """The path of the trainer's ``"last"`` or ``"best"`` checkpoint (``BaseTrainer.__init__``: ``wdir / last.pt``,
    ``wdir / best.pt``; a ``Path`` until ``write_checkpoints_as`` swaps its class)."""
    if which not in ("last", "best"):
        raise ValueError(f"which={which!r}: expected 'last' or 'best'")
    return _state(trainer, which)


def resuming(trainer: Any) -> bool:
    """Whether the trainer resumes a run (``BaseTrainer.check_resume`` sets ``resume``)."""
    return bool(_state(trainer, "resume"))


def results_csv(trainer: Any) -> Path:
    """The run's results.csv (``BaseTrainer.csv``), one row an epoch, appended by ``save_metrics``."""
    return Path(_state(trainer, "csv"))


def weights_dir(trainer: Any) -> Any:
    """The folder the trainer writes its checkpoints in (``BaseTrainer.wdir``, ``<save_dir>/weights``)."""
    return _state(trainer, "wdir")


def start_epoch(trainer: Any) -> int:
    """The epoch training starts at: 0, or the one after a resumed checkpoint's (``resume_training``)."""
    return int(_state(trainer, "start_epoch"))


def step_autocast(trainer: Any) -> Any:
    """What the training step autocasts to, as ``BaseTrainer._do_train`` (RELIED_ON) passes it to ``autocast``:
    ``torch.bfloat16`` under ``amp=bf16``, else ``trainer.amp`` (a bool, set by ``_setup_train``)."""
    return autocast_asked(trainer.args, _state(trainer, "amp"))


def autocast_asked(args: Any, amp: bool | None = None) -> Any:
    """``step_autocast`` from a run's ``args`` alone, before the trainer exists (train/plans.py): ``amp`` where given
    (``_setup_train``'s, after its AMP check), else the ``amp`` asked for."""
    return torch.bfloat16 if args.amp == "bf16" else bool(args.amp) if amp is None else amp


def validation_models(trainer: Any) -> list[tuple[Any, torch.dtype | None, torch.dtype, bool]]:
    """Copies of the models Ultralytics' validations run, set up as ``BaseValidator.__call__`` (RELIED_ON) sets them
    up, for a blank forward pass at each shape they will meet: each (model, autocast dtype or None, input dtype,
    whether it first runs at batch 1), every epoch's first, the final validation's second. Made from the EMA, so call
    it once the EMA exists (``on_pretrain_routine_end``).

    * every epoch's validation: the EMA, float32 in eval mode and in the training model's layout, under float16
      autocast with ``amp`` (every release of the range), on half inputs;
    * the final validation's: best.pt (the EMA's weights) through ``AutoBackend``: fused, in half precision with
      ``amp``, in the layout ``channels_last`` asks for (contiguous on CUDA by default), warmed at batch 1 first.

    Only cuDNN's per-shape set-up is wanted from them: what the passes compute is thrown away.
    """
    import copy

    amp = trainer.device.type != "cpu" and bool(_state(trainer, "amp"))
    ema = _state(trainer, "ema").ema
    half = torch.float16 if amp else torch.float32
    epoch = copy.deepcopy(ema).float().eval()
    final = AutoBackend(model=copy.deepcopy(ema), device=trainer.device, fp16=amp, fuse=True,
                        channels_last=trainer.args.channels_last, verbose=False)
    return [(epoch, torch.float16 if amp else None, half, False), (final, None, half, True)]


def count_flops_as_loaded(final: Any, device: torch.device) -> bool:
    """Ultralytics' FLOPs count of best.pt, made as the final validation's load of it makes it, on a copy of ``final``
    (``validation_models``' second model): ``PyTorchBackend.load_model`` (RELIED_ON) loads the checkpoint in float32
    and NCHW (the trainer saves it so) and fuses it on the device, and ``BaseModel.fuse`` (RELIED_ON) counts its FLOPs
    at imgsz 640 (``info``), a forward pass at a few small proxy shapes in float32. Run ahead in the validation thread,
    it pays cuDNN's set-up for those shapes, which the final validation's load otherwise pays (0.5 s of yolo11n's on
    an H100). Whether it was counted: not where the GPU's free memory outside torch's cache (the training may need
    the rest) does not hold the copy, twice the final model's memory in float32, nor where ``get_flops`` gave 0 (it
    returns 0 on any failure, and without thop)."""
    import copy

    model = final.model if isinstance(final, AutoBackend) else final
    size = sum(p.numel() for p in model.parameters()) * 4
    if device.type == "cuda" and torch.cuda.mem_get_info(device)[0] < 2 * size:
        return False
    copied = copy.deepcopy(model).float().to(memory_format=torch.contiguous_format)
    try:
        return get_flops(copied, 640) > 0  # fuse's default imgsz, whatever the run's
    finally:
        del copied


def batches_per_step(trainer: Any) -> int:
    """The batches whose gradients the optimiser steps on at most (``BaseTrainer.accumulate``, ``nbs / batch``; fewer
    in the warm-up epochs)."""
    return max(int(_state(trainer, "accumulate")), 1)


def validation_loader(trainer: Any) -> Any:
    """The loader every validation of the run reads (``BaseTrainer.test_loader``)."""
    return _state(trainer, "test_loader")


def world_size(trainer: Any) -> int:
    """The number of DDP ranks (``BaseTrainer.world_size``: 0 on the CPU, 1 on one GPU)."""
    return int(_state(trainer, "world_size"))


def may_stop(trainer: Any) -> bool:
    """Whether this epoch may end the run early: Ultralytics' early stopping may stop it after this epoch's validation
    (``EarlyStopping.possible_stop``) or the run is stopping (``BaseTrainer.stop``: a ``time=`` limit, early stopping
    on another rank)."""
    return bool(_state(_state(trainer, "stopper"), "possible_stop", "trainer.stopper") or _state(trainer, "stop"))


def could_stop(trainer: Any) -> bool:
    """Whether this epoch's validation may end the run: ``may_stop``, or early stopping would stop after this epoch
    if its fitness does not improve (``EarlyStopping.__call__``, RELIED_ON: it stops once the epochs since the best
    reach ``patience``; with ``val_period`` the epochs between two validations count too, which ``possible_stop``, set
    at the last validation for the next epoch, does not see)."""
    stopper = _state(trainer, "stopper")
    since_best = trainer.epoch + 1 - _state(stopper, "best_epoch", "trainer.stopper")
    return may_stop(trainer) or since_best >= _state(stopper, "patience", "trainer.stopper")


def trainer_ema(trainer: Any) -> Any:
    """The trainer's ``ModelEMA`` (``BaseTrainer.ema``: its ``ema`` model and its ``updates``)."""
    return _state(trainer, "ema")


def stop_asked(trainer: Any) -> bool:
    """Whether the run stops after this epoch (``BaseTrainer.stop``: early stopping, ``time=``, a callback)."""
    return bool(_state(trainer, "stop"))


def epoch_end_state(trainer: Any) -> dict[str, Any]:
    """What ``BaseTrainer._do_train``'s epoch end reads of the trainer besides the EMA, as it is now: the epoch and the
    epochs, the epoch's mean losses (``tloss``), the last step's loss and loss items, the learning rates (``lr``)."""
    ema = _state(trainer, "ema")
    return {"epoch": trainer.epoch, "epochs": trainer.epochs, "tloss": _state(trainer, "tloss"),
            "loss": _state(trainer, "loss"), "loss_items": _state(trainer, "loss_items"), "lr": _state(trainer, "lr"),
            "updates": ema.updates}


def forget_loss(trainer: Any) -> None:
    """The trainer's last loss set to None, for an epoch whose training is not kept: Ultralytics' NaN recovery, which
    reads it after the validation (``_handle_nan_recovery``, RELIED_ON), then has nothing of it to recover from."""
    _state(trainer, "loss")
    trainer.loss = None


def checkpoint_states(trainer: Any) -> tuple[dict, dict]:
    """The optimiser's and the scaler's state dicts, as ``BaseTrainer.save_model`` serialises them."""
    return trainer.optimizer.state_dict(), _state(trainer, "scaler").state_dict()


def checkpoint_inputs(trainer: Any) -> tuple[dict[str, Any], list[Any]]:
    """What ``BaseTrainer.save_model`` (RELIED_ON) reads of ``trainer``, read now, for ``CheckpointStandIn`` to give
    back in another process; and the objects save_model strips from its copy of the EMA (its ``criterion``, which it
    sets to None), which need not travel. The optimiser's and the scaler's ``state_dict()``, results.csv's rows
    (``read_results_csv``) and the checkpoint paths are taken as save_model would take them at this moment."""
    ema = _state(trainer, "ema")
    stopper = _state(trainer, "stopper")
    optimizer, scaler = checkpoint_states(trainer)
    inputs = {"epoch": trainer.epoch, "best_fitness": trainer.best_fitness,
              "stopper": (stopper.best_fitness, stopper.best_epoch), "ema": ema.ema, "updates": ema.updates,
              "optimizer": optimizer, "scaler": scaler, "args": vars(trainer.args), "metrics": trainer.metrics,
              "fitness": trainer.fitness, "results": trainer.read_results_csv(), "save_period": trainer.save_period,
              "wdir": str(_state(trainer, "wdir")), "last": str(_state(trainer, "last")),
              "best": str(_state(trainer, "best"))}
    criterion = getattr(ema.ema, "criterion", None)
    return inputs, [criterion] if criterion is not None else []


def checkpoint_files(inputs: dict[str, Any]) -> list[Path]:
    """The files ``BaseTrainer.save_model`` may write with ``checkpoint_inputs``' ``inputs``: last.pt, best.pt and
    the epoch's ``epochN.pt``."""
    return [Path(inputs["last"]), Path(inputs["best"]), Path(inputs["wdir"]) / f"epoch{inputs['epoch']}.pt"]


class CheckpointStandIn:
    """A trainer as ``BaseTrainer.save_model`` (RELIED_ON) reads it, made from ``checkpoint_inputs``' dict (its tensors
    on the host), its files written through ``path_class`` (a ``Path`` subclass whose ``write_bytes`` writes them);
    ``save()`` runs Ultralytics' own save_model on it. The model save_model would repair a non-finite EMA from is the
    EMA itself: the caller saves this way only an EMA found finite."""

    def __init__(self, inputs: dict[str, Any], path_class: type):
        self.epoch, self.best_fitness = inputs["epoch"], inputs["best_fitness"]
        best_fitness, best_epoch = inputs["stopper"]
        self.stopper = SimpleNamespace(best_fitness=best_fitness, best_epoch=best_epoch)
        self.ema = SimpleNamespace(ema=inputs["ema"], updates=inputs["updates"])
        self.model = inputs["ema"]
        self.optimizer = SimpleNamespace(state_dict=lambda: inputs["optimizer"])
        self.scaler = SimpleNamespace(state_dict=lambda: inputs["scaler"])
        self.args = SimpleNamespace(**inputs["args"])
        self.metrics, self.fitness, self.save_period = inputs["metrics"], inputs["fitness"], inputs["save_period"]
        self._results = inputs["results"]
        self.wdir, self.last, self.best = (path_class(inputs[k]) for k in ("wdir", "last", "best"))

    def read_results_csv(self) -> dict:
        return self._results

    def save(self) -> bool:
        return DetectionTrainer.save_model(self)

"""Ultralytics' training loop as yolofeed joins it: the callbacks' order and the loggers at an epoch's end, the
epoch's loss, the phases of a step, ending the loop at once, the checkpoints' writes, the validator's statistics and
the progress bar on screen."""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from yolofeed.ultralytics_seam.model import compiled
from yolofeed.ultralytics_seam.names import (
    LOGGER,
    RANK,
    VERBOSE,
    ConfusionMatrix,
    DetectionValidator,
    _tqdm,
    unwrap_model,
)
from yolofeed.ultralytics_seam.pins import VAL_METRICS_SINCE
from yolofeed.ultralytics_seam.required import _missing
from yolofeed.ultralytics_seam.version import since


# -- the training loop ---------------------------------------------------------------------------------------------
def run_first(trainer: Any, event: str, fn: Callable[[Any], None]) -> None:
    """Run ``fn`` before the callbacks already registered for ``event``, Ultralytics' loggers included.

    ``BaseTrainer.callbacks`` is ``{event: [fn, ...]}``, run in order; ``add_callback`` appends.
    """
    callbacks = getattr(trainer, "callbacks", None)
    if not isinstance(callbacks, dict):
        raise _missing("trainer.callbacks (a dict of lists)", "yolofeed orders its callbacks in")
    callbacks.setdefault(event, []).insert(0, fn)


@contextlib.contextmanager
def first_meanwhile(owner: Any, event: str, fn: Callable[[Any], None]) -> Iterator[None]:
    """``run_first`` on ``owner`` (a trainer or a validator: both keep ``callbacks`` so) within it; taken out after."""
    run_first(owner, event, fn)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            owner.callbacks[event].remove(fn)


# the events an epoch validated beside the next runs an epoch late (``end_epoch_late``), and the one at which the next
# epoch's losses reach the callbacks meanwhile
LATE_EVENTS = ("on_train_epoch_end", "on_fit_epoch_end", "on_model_save")
# the training loop's events from one epoch's checkpoint to the next's: a callback there may read the files by name
# (Ultralytics' telemetry, ultralytics.utils.events, is at on_train_end and the validator's: it reads none)
TRAINING_EVENTS = ("on_train_epoch_start", "on_train_batch_start", "on_train_batch_end", "on_train_epoch_end",
                   "on_fit_epoch_end", "on_model_save")


def _idle(module: str, trainer: Any) -> bool:
    """Whether an Ultralytics callback of ``module`` does nothing in this run, as each release of the range reads
    (tests/test_seam.py calls them under each): base's are empty; Platform's return at once while ``trainer.platform``
    is unset, which it is without an API key; Ray Tune's (where ray is installed) report only inside a Tune trial."""
    name = module.removeprefix("ultralytics.utils.callbacks.")
    if name == "base":
        return True
    if name == "platform":
        return not getattr(trainer, "platform", None)
    if name == "raytune":
        tune = getattr(sys.modules.get(module), "tune", None)
        try:
            return tune is None or not tune.get_context().get_trial_id()
        except Exception:  # noqa: BLE001 - a Ray that answers otherwise: counted as a reader, the safe side
            return False
    return False


def epoch_readers(trainer: Any, events: tuple[str, ...] = LATE_EVENTS) -> list[str]:
    """The callbacks at ``events`` (an epoch's end, ``LATE_EVENTS``, unless given; ``TRAINING_EVENTS``: where a
    checkpoint may be read) that act there, each as ``module.function``: every one but Ultralytics' idle ones
    (``_idle``) and yolofeed's own. Ultralytics' loggers (Weights & Biases, MLflow, DVC, ...) are among them where
    installed and enabled in its settings, and any a user added."""
    callbacks = getattr(trainer, "callbacks", None)
    if not isinstance(callbacks, dict):
        raise _missing("trainer.callbacks (a dict of lists)", "yolofeed's val_overlap looks for loggers in it")
    readers = []
    for event in events:
        for fn in callbacks.get(event, ()):
            fn = getattr(fn, "func", fn)  # a functools.partial: the function it calls
            module = getattr(fn, "__module__", None) or ""
            if module.split(".")[0] == "yolofeed":
                continue
            if module.startswith("ultralytics.utils.callbacks.") and _idle(module, trainer):
                continue
            name = f"{module.rsplit('.', 1)[-1]}.{getattr(fn, '__name__', type(fn).__name__)}"
            if name not in readers:
                readers.append(name)
    return readers


def set_epoch_loss(trainer: Any, items: dict) -> None:
    """Put the epoch's mean loss items where the loop keeps them: ``trainer.tloss`` (its running mean, read by
    ``save_metrics`` and the loggers at the epoch's end) and ``trainer.loss_items`` (the last step's, which the
    validator's loss sums are made like). Nothing when no step ran this epoch (``tloss`` is None)."""
    if not hasattr(trainer, "tloss"):
        raise _missing("trainer.tloss", "the sync-free step puts the epoch's exact mean loss in")
    if trainer.tloss is not None:
        trainer.tloss = items
        trainer.loss_items = items


def mark_phases(trainer: Any, mark: Callable[[str], None]) -> Callable[[], None]:
    """Call ``mark(phase)`` where each phase of a training step starts; returns a function that undoes it.

    "forward" at the model's forward pre-hook, "loss" at the detection head's output (``model.model[-1]``, the
    ``Detect`` layer of a ``DetectionModel``), "backward" when the model (which computes the loss) returns,
    "optimizer" where ``trainer.optimizer_step`` is entered: Ultralytics has no callback before the optimiser step,
    so the method is wrapped on the instance. Under the graphed step (train/graphed.py) the head's hook does not run
    (the forward is a graph replay): "forward" then spans the forward and the loss.

    A compiled model (``compile=True``) takes no hook inside it: a hook that records a CUDA event breaks the
    compiled graph in two. Ultralytics' step then calls the model for the predictions and its ``loss`` apart
    (``_do_train``), so "forward" and "loss" mark the outer module's call and return, and "backward" is where
    ``trainer.scaler.scale`` is entered (the loss is scaled for the backward pass).
    """
    model = unwrap_model(trainer.model)
    layers = getattr(model, "model", None)
    if layers is None or not len(layers):
        raise _missing("model.model[-1] (the detection head)", "the monitor marks the loss phase at")
    if compiled(trainer):
        hooks = [trainer.model.register_forward_pre_hook(lambda m, a: mark("forward")),
                 trainer.model.register_forward_hook(lambda m, a, o: mark("loss"))]
        scaler, scale = trainer.scaler, trainer.scaler.scale

        def scale_marked(*args: Any, **kwargs: Any) -> Any:
            mark("backward")
            return scale(*args, **kwargs)

        scaler.scale = scale_marked
    else:
        cuda = any(p.is_cuda for p in model.parameters())

        def marking(phase: str) -> Callable[..., None]:  # not inside a CUDA graph's capture (train/graphed.py):
            if not cuda:  # replays skip hooks
                return lambda *_: mark(phase)
            return lambda *_: None if torch.cuda.is_current_stream_capturing() else mark(phase)
        hooks = [model.register_forward_pre_hook(marking("forward")),
                 layers[-1].register_forward_hook(marking("loss")),
                 model.register_forward_hook(marking("backward"))]
        scaler = scale_marked = None
    step = trainer.optimizer_step

    def optimizer_step() -> None:
        mark("optimizer")
        step()

    trainer.optimizer_step = optimizer_step

    def undo() -> None:
        for h in hooks:
            h.remove()
        if trainer.__dict__.get("optimizer_step") is optimizer_step:
            del trainer.__dict__["optimizer_step"]
        if scaler is not None and scaler.__dict__.get("scale") is scale_marked:
            del scaler.__dict__["scale"]

    return undo


def unbounded_epochs(trainer: Any) -> None:
    """Let the loop run past the run's epochs (``trainer.epochs``, which the loop compares with): the caller ends
    training with ``StopTraining``. Call it in ``on_train_start``: the optimiser is built before, from the run's own
    epochs (``optimizer=auto`` chooses by the number of iterations)."""
    trainer.epochs = 10**6


class StopTraining(BaseException):
    """Raised from a callback to end Ultralytics' training loop at once (the loop has no other way out mid-epoch:
    ``trainer.stop`` still validates and saves).

    A ``BaseException``, like ``KeyboardInterrupt``: an ``except Exception`` on its way (``FastDetectionTrainer``
    logs a failed run there) does not take it for a failure. Ultralytics' ``train`` lets it through after its
    ``finally`` (deterministic mode off, teardown callbacks).
    """


def launches_ranks(trainer: Any) -> bool:
    """Whether ``trainer.train()`` launches DDP ranks as subprocesses (several devices, and this process is not a
    rank) instead of training here: Ultralytics' ``trainer.ddp``."""
    return bool(getattr(trainer, "ddp", False))


def train_until_stopped(trainer: Any) -> bool:
    """``trainer.train()``; True when a callback ended it with ``StopTraining``, False when the loop ended itself."""
    try:
        trainer.train()
    except StopTraining:
        return True
    return False


# -- checkpoints -----------------------------------------------------------------------------------------------------
def write_checkpoints_as(trainer: Any, path_class: type) -> None:
    """Make the trainer's checkpoint paths instances of ``path_class`` (a ``Path`` subclass), so that
    ``BaseTrainer.save_model`` writes every checkpoint through its ``write_bytes``.

    ``save_model`` serialises once, then writes the bytes with ``write_bytes`` on ``trainer.last``, ``trainer.best``
    and ``trainer.wdir / f"epoch{N}.pt"`` (RELIED_ON; pathlib keeps the class across ``/``). Idempotent.
    """
    for name in ("wdir", "last", "best"):
        path = getattr(trainer, name, None)
        if path is None:
            raise _missing(f"trainer.{name}", "yolofeed writes the run's checkpoints atomically at")
        if type(path) is not path_class:
            setattr(trainer, name, path_class(path))


# -- validation ----------------------------------------------------------------------------------------------------
# ConfusionMatrix.process_batch's iou_thres (RELIED_ON), which DetectionValidator.update_metrics leaves at its default
CONFUSION_IOU: float = inspect.signature(ConfusionMatrix.process_batch).parameters["iou_thres"].default


def batched_metrics_serve(validator: Any) -> tuple[Any, Callable[[dict], dict], Any, float, float] | None:
    """What ``train.val_metrics.update_metrics`` needs of a validator whose ``update_metrics`` gathers statistics and,
    under ``plots``, counts its confusion matrix (RELIED_ON: ``DetectionValidator.update_metrics``, ``_process_batch``,
    ``_prepare_batch``, ``match_predictions``, ``ConfusionMatrix.process_batch``): its IoU thresholds (``iouv``, as
    numpy), its ``_prepare_pred``, its ``confusion_matrix`` where ``plots`` counts one (else None), the confidence
    that matrix counts from (``args.conf``) and the IoU its matches need (``CONFUSION_IOU``). None where it does
    other work: a subclass (segment, pose, OBB match otherwise), ``visualize`` (the matrix keeps each match to draw),
    ``save_json``, ``save_txt``, and a release before ``VAL_METRICS_SINCE`` (whose sources were not reviewed for it)."""
    plain = type(validator) is DetectionValidator or getattr(type(validator), "_stock", None) is DetectionValidator
    if not plain or not since(VAL_METRICS_SINCE):
        return None
    args = validator.args
    if args.save_json or args.save_txt or (args.plots and (args.visualize or validator.confusion_matrix is None
                                                           or validator.confusion_matrix.matches is not None)):
        return None
    return (validator.iouv.cpu().numpy(), validator._prepare_pred, validator.confusion_matrix if args.plots else None,
            args.conf, CONFUSION_IOU)


def record_image_stats(validator: Any, stat: dict) -> None:
    """One image's statistics, as ``DetectionValidator.update_metrics`` records them: ``seen`` counts the image, and
    ``metrics.update_stats`` takes its arrays and its file's name (the per-image metrics' key)."""
    validator.seen += 1
    stat = dict(stat)
    stat["im_name"] = Path(stat.pop("im_file")).name
    validator.metrics.update_stats(stat)


# -- output --------------------------------------------------------------------------------------------------------
def progress_bar_drawn() -> bool:
    """Whether Ultralytics' epoch progress bar is on screen, its line left open (a carriage return, no newline).

    Its TQDM draws when Ultralytics is verbose at INFO, on rank 0, in an interactive console.
    """
    return (VERBOSE and RANK in {-1, 0} and LOGGER.getEffectiveLevel() <= logging.INFO
            and not _tqdm.is_noninteractive_console())

"""An epoch's validation beside the next epoch's training (the trainer's ``val_overlap``): Ultralytics' results and
files, written an epoch later.

Ultralytics ends each epoch with its validation, the results.csv row, early stopping's check, the checkpoints and
``on_fit_epoch_end``, all in the training thread: the next epoch waits for them. A validation is mostly host work
(Ultralytics' NMS and its metrics sync once an image or more): with ``validate_beside`` it runs in yolofeed's
validation thread, but the training still waits for it (0.5-1.3 s an epoch on the 10k set of BENCHMARKS.md, "The
whole run", about 9 s of a 10-epoch run).

With ``val_overlap``, epoch k's validation runs in that thread while epoch k+1 trains, on a copy of the EMA made at
epoch k's end (``Snapshot``), on a CUDA stream of its own, its progress bar not drawn and its printed lines held. Its
host syncs (a copy to the host, an ``item()``) wait for that stream's work only, and its timers
(``seam.validation_beside``) sync that stream where Ultralytics' sync the device: none waits for the training's queued
steps. At epoch k+1's end, before its own
validation, the trainer waits for it (``Overlapped.result``: by then it has usually finished) and ends epoch k there
as Ultralytics' loop would have ended it, with epoch k's state put back (``seam.end_epoch_late``): the fitness and the
best fitness, the results.csv row, early stopping's check, last.pt / best.pt / epochN.pt (epoch k's EMA, optimiser
and scaler states), ``on_model_save``, ``on_fit_epoch_end``, and the validator's lines, printed under one that names
the epoch.

What differs from stock is when these happen, not what they hold: the metrics, the rows (but the time column: when the
validation ended) and the checkpoints are stock's. A run killed while epoch k+1 trains resumes from epoch k-1's
last.pt (stock's: k's); one stopped by an error or Ctrl-C says which epoch's validation did not end, with what it had
printed, once the validation thread has stopped (at its next batch). A callback at ``on_fit_epoch_end`` or
``on_model_save`` runs an epoch late, with the trainer's epoch, metrics, losses, learning rates (``lr``), epoch time
and EMA those of the epoch it ends; the model in training, the optimiser's parameter groups and the scheduler are the
next epoch's, and callbacks during epoch k+1 see epoch k-1's metrics (a logger that writes the training losses at
``on_train_epoch_end`` and the metrics at ``on_fit_epoch_end`` as one step, as Weights & Biases' does, pairs epoch
k+1's losses with epoch k's metrics). A stop such a callback asks for (``stop``) takes
effect where stock's does: epoch k+1, trained meanwhile, is not kept (``Validating._discard_epoch``; the log's
count of epochs completed includes it). A fitness that is not a number while the loss and the EMA are finite is
written as it is, with one warning: Ultralytics' NaN recovery, which reloads the last checkpoint
and trains that epoch again, is not run for it (the loop has trained the next epoch by then, and its epoch count cannot
go back), and every later epoch is validated in place, where it is.

An epoch is validated in the training thread, and waited for, wherever the overlap would change more than that
(``reason_not``): the last epoch; an epoch after which early stopping may stop the run (``seam.could_stop``: its
``possible_stop``, set by the previous validation, ``stop``, or the epochs since the best reaching ``patience`` between
two ``val_period`` validations), so the run stops at stock's epoch; a ``time=`` limit (the epochs are counted from their
times); every epoch after one whose fitness was not a number (and after a resume of that run: yolofeed.yaml then
records ``val_overlap`` False); by default (``val_overlap`` None, not True) a callback
that reads each epoch as it ends (``seam.epoch_readers``: an Ultralytics logger installed and enabled, a user's), which
would see it an epoch late; a loss or EMA that is not finite (Ultralytics' NaN recovery and its EMA repair read this
epoch's state); too little free GPU memory for the validation beside the training (a training pass's peak per image
times the validation's largest batch, as the validations' set-up checks it, and the copies of the EMA and the
optimiser's state kept for an epoch: a training that takes more than about a third of the GPU is validated in place);
and Ultralytics before ``seam.VAL_OVERLAP_SINCE``.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from yolofeed import processes
from yolofeed import ultralytics_seam as seam
from yolofeed.ultralytics_seam import LOGGER


def copied(x: Any) -> Any:
    """``copy.deepcopy(x)``, its tensors copied a multi-tensor pass a (device, dtype) (``torch._foreach_copy_``), where
    deepcopy clones each with a launch of its own: the EMA model and the optimiser's state are about 500 tensors each.
    A tensor that does not fill its storage as it is laid out, shares it with another, or is not a plain tensor or
    parameter, is left to deepcopy, whose copy keeps its storage and its sharing."""
    tensors = [t for t in _tensors_in(x) if type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided]
    holders: dict[tuple[torch.device, int], set[int]] = {}  # a storage's tensors: one shared is left to deepcopy
    for t in tensors:
        holders.setdefault((t.device, t.untyped_storage().data_ptr()), set()).add(id(t))
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        if t.grad_fn is None and t.grad is None and not t.__dict__ and t.storage_offset() == 0 and (
                t.untyped_storage().nbytes() == t.numel() * t.element_size()) and (
                len(holders[t.device, t.untyped_storage().data_ptr()]) == 1):
            groups.setdefault((t.device, t.dtype), []).append(t)
    memo: dict[int, Any] = {}
    with torch.no_grad():
        for tensors in groups.values():
            copies = [torch.empty_like(t) for t in tensors]
            torch._foreach_copy_(copies, tensors)
            for t, c in zip(tensors, copies):
                memo[id(t)] = torch.nn.Parameter(c, t.requires_grad) if type(t) is torch.nn.Parameter else \
                    c.requires_grad_(t.requires_grad)
    return copy.deepcopy(x, memo)


def _tensors_in(x: Any) -> list[torch.Tensor]:
    """The tensors of ``x``: each module's parameters, buffers and tensor attributes (a view of a buffer held as an
    attribute shares its storage), or a container's leaves."""
    if isinstance(x, torch.nn.Module):
        found: dict[int, torch.Tensor] = {}
        for module in x.modules():
            for t in (*module._parameters.values(), *module._buffers.values(), *vars(module).values()):
                if isinstance(t, torch.Tensor):
                    found[id(t)] = t
        return list(found.values())
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _cloned(x: Any) -> Any:
    """``x`` with every tensor in it cloned (the loss items: a tensor or a dict of them, by release)."""
    return pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, x)


@dataclass
class Snapshot:
    """Epoch ``epoch``'s state at its end, as the loop's epoch end reads it (``seam.end_epoch_late``)."""

    epoch: int
    model: torch.nn.Module  # a copy of the EMA: validated, then written as the checkpoints' EMA
    updates: int
    tloss: Any
    loss: Any
    loss_items: Any
    lr: dict
    epochs: int
    epoch_time: float | None = None  # the loop sets it after the checkpoints: kept at its held on_fit_epoch_end
    optimizer: dict | None = None  # the optimiser's and the scaler's state dicts, kept where the loop saves
    scaler: dict | None = None

    @classmethod
    def of(cls, trainer: Any) -> Snapshot:
        """The trainer's epoch-end state now (the model copied on the training thread's stream)."""
        ema, state = seam.trainer_ema(trainer), seam.epoch_end_state(trainer)
        return cls(epoch=state["epoch"], model=copied(ema.ema), updates=state["updates"],
                   tloss=_cloned(state["tloss"]), loss=_cloned(state["loss"]), loss_items=_cloned(state["loss_items"]),
                   lr=dict(state["lr"]), epochs=state["epochs"])

    def keep_checkpoint_state(self, trainer: Any) -> None:
        """What ``save_model`` serialises besides the EMA, as it is at this epoch's end (copied: the optimiser steps
        on)."""
        self.optimizer, self.scaler = copied(seam.checkpoint_states(trainer))


class _Held(logging.Filter):
    """Holds what one thread logs to Ultralytics' logger (its records kept, in order), lets every other thread's
    through."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.current_thread()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if threading.current_thread() is not self.thread:
            return True
        self.records.append(record)
        return False


@dataclass
class Overlapped:
    """One epoch's validation, running beside the next epoch's training."""

    snapshot: Snapshot
    header: str  # the validator's column names: its bar's, which is not drawn
    future: Future | None = None  # set once queued
    held: list[logging.LogRecord] = field(default_factory=list)
    seconds: float | None = None  # the validation's own time, on its thread
    ended: float | None = None  # when it ended (time.time()): the results.csv row's time
    settled: float = 0.0  # seconds the training waited for it before a CUDA graph capture (``settle``)

    def settle(self, behind: Future | None = None) -> None:
        """Wait for the validation to end, and for ``behind`` (what the validation thread runs after it), leaving its
        result (and exception) to ``result``: the training thread is about to capture a CUDA graph. A device-wide sync
        in another thread (``torch.cuda.synchronize()``: a validator callback may make one) invalidates a capture
        (cudaErrorStreamCaptureInvalidated) whatever its mode; the validation's own syncs are its stream's. The
        seconds are the training's (its epoch's time holds them), not counted as waited for the validation."""
        t0 = time.perf_counter()
        processes.wait_all(f for f in (self.future, behind) if f is not None)
        self.settled += time.perf_counter() - t0

    def result(self) -> tuple[dict, float]:
        """The validation's metrics and the seconds the caller waited for them now; its exception, raised here."""
        t0 = time.perf_counter()
        metrics = processes.result(self.future)
        return metrics, time.perf_counter() - t0

    def print_held(self) -> None:
        """The validator's lines, in the training thread, under one that names the epoch they are of."""
        LOGGER.info(f"yolofeed: epoch {self.snapshot.epoch + 1}'s validation, run while epoch "
                    f"{self.snapshot.epoch + 2} trained:")
        if self.header:
            LOGGER.info(self.header)
        for record in self.held:
            LOGGER.handle(record)


def run_beside(overlapped: Overlapped, validator: Callable[[Any], dict], trainer: Any, ready: torch.cuda.Event | None,
               stream: torch.cuda.Stream | None) -> dict:
    """Run in the validation thread: ``validator`` on the trainer as it was at the snapshot's epoch's end
    (``seam.validator_view``), on ``stream`` once the training thread's stream reached ``ready`` (the snapshot made),
    its bar not drawn, its timers on its stream, its lines held in ``overlapped``."""
    view = seam.validator_view(trainer, overlapped.snapshot)
    held = _Held()
    LOGGER.addFilter(held)
    t0 = time.perf_counter()
    try:
        with seam.validation_beside():
            if stream is None:
                metrics = validator(view)
            else:
                stream.wait_event(ready)
                try:
                    with torch.cuda.stream(stream):
                        metrics = validator(view)
                finally:  # nothing of it left queued once the snapshot is let go, whatever happened
                    stream.synchronize()
    finally:
        LOGGER.removeFilter(held)
        overlapped.held = held.records
        overlapped.seconds, overlapped.ended = time.perf_counter() - t0, time.time()
    return metrics


def _bytes(tensors: Any) -> int:
    """The bytes of the tensors among ``tensors``."""
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def reason_not(trainer: Any, largest_batch: int, per_image: float) -> str | None:
    """Why this epoch's validation cannot run beside the next epoch (the module's doc), or None where it can.

    Args:
        largest_batch: images in the validation's largest batch.
        per_image: a training pass's peak bytes per image (0: not known, no check): the validation's passes need at
            most that times ``largest_batch`` of free GPU memory, and the copies of the EMA and of the optimiser's
            state kept for an epoch their own size.
    """
    if not seam.overlap_serves():
        return f"Ultralytics before {seam.VAL_OVERLAP_SINCE} takes the model it validates otherwise"
    if trainer.epoch + 1 >= trainer.epochs:
        return "the last epoch"
    if seam.could_stop(trainer):
        return "early stopping may stop the run after it"
    if trainer.args.time:
        return "time= counts the epochs from their times"
    if trainer._nan_fitness_epoch is not None:
        return f"epoch {trainer._nan_fitness_epoch}'s fitness was not a number: Ultralytics' NaN recovery runs in place"
    readers = seam.epoch_readers(trainer) if trainer.val_overlap is None else []
    if readers:
        return (f"{', '.join(readers)} read{'s' if len(readers) == 1 else ''} each epoch as it ends; val_overlap=True "
                "runs such callbacks an epoch late")
    device = trainer.device
    ema = seam.trainer_ema(trainer).ema.state_dict().values()
    if device.type == "cuda" and per_image:  # the validation's passes, and the copies kept for an epoch
        kept = _bytes(ema) + _bytes(t for state in trainer.optimizer.state.values() for t in state.values())
        if torch.cuda.mem_get_info(device)[0] < largest_batch * per_image + kept:
            return "too little free GPU memory beside the training"
    tensors = [v for v in ema if v.is_floating_point()]
    loss = seam.epoch_end_state(trainer)["loss"]
    if isinstance(loss, torch.Tensor):
        tensors.append(loss.detach())
    if tensors and not all_finite(tensors):
        return "the loss or the EMA is not finite"
    return None


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every value of ``tensors`` is finite: one host sync, where a check a tensor was two kernel launches each
    (about a thousand at yolo11n's epoch end: 24 ms on an H100's host). Each tensor times 0 is 0 where finite and NaN
    at a NaN or an infinity; the L2 norms of those, all in one multi-tensor pass, are 0 or NaN: no value is large
    enough to overflow them, whatever its dtype."""
    device = tensors[0].device
    norms = torch._foreach_norm(torch._foreach_mul(tensors, 0.0), 2)
    return bool(torch.stack([n.to(device, torch.float32) for n in norms]).isfinite().all())

"""When and where a run validates: every ``val_period``-th epoch, in a thread of its own on one CUDA GPU, and beside
the next epoch's training (``val_overlap``).

``Validating`` stands before Ultralytics' trainer in ``FastTrainer``'s bases and overrides the three methods the epoch's
end goes through (``validate``, ``save_metrics``, ``run_callbacks``) and ``get_validator``; the thread is
``ValidationThread`` (train/validation.py), an epoch validated beside the next is ``overlap.Overlapped``
(train/overlap.py). Its options (``validate_beside``, ``val_period``, ``val_overlap``, ``batched_val_metrics``) are
``FastTrainer``'s. What it costs: a validation in the training thread holds the step for its length (0.8-3.1 s an epoch
for yolo11n on 10k images); beside the next epoch its GPU work costs that epoch about 0.2 s (BENCHMARKS.md, "The whole
run").
"""

from __future__ import annotations

import functools
from concurrent.futures import Future

import numpy as np
import torch

from yolofeed import processes
from yolofeed.train import options, overlap, val_metrics
from yolofeed.train.validation import ValidationThread, count_flops_ahead, loader_shapes, warm
from yolofeed.ultralytics_seam import (
    LOGGER,
    RANK,
    batches_per_step,
    end_epoch_late,
    flops_counted_on_device,
    forget_loss,
    may_stop,
    stop_asked,
    train_side,
    unwrap_model,
    validation_loader,
    validation_models,
)

CLOSE_WAIT_S = 30.0  # how long a stopped run waits for its validation thread to end (a validation batch, at most)


def _nothing() -> None:
    """A job for the validation thread: done once what was queued before it is."""


class Validating:
    """The validation schedule of a ``FastTrainer``: a mixin before Ultralytics' trainer (its state below)."""

    _validations: ValidationThread | None = None  # where validations run (None: the training thread)
    _warm_validations_after: int | None = None  # training batches left before their set-up starts beside them
    _validations_due = False  # their set-up is queued at the warm-up's end (``FastTrainer._set_up_beside``)
    _final_warm: list | None = None  # best.pt's set-up left (its FLOPs count, a shape a job), one after each validation
    _overlapped: overlap.Overlapped | None = None  # the epoch validated beside this one (val_overlap)
    _holding = False  # from that epoch's validate to its on_fit_epoch_end: its row, checkpoints and callbacks wait
    _overlap_stream: torch.cuda.Stream | None = None  # the CUDA stream validations beside the training run on
    _overlap_off: str | None = None  # the last reason an epoch was not overlapped (said once each)
    _nan_fitness_epoch: int | None = None  # an epoch validated beside the next whose fitness was not a number
    val_overlapped: dict | None = None  # per epoch overlapped: its validation's seconds and the seconds waited for it

    def _stop_validations(self, finished: bool) -> None:
        """The validation thread closed and waited for (``CLOSE_WAIT_S`` at most), once the loop ended (``finished``)
        or stopped; an epoch validated beside the next that did not end is said so, after what its validation
        printed. Nothing the second time."""
        job, self._overlapped, self._holding = self._overlapped, None, False
        if self._validations is not None:
            if not finished:  # an error or Ctrl-C: what runs there stops at its next batch or shape
                self._validations.cancel()
            if not self._validations.close(wait=CLOSE_WAIT_S):
                LOGGER.warning(f"yolofeed: the validation thread did not stop within {CLOSE_WAIT_S:g} s; going on "
                               "without it")
                processes.left_running("the validation thread")
            self._validations = None
            self._final_warm = None  # best.pt's copy, if no validation came
        if job is not None:
            if job.future is not None and job.future.done() and job.held:
                job.print_held()  # what it said before it stopped (a failure's warning, say)
            done = job.future
            ended = done is not None and done.done() and not done.cancelled() and done.exception() is None
            n = job.snapshot.epoch + 1
            LOGGER.warning(f"yolofeed: epoch {n}'s validation, run beside the training, "
                           + (f"ended, but the run stopped before epoch {n + 1}'s end, where it is written: "
                              if ended else "did not end: ") + "its results.csv row and checkpoints are not written")

    def get_validator(self):
        """Ultralytics' validator; with ``batched_val_metrics`` a detection validator gathers each batch's statistics
        at once (``train/val_metrics.py``: the same statistics, one IoU and one copy to the host a batch)."""
        validator = super().get_validator()
        if self.batched_val_metrics:
            val_metrics.install(validator)
        return validator

    def validate(self):
        """Ultralytics' validation every ``val_period``-th epoch, at the last, and wherever its early stopping may stop
        the run (``possible_stop``, ``stop``); the epochs between are not validated.

        An epoch not validated writes ``nan`` for every validation metric in results.csv (and hands it to the loggers)
        and has no fitness: best.pt stays the best validated epoch's (before the first validation it follows last.pt,
        as with ``val=False``), and ``patience`` counts epochs since the best validated one, checked at validations.

        With ``val_overlap`` an epoch's validation may run while the next epoch trains (``_validate_beside_next``); its
        row, checkpoints and callbacks then come at the next epoch's end, here, before anything of that epoch.
        """
        stopping = stop_asked(self)
        self._end_overlapped_epoch()
        if stop_asked(self) and not stopping:  # the epoch ended late asked to stop (a callback): stock stopped there
            return self._discard_epoch()
        epoch = self.epoch + 1
        if self.val_period <= 1 or epoch % self.val_period == 0 or epoch >= self.epochs or may_stop(self):
            if self._validate_beside_next():
                return self.metrics, None  # held: save_metrics, save_model and run_callbacks wait for it
            return self._in_validation_thread(super().validate)
        return {k: float("nan") for k in self.metrics}, None

    def save_metrics(self, metrics):
        """Ultralytics' results.csv row; an epoch validated beside the next writes its own when it ends."""
        if not self._holding:
            super().save_metrics(metrics)

    def run_callbacks(self, event: str):
        """Ultralytics' callbacks; an epoch validated beside the next runs its ``on_model_save`` and
        ``on_fit_epoch_end`` when it ends (``seam.end_epoch_late``)."""
        if self._holding and event in ("on_model_save", "on_fit_epoch_end"):
            if event == "on_fit_epoch_end":  # the loop's last word on this epoch: it has set epoch_time
                if self._overlapped is not None:
                    self._overlapped.snapshot.epoch_time = getattr(self, "epoch_time", None)
                self._holding = False
            return
        super().run_callbacks(event)

    # -- an epoch's validation beside the next epoch (val_overlap, train/overlap.py) ---------------------------------
    def _validate_beside_next(self) -> bool:
        """Start this epoch's validation in the validation thread, on a snapshot of the EMA, and return at once (True);
        False where it cannot (``overlap.reason_not``: said once a reason) or without ``val_overlap``."""
        if self.val_overlap is False or self._validations is None or not self._validations.alive:
            return False
        loader = validation_loader(self)
        largest = max((n for n, _, _ in loader_shapes(loader)), default=int(getattr(loader, "batch_size", 0) or 1))
        cuda = self.device.type == "cuda"
        per_image = torch.cuda.max_memory_allocated(self.device) / max(int(self.args.batch), 1) if cuda else 0.0
        why = overlap.reason_not(self, largest, per_image)
        if why is not None:
            if why != self._overlap_off and self.epoch + 1 < self.epochs:
                LOGGER.info(f"yolofeed: epoch {self.epoch + 1} is validated before the next starts ({why})")
            self._overlap_off = why
            return False
        snapshot = overlap.Snapshot.of(self)
        ready = stream = None
        if cuda:
            ready = torch.cuda.Event()
            ready.record()  # on the training thread's stream, after the snapshot's copies
            self._overlap_stream = stream = self._overlap_stream or torch.cuda.Stream(self.device)
        job = overlap.Overlapped(snapshot, header=getattr(self.validator, "get_desc", str)())
        job.future = self._submit_validation(overlap.run_beside, job, self.validator, self, ready, stream)
        self._overlapped, self._holding = job, True
        return True

    def _discard_epoch(self):
        """The run stops after the epoch that just ended late (a callback at its end set ``stop``), where stock's run
        stopped: nothing of this epoch, trained while that one's validation ran, is validated or written (no row,
        checkpoint or callback at its end: held as an overlapped epoch's are, never ended), and the trainer's epoch is
        that one's again (``final_eval`` and its callbacks read it)."""
        LOGGER.info(f"yolofeed: the run stops after epoch {self.epoch}, as asked at its end (which val_overlap runs "
                    f"during the next epoch): epoch {self.epoch + 1}'s training is not kept")
        self.epoch -= 1
        forget_loss(self)  # nor is its loss: Ultralytics' NaN recovery, after this, reads it
        self._holding = True  # with no epoch overlapped: the loop's row, checkpoints and callbacks of this one, none
        return self.metrics, None

    def _settle_overlapped(self) -> None:
        """Before a CUDA graph capture in the training thread: wait for the epoch validated beside this one, if any,
        and for best.pt's set-up pass queued behind it (``Overlapped.settle``); it is still ended at this epoch's
        end."""
        job = self._overlapped
        if job is None or job.future is None:
            return
        threads = self._validations
        job.settle(threads.submit(_nothing) if threads is not None and threads.alive else None)

    def _end_overlapped_epoch(self) -> None:
        """Wait for the epoch validated beside this one (usually ended by now), print its lines and end it as the
        loop would have (``seam.end_epoch_late``): its row, early stopping's check, its checkpoints, its callbacks."""
        job = self._overlapped
        if job is None:
            return
        try:
            metrics, waited = job.result()
        except BaseException:  # Ctrl-C here, or the validation failed: _do_train says what was not written
            self._validations.cancel()
            raise
        self._overlapped = None
        job.print_held()
        end_epoch_late(self, job.snapshot, metrics, job.ended)
        if self._nan_fitness_epoch is None and not np.isfinite(float(self.fitness)):
            self._nan_fitness_epoch = epoch = job.snapshot.epoch + 1
            LOGGER.warning(f"yolofeed: epoch {epoch}'s fitness is {self.fitness} with its loss and EMA finite; it was "
                           "validated beside the next epoch, so Ultralytics' NaN recovery (reload last.pt and train "
                           "the epoch again) did not run for it. Every later epoch is validated before the next "
                           "starts, where it does, and a resume too (val_overlap=False does so from the start)")
            if RANK in (-1, 0):  # the run's options as it now uses them: a resume validates in place too
                options.record(self.save_dir, {**self.run_options(), "val_overlap": False})
        self.val_overlapped = {**(self.val_overlapped or {}), job.snapshot.epoch + 1: {
            "val_s": job.seconds, "waited_s": waited, "settled_s": job.settled}}

    # -- validation beside the training ---------------------------------------------------------
    def _validates_beside(self) -> bool:
        """Whether validations run in a thread of their own: with ``validate_beside`` on one CUDA GPU (under DDP a
        validation gathers across ranks in the ranks' own threads; the CPU has no cuDNN set-up to pay ahead)."""
        return bool(self.validate_beside) and RANK == -1 and self.device.type == "cuda"

    def _say_validation_plan(self) -> None:
        """Once a run, before the first epoch (``on_pretrain_routine_end``): an option of when to validate that this
        run cannot follow, said."""
        if RANK not in (-1, 0):
            return
        if self.val_period > 1 and not self.args.val:  # stock's val=False: the last epoch alone
            LOGGER.info(f"yolofeed: val_period={self.val_period} changes nothing with val=False, which validates the "
                        "last epoch alone, as yolo train does")
        if self.val_overlap and not self._validates_beside():
            LOGGER.info("yolofeed: val_overlap needs validations in a thread of their own (validate_beside, on one "
                        "CUDA GPU): each epoch is validated before the next starts")

    def _start_validation_thread(self) -> None:
        """Before the first epoch (``on_pretrain_routine_end``, or earlier in the warm-up: ``_set_up_beside``): the
        thread validations will run in. Their set-up starts in the warm-up where the step's graph was captured ahead
        of the first epoch; else beside the training once its CUDA graphs are captured: the graphed step at the first
        batch, FastMuSGD at its second optimiser step (every ``accumulate`` batches). A capture in the default global
        mode (``make_graphed_callables``') fails where another thread allocates meanwhile; FastMuSGD's and the
        augmentation's capture in the thread-local mode."""
        if not self._validates_beside() or self._validations is not None:  # started in the warm-up already
            return
        self._validations = ValidationThread(self.device)
        self._warm_validations_after = 2 * batches_per_step(self) + 1

    def _count_to_validation_warm_up(self) -> None:
        """After each training batch (``on_train_batch_end``): start the validations' set-up once the captures are
        made."""
        if self._warm_validations_after is None:
            return
        self._warm_validations_after -= 1
        if self._warm_validations_after <= 0:
            self._warm_validations()

    def _warm_validations(self) -> None:
        """Queue one blank pass at each shape every epoch's validation will meet, on a copy of the model it runs (made
        here, in the training thread, between two steps); the validation thread runs it while training goes on.
        best.pt's set-up for the final validation (its load's FLOPs count, ``count_flops_ahead``, then its passes)
        waits for the first validation (``_in_validation_thread``): queued now, it would hold that validation back at
        the first epoch's end (4 s of yolo11n's on the 10k set). It goes in a job at a time, one behind each
        validation: all at once they outlast the next epoch's training, and its validation would wait for them (1.2 s
        on the 10k set). Every epoch's passes wait for the short batches' set-up (train/short_batches.py), where it
        runs: cuDNN builds one plan at a time whichever thread asks, and the first epoch's last batch waits for that
        set-up, not for the validations' (the first validation comes after that batch anyway)."""
        self._warm_validations_after = None
        if self._validations is None:
            return
        every_epoch, final = validation_models(self)
        # a training pass's peak per image bounds an inference pass's: the set-up never takes what training needs
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else 0
        per_image = peak / max(int(self.args.batch), 1)
        shapes = loader_shapes(validation_loader(self))
        args = (shapes, train_side(self.args.imgsz), self.device, per_image)
        short = unwrap_model(self.model).__dict__.get("_short")
        self._validations.submit(warm, [every_epoch], *args, cancelled=self._validations.cancelled,
                                 after=None if short is None else short.set_up)
        model, autocast, dtype, first_one = final
        parts = [[]] if first_one else []  # its batch-1 warm-up first, as AutoBackend's
        parts += [[shape] for shape in shapes]
        # in the order the final validation meets them: its load's FLOPs count, its batch-1 warm-up, its shapes
        self._final_warm = [functools.partial(count_flops_ahead, [model], self.device)] \
            if flops_counted_on_device() else []
        self._final_warm += [functools.partial(warm, [(model, autocast, dtype, first_one and k == 0)], part,
                                               *args[1:], LOGGER.debug) for k, part in enumerate(parts)]

    def _in_validation_thread(self, fn, *args, final: bool = False, **kwargs):
        """``fn(*args, **kwargs)`` in the validation thread, waited for (its exception raised here), where there is
        one and it runs; else here."""
        if self._validations is None or not self._validations.alive:
            return fn(*args, **kwargs)
        done = self._submit_validation(fn, *args, final=final, **kwargs)
        try:
            return processes.result(done)
        except BaseException:  # Ctrl-C here, or the validation failed: nothing more runs beside a stopped run
            self._validations.cancel()
            raise

    def _submit_validation(self, fn, *args, final: bool = False, **kwargs) -> Future:
        """Queue ``fn(*args, **kwargs)`` in the validation thread (there is one, alive); its future. A validation before
        the set-up was queued (an epoch of few batches) queues it first. best.pt's set-up goes in a shape at a time,
        each behind a validation, beside the next epoch; what is left of it before the ``final`` one."""
        if self._warm_validations_after is not None:
            self._warm_validations()
        pending = self._final_warm or []
        if final:
            for part in pending:
                self._validations.submit(part, cancelled=self._validations.cancelled)
            pending = []
        validator = getattr(self, "validator", None)
        if validator is not None and self._validations.check_cancelled not in validator.callbacks["on_val_batch_start"]:
            validator.add_callback("on_val_batch_start", self._validations.check_cancelled)
        done = self._validations.submit(fn, *args, **kwargs)
        if pending:
            self._validations.submit(pending.pop(0), cancelled=self._validations.cancelled)
        self._final_warm = pending or None
        return done

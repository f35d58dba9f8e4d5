"""cuDNN's plans for the full batch made while Ultralytics builds the trainer, in the thread that later makes the
step's graph and forwards the short batches.

cuDNN builds a plan for each convolution the first time a thread meets its shape: yolo11n's full batch of 128 at
640 px costs 6-7 s of the warm-up before the first epoch (BENCHMARKS.md, "The whole run"), and nothing else can run
on the GPU's behalf meanwhile. The forward's plans are kept per calling thread; the backward's by the autograd
engine's device thread, which every thread's backward runs in (BENCHMARKS.md, "First epoch"). Before the warm-up,
the trainer's build takes about 5 s (Ultralytics' checks and imports, CUDA's start, the data's check) in which cuDNN
is idle.

``Plans`` uses that window. The trainer's constructor starts it before Ultralytics' (``start``): a worker thread
runs one blank forward and backward pass (train/warmup.py's ``passes``) at the full batch on a model of the same
layers (``seam.model_ahead``: built from the run's model and data yaml, before Ultralytics seeds the random streams,
which it reseeds). The warm-up's own full-batch pass and the step graph's capture then run in that thread (``run``,
under the training thread's autocast, grad mode and CUDA stream): its forward plans are there, and the graph replays
from any thread. The thread is then handed to the short batches (train/short_batches.py), whose forward it runs.
Where the graph will not be captured ahead (``graphed_step`` off, DDP, gradient accumulation...), the step runs eager
in the training thread, which needs the forward's plans itself: the warm-up waits for the early pass (its backward
plans serve) and goes on as before.

Nothing of the early pass is kept: its model is a throwaway with its own weights, and cuDNN's flags are set to what
Ultralytics' ``init_seeds`` sets a moment later (``seam.deterministic_ahead``), since a plan is made for one setting of
them. A pass that fails (out of memory, a layer the early model lacks) is said at debug level and costs nothing else.
A fork waits for the early pass (a first run builds its packs, whose workers fork, while it may run), and a trainer
whose build fails sets back what was set ahead.
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from yolofeed import processes
from yolofeed.errors import first_line
from yolofeed.train import graphed, short_batches
from yolofeed.train.short_batches import as_here
from yolofeed.train.validation import on_device
from yolofeed.train.warmup import passes
from yolofeed.ultralytics_seam import (
    LOGGER,
    RANK,
    args_ahead,
    autocast_asked,
    deterministic_ahead,
    model_ahead,
    one_gpu_asked,
    train_side,
    trains_channels_last,
)

CLOSE_WAIT_S = 30.0  # how long a closing thread is waited for (a pass at the full batch, at most)


class Plans:
    """The worker thread (see the module's doc), its first job the early pass of ``model`` (on the CPU) at ``batch``
    images of ``imgsz`` on ``device`` under ``amp`` (as ``warmup.passes`` takes it)."""

    def __init__(self, model: nn.Module, batch: int, imgsz: int, device: torch.device, amp: bool | torch.dtype,
                 undo_ahead: Callable[[], None] | None = None):
        """``undo_ahead``, where given, sets back what was set ahead for it (``seam.deterministic_ahead``'s)."""
        self.device = device
        self.early_s: float | None = None  # the early pass's seconds, once made
        self.undo_ahead = undo_ahead or (lambda: None)
        # the worker while this object holds it; closed when this object goes or the interpreter ends, if not before
        # (a trainer built and never trained; a failure between the build and the loop): never left inside torch
        self._held: list[processes.Worker | None] = [processes.Worker("yolofeed-plans", first=on_device(device))]
        weakref.finalize(self, _close, self._held)
        self.early = self._held[0].submit(self._early, model, batch, imgsz, amp)
        _early_passes.add(self)

    @property
    def worker(self) -> processes.Worker | None:
        return self._held[0]

    def _early(self, model: nn.Module, batch: int, imgsz: int, amp: bool | torch.dtype) -> None:
        start = time.perf_counter()
        try:
            with processes.switched_often():  # beside the trainer's build, busy in Python (imports, checks)
                passes(model.to(self.device).train(), [batch], imgsz, self.device, amp)
        except Exception as e:  # out of memory, cuDNN, a layer the model ahead lacks: the warm-up makes them
            LOGGER.debug(f"yolofeed: no early cuDNN set-up ({first_line(e)})")
        finally:
            del model
            self.early_s = time.perf_counter() - start

    def serves(self, device: torch.device) -> bool:
        """Whether its plans serve a trainer on ``device`` (Ultralytics' choice; ``cuda`` alone: the current one)."""
        index = device.index if device.index is not None else torch.cuda.current_device() \
            if device.type == "cuda" else None
        return device.type == "cuda" and index == self.device.index

    @property
    def alive(self) -> bool:
        return self.worker is not None and self.worker.alive

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in the thread, behind the early pass, under this thread's autocast, grad mode and
        CUDA stream; waited for, its exception raised here. Here where the thread is gone."""
        if not self.alive:
            return fn(*args, **kwargs)
        return processes.result(self.worker.submit(as_here(self.device), fn, *args, **kwargs))

    def wait(self) -> None:
        """Wait for the early pass (a training thread that will make its own forward's plans waits, rather than make
        them beside it: cuDNN plans one convolution at a time)."""
        if self.worker is not None:
            with contextlib.suppress(Exception):
                processes.result(self.early)

    def hand_over(self) -> processes.Worker | None:
        """The thread, for its next owner (the short batches), which closes it; None where it is gone."""
        if not self.alive:
            return None
        worker, self._held[0] = self._held[0], None
        return worker

    def close(self) -> None:
        """Ended once what runs is done, waited for (``CLOSE_WAIT_S`` at most; the caller defers signals)."""
        _close(self._held)


def _close(held: list[processes.Worker | None]) -> None:
    """``Plans.close``, and its finalizer's: the worker ``held`` holds, if any, ended and waited for."""
    worker, held[0] = held[0], None
    if worker is not None:
        worker.cancel()
        if not worker.close(CLOSE_WAIT_S):
            LOGGER.warning(f"yolofeed: the cuDNN plans' thread did not stop within {CLOSE_WAIT_S:g} s; going on "
                           "without it")
            processes.left_running("the cuDNN plans' thread")


_early_passes: weakref.WeakSet[Plans] = weakref.WeakSet()  # each Plans made, while it lives


def _early_passes_done() -> None:
    """Before this process forks (the pack build's workers: a first run builds its packs while the early pass runs),
    each early pass is waited for (``CLOSE_WAIT_S`` at most): a child forked while a thread is inside torch and CUDA
    inherits the locks that thread held, held for ever."""
    for p in list(_early_passes):
        worker = p.worker
        if worker is not None and worker.is_current():
            continue  # a job of its own forking: it cannot wait for itself
        with contextlib.suppress(Exception):
            p.early.result(timeout=CLOSE_WAIT_S)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_early_passes_done)


class PlansAhead:
    """The trainer's side of the early plans' thread (a mixin of ``FastTrainer``): where the warm-up's pass and the
    capture run, and the thread closed once no one needs it."""

    _plans: Plans | None = None  # the early plans' thread while the trainer holds it (``start``)
    graphed_step: bool

    def _plans_serve(self) -> None:
        """At the warm-up's start: the early plans' thread (train/plans.py) makes the full batch's pass and the step's
        capture where the graph will be captured ahead and this thread holds no state that one would not share; else
        its early pass is waited for (its backward's plans serve this thread's pass) and it ends."""
        if self._plans is None:
            return
        if not (self.graphed_step and graphed.why_not(self) is None and self._plans.alive
                and not short_batches.modes_here()):
            self._plans.wait()
            self._close_plans()

    def _in_plans_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in the early plans' thread while the trainer holds it, else here."""
        return fn(*args, **kwargs) if self._plans is None else self._plans.run(fn, *args, **kwargs)

    def _close_plans(self) -> None:
        """The early plans' thread closed, waited for (a pass or a capture at most; a Ctrl-C meanwhile is acted on
        after: cut short, the interpreter could exit while the thread is inside torch)."""
        plans_thread, self._plans = getattr(self, "_plans", None), None
        if plans_thread is not None:
            with processes.signals_deferred():
                plans_thread.close()


def start(trainer: Any, cfg: Any, overrides: dict[str, Any] | None) -> Plans | None:
    """The early pass started for ``trainer`` (a ``FastTrainer`` whose Ultralytics constructor has not run yet) with
    Ultralytics' ``cfg`` and ``overrides``, where the warm-up will run on one CUDA GPU with the graphed step; None
    otherwise (DDP, the CPU, a resume, AutoBatch, a model or data yaml not readable as they are, any other task than
    detection, a model compiled, quantised or distilled), or where anything fails: the warm-up then makes every plan,
    as before."""
    if RANK != -1 or not (trainer.warm_up and trainer.graphed_step) or not torch.cuda.is_available():
        return None
    try:
        args = args_ahead(cfg, overrides)
        index = one_gpu_asked(args.device)
        if (index is None or args.resume or args.task != "detect" or not isinstance(args.batch, int)
                or args.batch < 1 or args.compile or args.multi_scale or getattr(args, "distill_model", None)
                or getattr(args, "quantize", None)):  # each changes the model after it is built
            return None
        model = model_ahead(args)  # before init_seeds: it reseeds what the random weights drew
        if model is None:
            return None
        if trains_channels_last(args):  # a plan is made for one layout: the trainer's
            model = model.to(memory_format=torch.channels_last)
        undo = deterministic_ahead(bool(args.deterministic), args.seed)
        try:
            return Plans(model, args.batch, train_side(args.imgsz), torch.device("cuda", index), autocast_asked(args),
                         undo)
        except BaseException:
            undo()
            raise
    except Exception as e:  # anything: Ultralytics' own checks say what is wrong with the arguments
        LOGGER.debug(f"yolofeed: no early cuDNN set-up ({type(e).__name__}: {e})")
        return None

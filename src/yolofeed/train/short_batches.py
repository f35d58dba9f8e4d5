"""The epoch's short batches (its last, smaller one): their convolutions as GEMMs in the training thread while that
costs less than their cuDNN set-up (``InPlace``), else forwarded in a thread of their own, whose cuDNN set-up is made
beside an epoch (``ShortBatches``).

cuDNN plans a convolution's forward once per calling thread and input shape, and its backward once per shape in the
autograd engine's device thread, which every thread's backward runs in (BENCHMARKS.md, "First epoch": yolo11n's first
pass at batch 16 takes 1.76 s forward and 2.65 s backward, cold). With the graphed step (train/graphed.py) the full
batch replays a graph captured before the first epoch, and only a batch of another size, the epoch's last, runs
eager; made in the training thread, its plans hold the first step back by 7-9 s (yolo11n on the 10k set of "The
whole run").

``ShortBatches`` makes them beside an epoch (the first, where it takes them at once): a worker thread runs one blank
forward and backward pass at each such size on a copy of the model (train/warmup.py's ``passes``), on a CUDA stream of
its own, while the training goes on; and the training model's ``predict`` at those sizes (``GraphedPredict``) then runs
in that worker, waited for, under the training thread's autocast, grad mode and CUDA stream: the same calls on the same
tensors, so the same values and the same autograd graph, whose backward the training thread runs as before. Where the
training thread holds a state the worker would not share (a torch function or dispatch mode, saved-tensor hooks, the
profiler), the batch runs in the training thread (``takes``). What it costs the training: the worker's host time on
another core; the backward's plans in the autograd device thread, where the training's own backward waits for the node
running ahead of it; and, until memory is next released, up to a short batch's activations cached for the worker's
stream.

``InPlace`` (the default, ``UNPLANNED``) takes no set-up at all (train/unplanned.py: no cuDNN plan) at a higher cost
a batch, and makes a ``ShortBatches`` beside a later epoch where the run's epochs left would spend more on the GEMMs
than the plans cost: short runs keep the GEMMs, long ones make the plans beside their third epoch.

Either serves once the step's graph is captured ahead of the first epoch (``BESIDE``; trainer.py's ``_warm_up``), since
a capture made beside the worker's passes could be invalidated by them; the captures made later (the augmentation's,
FastMuSGD's) are in the thread-local mode, which another thread's work does not invalidate, and the worker never
synchronises the device.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch
from torch import nn

from yolofeed import processes
from yolofeed.errors import first_line
from yolofeed.train.unplanned import Unplanned
from yolofeed.train.validation import on_device
from yolofeed.train.warmup import passes, training_copy
from yolofeed.ultralytics_seam import LOGGER

BESIDE = True  # False: the warm-up makes the short batches' plans in the training thread, before the first epoch
UNPLANNED = True  # the short batches' convolutions as GEMMs in the training thread (``InPlace``) while they cost less
PLANS_COST_S = 2.5  # what the short batches' plans made beside an epoch cost it (yolo11n at 640 on an H100: 2.5-2.8 s)
# what a short batch as GEMMs costs beyond cuDNN's, in its forward's time (yolo11n at 640 on an H100: at 16 images
# 94 ms against 28 with a forward of 37, 1.8; at 64, 252 against 40 with 74, 2.9)
GEMM_PER_FORWARD = 2.5
CLOSE_WAIT_S = 30.0  # how long a run's end waits for the worker (a pass at a short batch's size, at most)


class ShortBatches:
    """The worker that forwards the training model's batches of ``sizes`` (see the module's doc)."""

    def __init__(self, model: nn.Module, sizes: list[int], imgsz: int, device: torch.device, amp: bool | torch.dtype,
                 parts: dict[str, float] | None = None, worker: processes.Worker | None = None):
        """``parts``, where given (the warm-up's), gets ``beside_s``: the set-up's seconds in the worker, once made.
        ``worker``, where given (the early plans' thread: train/plans.py, whose forward plans are there), is the
        worker, this object's to close; else one is started."""
        self.sizes = frozenset(sizes)
        self.device = device
        self.parts = parts
        self._failed = False
        # the copy is made here, in the training thread's warm-up, before the worker starts (a copy that runs out of
        # memory leaves no thread); its tensors are written on this thread's stream, which the worker's waits for
        twin = training_copy(model)
        copied = None
        if device.type == "cuda":
            copied = torch.cuda.Event()
            copied.record(torch.cuda.current_stream(device))
        self._worker = worker or processes.Worker("yolofeed-short-batches", first=on_device(device))
        self._set_up_done = self._worker.submit(self._set_up, twin, copied, sorted(sizes, reverse=True), imgsz, amp)

    def _set_up(self, twin: nn.Module, copied: torch.cuda.Event | None, sizes: list[int], imgsz: int,
                amp: bool | torch.dtype) -> None:
        """The passes, in the worker, on a stream of its own, after the copy is written: waited for on that stream,
        never the device (a device-wide sync would invalidate a capture in another thread), and before the copy's
        memory goes back (its batch norms' kernels write to it)."""
        start = time.perf_counter()
        stream = torch.cuda.Stream(self.device) if copied is not None else None
        try:
            if stream is not None:
                stream.wait_event(copied)
            # beside the training thread, busy in Python between its graphs' replays
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext(), \
                    processes.switched_often():
                passes(twin, sizes, imgsz, self.device, amp)
        except Exception as e:  # out of memory, cuDNN, anything: that batch pays its own set-up (nothing kept)
            LOGGER.warning(f"yolofeed: skipped the set-up of batch sizes {', '.join(map(str, sizes))} beside an "
                           f"epoch ({first_line(e)}); those batches "
                           "pay it when they come")
        finally:
            if stream is not None:
                stream.synchronize()
            if self.parts is not None:
                self.parts["beside_s"] = time.perf_counter() - start

    @property
    def set_up(self) -> Future:
        """The set-up's job: done once its passes are, or skipped."""
        return self._set_up_done

    def takes(self, x: torch.Tensor) -> bool:
        """Whether ``x`` is a batch of one of the sizes, under no state of this thread the worker would not share, and
        the worker serves (a worker that could not start, on its CUDA device say, is said once and serves no batch:
        they run in the training thread)."""
        if x.shape[0] not in self.sizes or not torch.is_grad_enabled() or modes_here():
            return False
        return self.serves()

    def serves(self) -> bool:
        """Whether the worker serves (one that failed is said once)."""
        if self._failed:
            return False
        if self._worker.failed is not None:
            self._failed = True
            e = self._worker.failed
            LOGGER.warning(f"yolofeed: the short batches' thread failed ({first_line(e)}); those batches run in the "
                           "training thread")
            return False
        return self._worker.alive

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in the worker, behind its set-up, under this thread's autocast, grad mode and CUDA
        stream; waited for (Ctrl-C cuts the wait short), its exception raised here."""
        return processes.result(self._worker.submit(as_here(self.device), fn, *args, **kwargs))

    def close(self) -> None:
        """Ended once what runs is done (what is queued is skipped), waited for (``CLOSE_WAIT_S`` at most; the caller
        defers signals)."""
        self._worker.cancel()
        if not self._worker.close(CLOSE_WAIT_S):
            LOGGER.warning(f"yolofeed: the short batches' thread did not stop within {CLOSE_WAIT_S:g} s; going on "
                           "without it")
            processes.left_running("the short batches' thread")


class InPlace:
    """The training model's batches of ``sizes`` run in the training thread with their convolutions as GEMMs
    (train/unplanned.py), which need no cuDNN plan, until the run's remaining epochs would spend more on them than the
    plans cost: then the plans are made beside an epoch (``plan``: a ``ShortBatches``), which serves once they are.

    The GEMMs take no set-up but each such batch costs more (yolo11n at 640 on an H100: 94 ms at 16 images against
    cuDNN's 28, 250 against 40 at 64), and the plans made beside an epoch cost it about ``PLANS_COST_S`` once
    (BENCHMARKS.md, "First epoch"). So the short batches run as GEMMs and each forward is timed; at each epoch's start
    (``epoch_starts``) the batches left, at ``GEMM_PER_FORWARD`` times the latest forward each (the first, which meets
    its kernels and memory cold, not counted), are weighed against the plans' cost. A short run keeps the GEMMs; a
    long one makes the plans beside its third epoch, where the worker would have made them beside its first.
    ``ShortBatches``' interface."""

    def __init__(self, sizes: list[int], plan: Callable[[], ShortBatches] | None = None):
        self.sizes = frozenset(sizes)
        self.set_up: Future = Future()
        self.set_up.set_result(None)
        self._plan = plan
        self.planned: ShortBatches | None = None
        self._timed: list[tuple[Any, Any]] = []  # (start, end) of each forward as GEMMs, CUDA events or seconds
        self._counted = 0  # forwards read so far
        self.forward_s: float | None = None  # the latest forward as GEMMs read, past the first

    def takes(self, x: torch.Tensor) -> bool:
        """Whether ``x`` is a batch of one of the sizes, in a training pass under no mode of this thread's own."""
        return x.shape[0] in self.sizes and torch.is_grad_enabled() and not modes_here()

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in the planned worker where its set-up is done and it serves, else here as GEMMs,
        timed on this thread's CUDA stream (no sync: read at the next epoch's start)."""
        planned = self.planned
        if planned is not None and planned.set_up.done() and planned.serves():
            return planned(fn, *args, **kwargs)
        cuda = torch.cuda.is_available() and any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
        start = torch.cuda.Event(enable_timing=True) if cuda else time.perf_counter()
        if cuda:
            start.record()
        with Unplanned():
            out = fn(*args, **kwargs)
        if cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
        else:
            end = time.perf_counter()
        self._timed.append((start, end))
        return out

    def epoch_starts(self, batches_left: int) -> None:
        """At an epoch's start, with ``batches_left`` short batches to come in the run: the forwards timed since read
        (those done), and the plans started beside this epoch where the batches left would cost more as GEMMs."""
        pending = []
        for start, end in self._timed:
            if isinstance(end, float):
                seconds = end - start
            elif end.query():
                seconds = start.elapsed_time(end) / 1000
            else:
                pending.append((start, end))
                continue
            self._counted += 1
            if self._counted > 1:  # the first meets cold kernels and memory
                self.forward_s = seconds
        self._timed = pending
        if self.planned is not None or self._plan is None or self.forward_s is None:
            return
        if batches_left * GEMM_PER_FORWARD * self.forward_s > PLANS_COST_S:
            try:
                self.planned = self._plan()
            except Exception as e:  # out of memory for the copy, no thread to spare: the GEMMs go on, as they are
                self._plan = None
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                LOGGER.warning(f"yolofeed: the short batches' cuDNN set-up not started ({first_line(e)}); they go on "
                               "as GEMMs")
                return
            LOGGER.debug(f"yolofeed: short batch sizes {', '.join(map(str, sorted(self.sizes)))}: cuDNN set up beside "
                         f"this epoch ({batches_left} to come at about {GEMM_PER_FORWARD * self.forward_s:.2f} s more "
                         "each as GEMMs)")

    def close(self) -> None:
        """The planned worker ended, if one was started."""
        if self.planned is not None:
            self.planned.close()


def modes_here() -> bool:
    """Whether this thread holds a state a worker thread would not share: a torch function or dispatch mode (``with
    torch.device(...)``, a FLOP counter), saved-tensor hooks (activations offloaded to the CPU), the profiler. Where
    torch does not say (another release), True."""
    try:
        return bool(torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack()
                    or torch._C._autograd._top_saved_tensors_default_hooks(False) is not None
                    or torch._C._autograd._profiler_enabled())
    except (AttributeError, TypeError, RuntimeError):
        return True


def as_here(device: torch.device) -> Callable[..., Any]:
    """A function that calls its arguments under the calling thread's autocast, grad mode and current CUDA stream of
    ``device``, which are each thread's own."""
    cuda = device.type == "cuda"
    enabled, dtype = torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type)
    cache, grad = torch.is_autocast_cache_enabled(), torch.is_grad_enabled()
    stream = torch.cuda.current_stream(device) if cuda else None

    def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with (torch.autocast(device.type, dtype=dtype, enabled=enabled, cache_enabled=cache),
              torch.set_grad_enabled(grad), torch.cuda.stream(stream) if cuda else contextlib.nullcontext()):
            return fn(*args, **kwargs)

    return call

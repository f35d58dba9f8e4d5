"""Validation in a thread of its own, whose cuDNN set-up is paid while the first epoch trains.

cuDNN plans a convolution's forward once per thread and input shape, and the plan costs host time: seconds for each
new batch shape of a validation (``tools/device/first_pass.py`` measures it). Ultralytics validates in the training
thread, so its first validation pays that for each shape of the val loader (rect batches: one shape per aspect-ratio
group, two on a square set, dozens on COCO), and its final validation pays it again for best.pt, fused, in the
contiguous layout and warmed at batch 1 first. Both sides of a run pay it; neither can pay it ahead in the training
thread without stopping the training for as long.

``ValidationThread`` is one worker thread that yolofeed's trainer hands each validation to (every epoch's, and the
final one), waiting for it: the same calls on the same inputs in the same order, so the metrics, plots and files are
Ultralytics'. Before the first epoch the trainer also hands it ``warm``: one blank forward pass at each shape those
validations will meet, on copies of the models they will run (``seam.validation_models``), which the worker runs
beside the first epoch once the short batches' set-up is made (train/short_batches.py; where the step's graph is
captured in the first epoch, once it is). Its host time is on another core; its GPU time is a few tens of
milliseconds a pass. A pass runs only where the GPU's free memory holds the conservative ``bytes_per_image`` (a
training pass's peak per image) times its batch, so it never takes memory the training needs; a pass that fails is
skipped with one line, and that validation pays its own set-up as stock's does. Nothing the passes compute is kept.

It runs with the trainer's ``validate_beside`` (on by default) on one CUDA GPU: on the 10k set of BENCHMARKS.md
("The whole run") the final validation took 6.5 s where it took 10.3 in the training thread. Under DDP (validation
gathers across ranks, in the ranks' own threads), on the CPU and with ``validate_beside=False`` the trainer validates
in the training thread, as Ultralytics does.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch
from torch import nn

from yolofeed import processes
from yolofeed.errors import first_line
from yolofeed.ultralytics_seam import LOGGER, count_flops_as_loaded

Shape = tuple[int, int, int]  # (batch, height, width) of a validation batch


def on_device(device: torch.device) -> Callable[[], object] | None:
    """A worker's first job (``processes.Worker``'s ``first``): the calling thread's CUDA device ``device`` (``cuda``
    alone: the current one) made the worker's, which a thread does not inherit; None off CUDA."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return lambda: torch.cuda.set_device(index)


class ValidationThread(processes.Worker):
    """The worker thread validations run in (``processes.Worker``), on ``device``.

    A stopped run (Ctrl-C, SIGTERM, an error) cancels what it runs and waits for it to stop at its next batch
    (``close``), as the process aborts if it exits with the worker inside torch.
    """

    def __init__(self, device: torch.device):
        self.device = device
        super().__init__("yolofeed-validation", first=on_device(device))

    def cancel(self) -> None:
        """Skip what is queued, and stop a running validation at its next batch (``check_cancelled``)."""
        self.cancelled.set()

    def check_cancelled(self, *_: Any) -> None:
        """A validator callback (``on_val_batch_start``): raise in the worker once the trainer stopped waiting."""
        if self.cancelled.is_set() and self.is_current():
            raise KeyboardInterrupt("yolofeed: the training stopped waiting for this validation")


def loader_shapes(loader: Any) -> list[Shape]:
    """The distinct (batch, height, width) of a validation loader's batches, in the order it yields them (a
    ``loader.ValLoader``: its rect batches and their shapes); [] for a loader that does not say."""
    batches, shapes = getattr(loader, "batches", None), getattr(loader, "shapes", None)
    if batches is None or shapes is None:
        return []
    return list(dict.fromkeys((len(b), int(h), int(w)) for b, (h, w) in zip(batches, shapes)))


def warm(models: list[tuple[nn.Module, torch.dtype | None, torch.dtype, bool]], shapes: list[Shape], imgsz: int,
         device: torch.device, bytes_per_image: float, log: Callable[[str], None] = LOGGER.info,
         cancelled: threading.Event | None = None, after: Future | None = None) -> int:
    """One blank forward pass of each model at each shape (and at batch 1 first where it says so), in this thread.

    Args:
        models: (model, autocast dtype or None, input dtype, warm at batch 1 first), as ``seam.validation_models``.
        shapes: the validation batches' distinct shapes.
        imgsz: the side of the batch-1 warm-up (Ultralytics warms the final model at (1, 3, imgsz, imgsz)).
        bytes_per_image: a pass at batch n runs only where the GPU has n times this free (outside torch's cache).
        log: where the one line at the end (or at a failure) goes.
        cancelled: once set (the run stopped), no further pass runs.
        after: a job the passes wait for first, however it ends (the short batches' set-up, which the training
            waits for: cuDNN plans one convolution at a time, whichever thread asks).

    Returns:
        the passes run.
    """
    while after is not None and not after.done():
        if cancelled is not None and cancelled.is_set():
            models.clear()
            return 0
        try:
            after.exception(processes.WAIT_STEP_S)  # a worker's skipped job is cancelled without waking ``wait``
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            pass
    t0, done = time.perf_counter(), 0
    try:
        for model, autocast, dtype, first_one in models:
            for n, h, w in ([(1, imgsz, imgsz)] if first_one else []) + shapes:
                if cancelled is not None and cancelled.is_set():
                    return done
                if device.type == "cuda" and torch.cuda.mem_get_info(device)[0] < n * bytes_per_image:
                    continue  # the training may need it: this validation pays its own set-up
                x = torch.zeros(n, 3, h, w, device=device, dtype=dtype)
                with torch.no_grad(), torch.autocast(device.type, dtype=autocast or torch.float16,
                                                     enabled=autocast is not None), processes.switched_often():
                    model(x)  # beside the training thread, busy in Python
                del x
                done += 1
    except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
        log(f"yolofeed: stopped setting up the validations' cuDNN plans after {done} batch shapes "
            f"({first_line(e)}); the others pay their own set-up")
        return done
    finally:
        models.clear()  # the copies' memory goes back now, not when the trainer ends
    if done:
        log(f"yolofeed: cuDNN set up for the validations' {done} batch shapes in {time.perf_counter() - t0:.1f} s, "
            "in their own thread")
    return done


def count_flops_ahead(final: list[nn.Module], device: torch.device, log: Callable[[str], None] = LOGGER.debug,
                      cancelled: threading.Event | None = None) -> bool:
    """best.pt's FLOPs count, made ahead in this thread as the final validation's load makes it
    (``seam.count_flops_as_loaded``), on a copy of ``final[0]``: the load's passes at its proxy shapes then find
    cuDNN set up. ``final`` is emptied either way (its model's memory goes back once the other passes are done too).

    Returns:
        whether the count ran: not once the run stopped, nor where the GPU's free memory does not hold the copy or
        Ultralytics' count gave nothing (``count_flops_as_loaded``).
    """
    try:
        if cancelled is not None and cancelled.is_set():
            return False
        t0 = time.perf_counter()
        with processes.switched_often():  # beside the training thread, busy in Python
            ran = count_flops_as_loaded(final[0], device)
        if ran:
            log(f"yolofeed: best.pt's FLOPs count made ahead in {time.perf_counter() - t0:.2f} s, in the validations' "
                "thread")
        return ran
    except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
        log(f"yolofeed: best.pt's FLOPs count not made ahead ({first_line(e)}); the final validation makes it")
        return False
    finally:
        final.clear()

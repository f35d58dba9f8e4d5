"""A run's training images per second: ``yolofeed train``'s closing line, on one process or over DDP ranks.

``RunThroughput`` is a thin adapter: its callbacks feed a ``StepClock`` (host times only) with each epoch's start
and end and each batch's images, so the figure is the images of the training steps over the seconds of the epochs'
training (validation and saving excluded).

Under DDP, Ultralytics launches the ranks as subprocesses (``torch.distributed.run``) of the process that called
``train``, each with a cloudpickled copy of the trainer's callbacks, this object's included. So:

* each rank counts the images of its own batches;
* at every epoch's end (``on_train_epoch_end`` runs on every rank; ``on_train_end`` only on rank 0, where a
  collective would wait for the others forever) the ranks sum their images and take the slowest rank's seconds
  with ``torch.distributed.all_reduce``;
* the launcher is not in that process group: it trained nothing and never ran these callbacks. Rank 0 writes the
  reduced figures to ``REPORT`` in the run folder when training ends, with this object's ``token``; the launcher
  reads them back (``learn_from_ranks``) only when torch.distributed is not initialised in its own process and no
  epoch ran there, and only a report that carries its token (one left in a resumed run's folder by an earlier run
  is not taken).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from yolofeed.monitor.steps import StepClock

REPORT = "yolofeed_speed.json"  # in the run folder: how DDP rank 0 tells the launcher the run's figures


def distributed() -> bool:
    """Whether this process is a rank of an initialised torch.distributed process group."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def reduce_over_ranks(images: int, seconds: float, device: Any = "cpu") -> tuple[int, float]:
    """The images summed over the ranks and the slowest rank's seconds; as given outside a process group.

    A collective: every rank must call it, the same number of times. Two 8-byte all-reduces (on ``device`` under
    NCCL, which reduces CUDA tensors only; on the CPU otherwise).
    """
    if not distributed():
        return images, seconds
    dist = torch.distributed
    device = device if dist.get_backend() == "nccl" else "cpu"
    n = torch.tensor([float(images)], dtype=torch.float64, device=device)
    s = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(n, op=dist.ReduceOp.SUM)
    dist.all_reduce(s, op=dist.ReduceOp.MAX)
    return round(n.item()), s.item()


class RunThroughput:
    """Training images and seconds of a run, gathered over the DDP ranks (see the module docstring).

    Args:
        clock: host clock in seconds (tests pass a fake one).

    Attributes:
        images, seconds: the run's figures so far (every rank's, once an epoch has ended under DDP).
        token: identifies this run's report for the launcher.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = StepClock(phases=False, clock=clock, keep=0)
        self.images, self.seconds = 0, 0.0
        self.token = uuid.uuid4().hex

    @property
    def rate(self) -> float:
        return self.images / self.seconds if self.seconds else 0.0

    # -- Ultralytics callbacks -----------------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: Any) -> None:
        self.clock.epoch_start()

    def on_train_batch_end(self, trainer: Any) -> None:
        """``FastDetectionTrainer.batch_images``: the images the step received (a last, partial batch counts what
        it holds)."""
        self.clock.step_done(trainer.batch_images)

    def on_train_epoch_end(self, trainer: Any) -> None:
        self.clock.epoch_end()
        self.images, self.seconds = reduce_over_ranks(self.clock.images, self.clock.seconds, trainer.device)

    def on_train_end(self, trainer: Any) -> None:
        """On rank 0 of a DDP run: tell the launcher (Ultralytics runs this on rank 0 only)."""
        if distributed():
            report = {"token": self.token, "images": self.images, "seconds": self.seconds}
            (Path(trainer.save_dir) / REPORT).write_text(json.dumps(report))

    def callbacks(self) -> dict[str, Callable[[Any], None]]:
        """Ultralytics event -> callback."""
        return {"on_train_epoch_start": self.on_train_epoch_start, "on_train_batch_end": self.on_train_batch_end,
                "on_train_epoch_end": self.on_train_epoch_end, "on_train_end": self.on_train_end}

    # -- in the launcher -----------------------------------------------------------------------------------------
    def learn_from_ranks(self, save_dir: str | Path) -> bool:
        """After ``train`` returned: take the figures DDP rank 0 reported, if this process launched the ranks.

        Returns:
            Whether the figures are known here (this process trained, or rank 0's report was taken).
        """
        if self.clock.epochs or distributed():  # this process trained: its figures are its own (reduced)
            return True
        f = Path(save_dir) / REPORT
        try:
            report = json.loads(f.read_text())
        except (OSError, ValueError):  # no report (the ranks did not finish an epoch), or a torn one
            return False
        if report.get("token") != self.token:
            return False
        self.images, self.seconds = int(report["images"]), float(report["seconds"])
        return True

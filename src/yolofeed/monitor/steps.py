"""One record of a training step's time, and the clock that makes them: every figure yolofeed reports comes from here.

``StepClock`` is told where each step's boundaries are (``batch_ready``, ``mark(phase)``, ``step_done``) and where
epochs begin and end; it keeps a ``StepRecord`` per step and running totals. The figures are plain functions of the
records: ``step_stats`` (steady-state img/s, data wait, median and mean step: ``yolofeed bench`` and ``doctor``),
``phase_summary`` (where a step's time goes: the doctor's breakdown, the live monitor). The Ultralytics callbacks
that feed a clock are thin adapters: ``monitor.live`` (live monitoring), ``measure.profile`` (bench and doctor) and
``monitor.throughput`` (``yolofeed train``'s closing line).

A step is recorded once the clock knows when it began: at the previous step's end, or at ``epoch_start``. The first
step after the clock is made without ``epoch_start`` only starts it: its data wait cannot be known.

Phases: the data wait is always host time (the loop blocked in ``next(loader)``). With ``phases``, ``batch_ready``
and each ``mark`` stamp the phase boundaries: on CUDA an event on the current stream (no sync), read once the
step's last event has completed (``query()``), a step or two later, so accounting never stalls the pipeline;
without CUDA the host clock.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

PHASES = ("data_wait", "preprocess", "forward", "loss", "backward", "optimizer")
GPU_PHASES = PHASES[1:]


@dataclass
class StepRecord:
    """One finished training step.

    Attributes:
        images: images in its batch, as the caller counts them.
        t_start: host clock (s) when it began: the previous step's end, or the epoch's start.
        t_ready: host clock when its batch arrived (the end of the data wait; ``t_start`` if never said).
        t_end: host clock when it ended.
        ms: milliseconds by phase: ``data_wait`` (host time), and with phase marks ``preprocess`` to ``optimizer``
            (the device's time between CUDA events on a GPU, else host time); phases not reached are absent.
    """

    images: int
    t_start: float
    t_ready: float
    t_end: float
    ms: dict[str, float]

    @property
    def seconds(self) -> float:
        """Host time from the step's start to its end."""
        return self.t_end - self.t_start

    @property
    def wait_seconds(self) -> float:
        """Host time waiting for the batch."""
        return self.t_ready - self.t_start

    @property
    def total_ms(self) -> float:
        """The phases' sum: host wait plus the device's time for the rest, on a GPU."""
        return sum(self.ms.values())


class StepClock:
    """Marks each training step's boundaries and phases, and keeps ``StepRecord`` s and running totals.

    Per epoch: ``epoch_start()``, then per step ``batch_ready()`` (the data wait ends), ``mark("forward")``,
    ``mark("loss")``, ``mark("backward")``, ``mark("optimizer")`` (marks are optional), ``step_done(images)``;
    then ``epoch_end()``. Marks outside a step (validation forwards) are ignored.

    Args:
        cuda: stamp phases with CUDA events (else the host clock).
        phases: stamp phases at all (False: host times only, no events: the cheapest accounting).
        clock: host clock in seconds (tests pass a fake one).
        keep: records kept (None: all of them, for a run of known length; 0: totals only).

    Attributes:
        records: the last ``keep`` steps whose phases are resolved.
        steps, images: steps recorded and their images, counted when they end.
        seconds, epochs: host seconds from ``epoch_start`` to ``epoch_end``, summed, and how many epochs ended.
        sum_ms: milliseconds by phase over every resolved step (not only the kept ones).
    """

    def __init__(self, cuda: bool = False, phases: bool = True, clock: Callable[[], float] = time.perf_counter,
                 keep: int | None = 200):
        self.cuda, self.phases, self.clock = cuda, phases, clock
        self.records: deque[StepRecord] = deque(maxlen=keep)
        self.steps, self.images, self.seconds, self.epochs = 0, 0, 0.0, 0
        self.sum_ms: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._pending: deque = deque()
        self._start: float | None = None  # the current step's start; None until the clock knows it
        self._ready: float | None = None
        self._marks: list[tuple[str, object]] = []
        self._epoch_start: float | None = None

    def __len__(self) -> int:
        """Steps recorded (some may still wait for the GPU to resolve their phases)."""
        return self.steps

    def _stamp(self) -> object:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return self.clock()

    def epoch_start(self) -> None:
        """An epoch begins: its first step starts now (its data wait includes the loader's start)."""
        self._start = self._epoch_start = self.clock()
        self._ready, self._marks = None, []

    def epoch_end(self) -> None:
        """The epoch's training steps are over: their time joins ``seconds``; no step runs until the next start."""
        now = self.clock()
        if self._epoch_start is not None:
            self.seconds += now - self._epoch_start
            self.epochs += 1
        self._epoch_start = self._start = None

    def batch_ready(self) -> None:
        """The loop has its next batch: the data wait ends, the preprocess phase starts."""
        self._ready = self.clock()
        self._marks = [("preprocess", self._stamp())] if self.phases else []

    def mark(self, phase: str) -> None:
        """``phase`` starts now (ignored outside a step)."""
        if self._marks:
            self._marks.append((phase, self._stamp()))

    def step_done(self, images: int) -> None:
        """The step ends: record it if its start is known; the next step starts now."""
        now = self.clock()
        if self._start is not None:
            ready = self._ready if self._ready is not None and self._ready >= self._start else self._start
            marks = self._marks + [("end", self._stamp())] if self._marks else []
            self._pending.append((images, self._start, ready, now, marks))
            self.steps += 1
            self.images += images
        self._start, self._ready, self._marks = now, None, []
        self._resolve()

    def _resolve(self) -> None:
        """Turn finished steps into records; stop at the first step the GPU has not finished."""
        while self._pending:
            images, start, ready, end, marks = self._pending[0]
            if self.cuda and marks and not marks[-1][1].query():
                return  # still running on the GPU: read it later rather than wait for it
            ms = {"data_wait": 1e3 * (ready - start)}
            for (name, a), (_, b) in zip(marks, marks[1:]):
                ms[name] = ms.get(name, 0.0) + (a.elapsed_time(b) if self.cuda else 1e3 * (b - a))
            self.records.append(StepRecord(images, start, ready, end, ms))
            for name, v in ms.items():
                self.sum_ms[name] = self.sum_ms.get(name, 0.0) + v
            self._pending.popleft()

    def resolved(self, skip: int = 0) -> list[StepRecord]:
        """The kept records whose phases are resolved, less the first ``skip`` (warm-up)."""
        self._resolve()
        return list(self.records)[skip:]

    def compute(self, skip: int = 0, window: int = 10) -> StepStats:
        """``step_stats`` of the resolved steps after the first ``skip`` (warm-up)."""
        return step_stats(self.resolved(skip), window)

    def summary(self, last: int | None = None) -> PhaseSummary:
        """``phase_summary`` of the last ``last`` resolved steps (all kept ones by default)."""
        recs = self.resolved()
        return phase_summary(recs[-last:] if last else recs)


@dataclass
class StepStats:
    """Steady-state figures over a run of steps.

    Attributes:
        steps: how many.
        images_per_s: median over windows of ``images / elapsed``.
        data_wait_fraction: share of step time spent waiting for the next batch.
        step_ms: median step time. When batches arrive in bursts (a few slow steps waiting on the loader,
            then many fast ones from its queue) the median is a fast step and hides the waiting.
        windows: each window's images / elapsed.
        mean_step_ms: wall time of the steps / their number: what ``batch / images_per_s`` gives.
    """

    steps: int
    images_per_s: float
    data_wait_fraction: float
    step_ms: float
    windows: list[float] = field(default_factory=list)
    mean_step_ms: float = 0.0


def step_stats(records: Sequence[StepRecord], window: int = 10) -> StepStats:
    """Rates of ``records`` on the host clock: the median of ``window``-step windows (one window if fewer steps)."""
    if not records:
        return StepStats(0, 0.0, 0.0, 0.0)
    seconds, images = [r.seconds for r in records], [r.images for r in records]
    windows = [sum(images[k:k + window]) / sum(seconds[k:k + window])
               for k in range(0, len(seconds) - window + 1, window)] or [sum(images) / sum(seconds)]
    return StepStats(len(records), statistics.median(windows), sum(r.wait_seconds for r in records) / sum(seconds),
                     1e3 * statistics.median(seconds), windows, 1e3 * sum(seconds) / len(seconds))


@dataclass
class PhaseSummary:
    """Means over steps: ms per phase, share of the step, images/s (over the phases' sum)."""

    steps: int
    ms: dict[str, float] = field(default_factory=dict)
    fraction: dict[str, float] = field(default_factory=dict)
    step_ms: float = 0.0
    images_per_s: float = 0.0


def phase_summary(records: Sequence[StepRecord]) -> PhaseSummary:
    """Where the time of ``records`` went, phase by phase."""
    if not records:
        return PhaseSummary(0)
    n = len(records)
    ms = {p: sum(r.ms.get(p, 0.0) for r in records) / n for p in PHASES}
    total = sum(r.total_ms for r in records)
    step = total / n
    return PhaseSummary(n, ms, {p: ms[p] / step if step else 0.0 for p in PHASES}, step,
                        1e3 * sum(r.images for r in records) / total if total else 0.0)


def window_median(t: list[float], values: list[float], bounds: list[float]) -> float | None:
    """Median over windows of the mean of the samples taken in each window.

    The bench and the doctor report img/s as a median of step windows, so that a one-off stall (cuDNN
    tuning its kernels for the epoch's last, smaller batch: ~5 s for yolo11n on the H200) does not count.
    Utilisation sampled over the same steps gets the same treatment; a plain mean would carry the stall.

    Args:
        t: sample times; values: the samples; bounds: window edges on the same clock (n windows, n + 1 edges).

    Returns:
        The median of the windows that hold a sample, or None if none does.
    """
    means = []
    for a, b in zip(bounds, bounds[1:]):
        inside = [v for ti, v in zip(t, values) if a <= ti < b]
        if inside:
            means.append(statistics.fmean(inside))
    return statistics.median(means) if means else None


def images_in_step(trainer: Any, k: int) -> int:
    """The images in step ``k`` of an epoch: what yolofeed's trainer counted (``batch_images``), else what an
    ordered batch sampler over the dataset hands step ``k``: ``batch_size`` until the last, short batch (a dataset
    smaller than the batch is one such step)."""
    counted = getattr(trainer, "batch_images", 0)
    if counted:
        return counted
    batch = trainer.batch_size
    try:
        n = len(trainer.train_loader.dataset)
    except (AttributeError, TypeError):
        return batch
    return max(min(batch, n - k * batch), 0) or batch

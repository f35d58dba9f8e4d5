"""Where a training step's time goes: data wait, preprocess (copy + augment), forward, loss, backward, optimiser.

Boundaries are marked as the step runs. On CUDA each mark records an event on the current stream
(no sync); a step's durations are read only once its last event has completed (``query()``), a step
or two later, so accounting never stalls the pipeline. Without CUDA, marks read the host clock.
The data wait is always host time: the training loop blocked in ``next(loader)``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

PHASES = ("data_wait", "preprocess", "forward", "loss", "backward", "optimizer")
GPU_PHASES = PHASES[1:]


@dataclass
class StepRecord:
    """One finished step. ``ms`` holds each phase's milliseconds (phases not reached are absent)."""

    images: int
    ms: dict[str, float]
    t_end: float = 0.0  # host clock when the step ended (for timelines)

    @property
    def total_ms(self) -> float:
        return sum(self.ms.values())


@dataclass
class PhaseSummary:
    """Means over resolved steps: ms per phase, share of the step, images/s."""

    steps: int
    ms: dict[str, float] = field(default_factory=dict)
    fraction: dict[str, float] = field(default_factory=dict)
    step_ms: float = 0.0
    images_per_s: float = 0.0


class PhaseTimer:
    """Marks phase boundaries of each step and turns them into per-phase times.

    Call order per step: ``batch_ready()`` (data wait ends, preprocess starts), ``mark("forward")``,
    ``mark("loss")``, ``mark("backward")``, optionally ``mark("optimizer")``, ``step_done(images)``.

    Args:
        cuda: record CUDA events (else host clock).
        clock: host clock, for the data wait (and every mark without CUDA); tests pass a fake one.
        keep: resolved steps kept for ``summary`` (None: all of them, for a run of known length).
    """

    def __init__(self, cuda: bool | None = None, clock: Callable[[], float] = time.perf_counter,
                 keep: int | None = 200):
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self.clock = clock
        self.records: deque[StepRecord] = deque(maxlen=keep)
        self._pending: deque = deque()
        self._marks: list[tuple[str, object]] = []
        self._last_end: float | None = None
        self._wait = 0.0
        # running sums over every resolved step (not only the kept ones): Prometheus counters read them
        self.count_steps = 0
        self.count_images = 0
        self.sum_ms: dict[str, float] = dict.fromkeys(PHASES, 0.0)

    def _stamp(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return self.clock()

    def batch_ready(self) -> None:
        now = self.clock()
        self._wait = now - self._last_end if self._last_end is not None else 0.0
        self._marks = [("preprocess", self._stamp())]

    def mark(self, phase: str) -> None:
        if self._marks:  # ignore marks outside a step (e.g. validation forwards)
            self._marks.append((phase, self._stamp()))

    def step_done(self, images: int) -> None:
        if self._marks:
            self._marks.append(("end", self._stamp()))
            self._pending.append((images, self._wait, self._marks, self.clock()))
        self._marks = []
        self._last_end = self.clock()
        self._resolve()

    def _resolve(self) -> None:
        """Turn finished steps into records; stop at the first step the GPU has not finished."""
        while self._pending:
            images, wait, marks, t_end = self._pending[0]
            if self.cuda and not marks[-1][1].query():
                return  # still running on the GPU: read it later rather than wait for it
            ms = {"data_wait": 1e3 * wait}
            for (name, a), (_, b) in zip(marks, marks[1:]):
                ms[name] = ms.get(name, 0.0) + (a.elapsed_time(b) if self.cuda else 1e3 * (b - a))
            self.records.append(StepRecord(images, ms, t_end))
            self.count_steps += 1
            self.count_images += images
            for name, v in ms.items():
                self.sum_ms[name] = self.sum_ms.get(name, 0.0) + v
            self._pending.popleft()

    def summary(self, last: int | None = None, skip: int = 0) -> PhaseSummary:
        """Means over the last ``last`` resolved steps (all kept ones by default), less the first ``skip``
        (warm-up: compilation, autotuning and graph capture make the first steps unrepresentative)."""
        self._resolve()
        recs = list(self.records)[skip:]
        recs = recs[-last:] if last else recs
        if not recs:
            return PhaseSummary(0)
        n = len(recs)
        ms = {p: sum(r.ms.get(p, 0.0) for r in recs) / n for p in PHASES}
        step = sum(r.total_ms for r in recs) / n
        return PhaseSummary(n, ms, {p: ms[p] / step if step else 0.0 for p in PHASES}, step,
                            1e3 * sum(r.images for r in recs) / sum(r.total_ms for r in recs))

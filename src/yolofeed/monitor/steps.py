"""Per-step accounting: how long each step took, and how much of it was spent waiting for data."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class StepStats:
    """Steady-state figures over the measured steps (warm-up excluded).

    Attributes:
        images_per_s: median over windows of ``images / elapsed``.
        data_wait_fraction: share of step time spent waiting for the next batch.
        step_ms: median step time. When batches arrive in bursts (a few slow steps waiting on the loader,
            then many fast ones from its queue) the median is a fast step and hides the waiting.
        mean_step_ms: wall time of the measured steps / their number: what ``batch / images_per_s`` gives.
    """

    steps: int
    images_per_s: float
    data_wait_fraction: float
    step_ms: float
    windows: list[float] = field(default_factory=list)
    mean_step_ms: float = 0.0


class StepTimer:
    """Accumulate step boundaries; ``compute`` gives steady-state rates.

    Call ``batch_ready()`` when the loop has its next batch (the end of the data wait) and
    ``step_done(images)`` when the step ends. Times come from ``clock`` (tests pass a fake one).

    Args:
        warmup: steps ignored at the start (compilation, allocator, cache warm-up).
        window: steps per rate window; the reported rate is the median window.
    """

    def __init__(self, warmup: int = 10, window: int = 10, clock: Callable[[], float] = time.perf_counter):
        self.warmup, self.window, self.clock = warmup, window, clock
        self._last_end: float | None = None
        self._ready: float | None = None
        self.waits: list[float] = []
        self.steps: list[float] = []
        self.images: list[int] = []

    def batch_ready(self) -> None:
        self._ready = self.clock()

    def step_done(self, images: int) -> None:
        now = self.clock()
        if self._last_end is not None:
            ready = self._ready if self._ready is not None and self._ready >= self._last_end else self._last_end
            self.waits.append(ready - self._last_end)
            self.steps.append(now - self._last_end)
            self.images.append(images)
        self._last_end, self._ready = now, None

    def __len__(self) -> int:
        return len(self.steps)

    def compute(self) -> StepStats:
        steps, waits, images = self.steps[self.warmup:], self.waits[self.warmup:], self.images[self.warmup:]
        if not steps:
            return StepStats(0, 0.0, 0.0, 0.0)
        windows = [sum(images[k:k + self.window]) / sum(steps[k:k + self.window])
                   for k in range(0, len(steps) - self.window + 1, self.window)] or [sum(images) / sum(steps)]
        return StepStats(len(steps), statistics.median(windows), sum(waits) / sum(steps),
                         1e3 * statistics.median(steps), windows, 1e3 * sum(steps) / len(steps))


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


"""Host time spent in a trainer's callbacks: the logging integrations (TensorBoard, W&B, MLflow, Comet,
ClearML, the Ultralytics Platform, ...) run inside the training loop, and every millisecond they take
per step is a millisecond the GPU waits in a launch-bound trainer.

Plain object: ``wrap(callbacks, skip)`` times every registered callback except ``skip`` (the
measurement's own), ``start()`` opens the window, ``ms_per_step(steps)`` reads it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable


def callback_name(fn: Callable) -> str:
    """``module.qualname`` of a callback (``ultralytics.utils.callbacks.tensorboard.on_batch_end``)."""
    fn = getattr(fn, "__wrapped__", fn)
    return f"{getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', type(fn).__name__)}"


class CallbackClock:
    """Accumulates the host seconds each callback takes once ``start()`` is called.

    Args:
        clock: seconds (``time.perf_counter``; tests pass a fake).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)
        self.running = False

    def wrap(self, callbacks: dict[str, list[Callable]], skip: Iterable[Callable] = ()) -> None:
        """Replace each callback in Ultralytics' ``{event: [fn, ...]}`` by a timed one, in place."""
        skip = set(map(id, skip))
        for event, fns in callbacks.items():
            callbacks[event] = [fn if id(fn) in skip else self._timed(fn) for fn in fns]

    def _timed(self, fn: Callable) -> Callable:
        name = callback_name(fn)

        def timed(*args, **kwargs):
            if not self.running:
                return fn(*args, **kwargs)
            t0 = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += self.clock() - t0

        timed.__wrapped__ = fn
        return timed

    def start(self) -> None:
        self.seconds.clear()
        self.running = True

    def stop(self) -> None:
        self.running = False

    def ms_per_step(self, steps: int) -> dict[str, float]:
        """Milliseconds per training step by callback, largest first (callbacks that took no time left out)."""
        per = {k: 1e3 * v / max(steps, 1) for k, v in self.seconds.items() if v > 0}
        return dict(sorted(per.items(), key=lambda kv: -kv[1]))

"""Ultralytics' two training-thread plots, made beside work the run waits on anyway.

Stock makes two plots with nothing else running: the training labels' plot (``plot_training_labels``: about 1.4 s of
matplotlib for 10k images and 105k boxes) before the first epoch, and results.png (``plot_metrics``: about 0.9 s)
after the final validation. Here the same calls make the same files, each beside other work:

* the labels' plot in a thread (``InThread``) beside yolofeed's warm-up (cuDNN's set-up and the graph's capture,
  which run in torch's C++ with the GIL released), joined before the first epoch; nothing else plots meanwhile;
* results.png in a new interpreter (``ResultsPlot``) beside the final validation: results.csv is complete once the
  last epoch is saved, and the final validation writes no row to it. Not a thread: matplotlib is not thread-safe, and
  the final validation plots (its confusion matrix and curves) in the validation thread. Not a fork: the parent holds
  CUDA, the loader's and the validation's threads and polars' pool, none of which a forked child may use.

Each reports how long it took and how long the training thread waited for it: the time saved is the difference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from yolofeed import processes

# Ultralytics' plot_results (RELIED_ON: BaseTrainer.plot_metrics calls it so), run as stock runs it, without on_plot;
# ``-c`` puts the working directory first on sys.path, where the parent has its own path (PYTHONPATH below): dropped
RESULTS_PLOT = ("import sys; sys.path.pop(0); from ultralytics.utils.plotting import plot_results; "
                "plot_results(file=sys.argv[1])")


class InThread:
    """``fn()`` in a thread of its own from now; ``join`` waits for it and raises what it raised."""

    def __init__(self, fn: Callable[[], object], name: str):
        self.seconds: float | None = None  # how long fn took, once it returned
        self.error: BaseException | None = None
        self._worker = processes.Daemon(self._run, fn, name=name)

    def _run(self, fn: Callable[[], object]) -> None:
        start = time.perf_counter()
        try:
            fn()
        except BaseException as e:  # raised again in the joining thread, as stock would raise it there
            self.error = e
        finally:
            self.seconds = time.perf_counter() - start

    def join(self) -> float:
        """Wait for it; returns the seconds waited.

        Raises:
            BaseException: what ``fn`` raised.
        """
        start = time.perf_counter()
        processes.wait_for(self._worker.ended)
        waited = time.perf_counter() - start
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return waited


class ResultsPlot:
    """results.png drawn from ``csv`` by Ultralytics' ``plot_results`` in a new interpreter, from now."""

    def __init__(self, csv: str | os.PathLike):
        self.csv = Path(csv)
        self.seconds: float | None = None  # from the start to the child's exit, once finished
        self._start = time.perf_counter()
        self._child: subprocess.Popen | None = None
        if getattr(sys, "frozen", False) or not sys.executable:  # a frozen or embedding executable is no interpreter
            return  # that takes -c: the caller plots itself
        # the parent's own import path (a notebook's sys.path.insert, a venv's site), not the working directory's
        path = os.pathsep.join(p for p in sys.path if p)
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-c", RESULTS_PLOT, str(self.csv)], stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env={**os.environ, "YOLO_VERBOSE": "False", "PYTHONPATH": path})
        except OSError:  # no process to spare (EAGAIN, ENOMEM): finish() says so, and the caller plots itself
            self._child = None

    def abandon(self) -> None:
        """The run will not wait for it (it stopped in the final validation): end the child and reap it."""
        if self._child is not None and self._child.poll() is None:
            self._child.kill()
        if self._child is not None:
            self._child.communicate()
        self._child = None

    def finish(self, on_plot: Callable[[Path], object] | None = None, timeout: float = 300.0) -> tuple[bool, float]:
        """Wait for the child (``timeout`` seconds at most: then it is killed); where it drew results.png and said
        nothing (``plot_results`` logs a CSV it cannot plot as an error and goes on), hand the file to ``on_plot`` as
        ``plot_results`` does. Returns whether it did, and the seconds waited: where it did not (no child, a failure,
        a message, the timeout) the caller draws it itself, as stock does, and its log shows what stock's shows."""
        if self._child is None:
            return False, 0.0
        start = time.perf_counter()
        try:
            said, _ = self._child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.communicate()
            return False, time.perf_counter() - start
        waited = time.perf_counter() - start
        self.seconds = time.perf_counter() - self._start
        png = self.csv.with_name("results.png")
        if self._child.returncode != 0 or said.strip() or not png.is_file():
            return False, waited
        if on_plot is not None:
            on_plot(png)
        return True, waited

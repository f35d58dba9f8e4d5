"""Ultralytics' plots of the run's start and end, made beside work the run waits on anyway, or beside each other.

Stock makes two plots with nothing else running: the training labels' plot (``plot_training_labels``: about 1.4 s of
matplotlib for 10k images and 105k boxes) before the first epoch, and results.png (``plot_metrics``: about 0.9 s)
after the final validation. Here the same calls make the same files, each beside other work:

* the labels' plot in a thread (``InThread``) beside yolofeed's warm-up (cuDNN's set-up and the graph's capture,
  which run in torch's C++ with the GIL released), joined before the first epoch; nothing else plots meanwhile;
* results.png in a new interpreter (``ResultsPlot``) beside the final validation: results.csv is complete once the
  last epoch is saved, and the final validation writes no row to it. Where the figure children start with the last
  epoch (a core to spare), it starts with them, its imports beside that epoch, and draws once told at ``final_eval``.
  Not a thread: matplotlib is not thread-safe, and the final validation plots (its confusion matrix and curves) in the
  validation thread. Not a fork: the parent holds CUDA, the loader's and the validation's threads and polars' pool,
  none of which a forked child may use.

The final validation's metric figures (its curves and confusion matrices: ``seam.final_figures``) are drawn by
``FigureDrawers``, children started as the last epoch starts (their imports beside its training), one figure each at
once: the validation ends with the slowest figure instead of their sum (about 5 s of matplotlib on an H100 machine's
cores for 80 classes). Where a child cannot draw one (it failed, said anything, did not answer in time), the
validation draws it itself as stock does, its messages shown, once no child can still be writing it.

Each reports how long it took and how long the training thread waited for it: the time saved is the difference.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import matplotlib

from yolofeed import processes
from yolofeed.limits import memory_available, usable_cores
from yolofeed.processes import DIE_WITH_PARENT
from yolofeed.ultralytics_seam import (
    FIGURES_MODULE,
    LOGGER,
    RANK,
    figure_function,
    final_figures,
    first_meanwhile,
    results_csv,
)

# Ultralytics' plot_results (RELIED_ON: BaseTrainer.plot_metrics calls it so), run as stock runs it, without on_plot,
# once a line on stdin says results.csv is complete (its imports done before: ``ResultsPlot.go``); its end gives none
RESULTS_PLOT = DIE_WITH_PARENT + ("import sys; from ultralytics.utils.plotting import plot_results\n"
                                  "if sys.stdin.readline() == 'go\\n':\n"
                                  "    plot_results(file=sys.argv[1])\n")


# A child of FigureDrawers: the figures' module imported before the first job; then each job (qualname, args, kwargs,
# the parent's working folder and its matplotlib settings that differ from the defaults, applied on the child's own)
# pickled on stdin, its reply pickled on the parent's end of stdout: (drawn, what it printed meanwhile, on_plot's
# calls). What the child prints goes to a file (its fds 1 and 2), read back a job at a time: Ultralytics is verbose in
# it (never shown), so that a figure that fails (Ultralytics' TryExcept only warns) says so.
FIGURE_CHILD = DIE_WITH_PARENT + """
import importlib, os, pickle, sys, tempfile, warnings
import matplotlib
reply = os.fdopen(os.dup(1), "wb")
said = tempfile.TemporaryFile()
os.dup2(said.fileno(), 1)
os.dup2(said.fileno(), 2)
module = importlib.import_module(sys.argv[1])
own = {k: v for k, v in matplotlib.rcParams.items() if k != "backend"}
while True:
    try:
        qualname, args, kwargs, cwd, settings = pickle.load(sys.stdin.buffer)
    except EOFError:
        break
    os.chdir(cwd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        matplotlib.rcParams.update(own)
        matplotlib.rcParams.update(settings)
    calls = []
    if kwargs.get("on_plot"):
        kwargs["on_plot"] = lambda *a, **k: calls.append((a, k))
    start = os.lseek(said.fileno(), 0, os.SEEK_END)
    fn = module
    for name in qualname.split("."):
        fn = getattr(fn, name)
    try:
        fn(*args, **kwargs)
        drawn = True
    except BaseException as e:
        drawn = False
        print(type(e).__name__, e)
    sys.stdout.flush()
    sys.stderr.flush()
    end = os.lseek(said.fileno(), 0, os.SEEK_END)
    os.lseek(said.fileno(), start, os.SEEK_SET)
    text = os.read(said.fileno(), end - start).decode(errors="replace")
    os.lseek(said.fileno(), 0, os.SEEK_END)
    pickle.dump((drawn, text, calls), reply)
    reply.flush()
"""
FIGURE_WAIT_S = 60.0  # how long the final validation waits for the children's figures before drawing them itself
RESULTS_WAIT_S = 120.0  # how long the run's end waits for results.png's child before drawing it itself
POLL_S = 0.5  # how often a wait looks whether a child was stopped (SIGSTOP, a debugger): then it is not waited for
# a detection validation's six figures (four curves, two confusion matrices) at once; a segmentation's or pose's ten
# take two rounds. Each child holds about 0.3 GB of its own (torch, imported by the figures' module) until the end
MAX_FIGURE_CHILDREN = 6
CHILD_MEMORY = 1 << 30  # available host memory asked for each child started (its own 0.3 GB, with room to spare)


class FigureDrawers:
    """Children that draw Ultralytics' figures (``seam.final_figures``'s ``draw``), ``n`` of them started now;
    ``finish`` waits for what they took and draws here what they did not (see the module's doc)."""

    def __init__(self, n: int):
        self.seconds: float | None = None  # from the first figure taken to the last one back, once finished
        self._first: float | None = None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._taken: list[tuple[str, tuple, dict, Future]] = []
        self._children: list[subprocess.Popen] = []
        self._closing = threading.Lock()
        if getattr(sys, "frozen", False) or not sys.executable:  # no interpreter that takes -c: drawn here
            return
        path = os.pathsep.join(p for p in sys.path if p)  # the parent's own import path, as ResultsPlot's
        env = {**os.environ, "PYTHONPATH": path, "YOLO_VERBOSE": "True"}
        for _ in range(n):
            try:
                self._children.append(subprocess.Popen(
                    [sys.executable, "-c", FIGURE_CHILD, FIGURES_MODULE, str(os.getpid())], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env))
            except OSError:  # no process to spare: the children started serve, or none and all is drawn here
                break
        for child in self._children:
            processes.Daemon(self._serve, child, name="yolofeed-figures")

    @staticmethod
    def count() -> int:
        """How many children to start: one a figure, one core left to the run, one a GiB of available memory; none
        where fewer than two would start (one child draws no faster than the validation itself)."""
        if getattr(sys, "frozen", False) or not sys.executable:
            return 0
        try:
            n = min(MAX_FIGURE_CHILDREN, usable_cores() - 1, memory_available() // CHILD_MEMORY)
        except Exception as e:  # a figure drawn faster is never worth a run: the validation draws them
            LOGGER.debug(f"yolofeed: no figure children ({type(e).__name__}: {e})")
            return 0
        return n if n >= 2 else 0

    def draw(self, qualname: str, args: tuple, kwargs: dict) -> bool:
        """Take a figure (``seam.final_figures``'s ``draw``): False where no child can (none started, arguments
        that do not pickle), and the caller draws it."""
        if not self._children:
            return False
        try:
            job = pickle.dumps((qualname, args, {**kwargs, "on_plot": bool(kwargs.get("on_plot"))}, os.getcwd(),
                                _settings()))
        except Exception:  # an argument that does not pickle (a names mapping of the user's kind, say)
            return False
        with self._closing:  # not behind close's end markers, where no thread would take it
            if not self._children:
                return False
            if self._first is None:
                self._first = time.perf_counter()
            done: Future = Future()
            self._taken.append((qualname, args, kwargs, done))
            self._jobs.put((job, done))
        return True

    def _serve(self, child: subprocess.Popen) -> None:
        """A thread's loop: the next job to its child, the reply to the job's future; a child gone fails each job it
        is given after (they are drawn in the parent). The thread owns its child's pipes and closes them as it ends
        (``close`` kills the child first: a write or read blocked on it then fails at once)."""
        try:
            self._serve_jobs(child)
        finally:
            for pipe in (child.stdin, child.stdout):
                with contextlib.suppress(OSError, ValueError):
                    pipe.close()

    def _serve_jobs(self, child: subprocess.Popen) -> None:
        gone: BaseException | None = None
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, done = item
            if gone is None:
                try:
                    child.stdin.write(job)
                    child.stdin.flush()
                    done.set_result(pickle.load(child.stdout))
                    continue
                except BaseException as e:  # the child ended (killed, crashed) or its reply is not a reply
                    gone = e
            done.set_exception(gone)

    def finish(self, timeout: float = FIGURE_WAIT_S) -> float:
        """Wait for the figures taken (``timeout`` seconds at most), hand each file to its ``on_plot`` as the function
        would have, in the order they were taken, and draw here, as stock does, each a child did not draw or drew
        saying something. Ends the children. Returns the seconds waited."""
        start = time.perf_counter()
        replies: list[tuple[bool, str, list] | None] = []
        late = ""
        try:
            for _, _, _, done in self._taken:
                while not done.done() and not late:
                    left = start + timeout - time.perf_counter()
                    late = ("not back in time" if left <= 0 else "a child was stopped"
                            if any(processes.stopped(c.pid) for c in self._children) else "")
                    with contextlib.suppress(Exception):
                        done.exception(min(POLL_S, max(0.0, left)))
                try:  # the child failed, or not back: drawn below, once no child can be drawing it
                    replies.append(done.result(0) if done.done() else None)
                except Exception:
                    replies.append(None)
        finally:
            self.close()
        if late:
            LOGGER.warning(f"yolofeed: the final validation's figures drawn here after "
                           f"{time.perf_counter() - start:.0f} s ({late})")
        waited = time.perf_counter() - start
        if self._first is not None:
            self.seconds = time.perf_counter() - self._first
        taken, self._taken = self._taken, []
        for (qualname, args, kwargs, _), reply in zip(taken, replies):
            drawn, said, calls = reply if reply is not None else (False, "", [])
            # drawn: it said nothing, and it handed over its file where it was given on_plot (the validators give it)
            if drawn and not said.strip() and (calls or not kwargs.get("on_plot")) and all(
                    Path(a[0]).is_file() for a, _ in calls if a):
                for a, k in calls:
                    kwargs["on_plot"](*a, **k)
            else:
                figure_function(qualname)(*args, **kwargs)
        return waited

    def close(self) -> None:
        """End the children now, whatever they do (a figure one is drawing is not waited for: whoever needs it draws
        it after, once this returned), reap them, and let their threads end; from any thread, any number of times.
        Killed, not asked: a thread may be blocked writing a job into the pipe of a child that does not read it."""
        with self._closing:
            children, self._children = self._children, []
            for child in children:
                with contextlib.suppress(OSError):
                    child.kill()
            for child in children:
                child.wait()
                self._jobs.put(None)


def _settings() -> dict[str, Any]:
    """The parent's matplotlib settings that differ from the defaults (a notebook's style, say): the children draw
    with them, as the parent would (the backend aside: the figures choose theirs)."""
    defaults = matplotlib.rcParamsDefault
    return {k: v for k, v in matplotlib.rcParams.items() if k != "backend" and defaults.get(k) != v}


def validate_drawing(validator: Any, model: Any, figures: FigureDrawers | None,
                     drawn: Callable[[float | None, float], None]) -> Any:
    """``validator(model=model)`` under ``seam.final_figures``: its image grids drawn from the images they show, its
    figures by ``figures`` where given, waited for as its validation ends (first at ``on_val_end``: that event's
    callbacks may read the files and the validator's ``plots``); ``drawn`` then gets the figures' seconds and the
    seconds waited for them. The children end with it, whatever it raised."""
    if figures is None:
        with final_figures(None):
            return validator(model=model)

    def finish(_validator: Any) -> None:
        waited = figures.finish()
        drawn(figures.seconds, waited)

    try:
        with final_figures(figures.draw), first_meanwhile(validator, "on_val_end", finish):
            return validator(model=model)
    finally:
        figures.close()


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
    """results.png drawn from ``csv`` by Ultralytics' ``plot_results`` in a new interpreter: started now, its imports
    (about 3 s on an H100 machine's cores) run at once, and it draws once told (``go``: results.csv is complete)."""

    def __init__(self, csv: str | os.PathLike, go: bool = True):
        self.csv = Path(csv)
        self.seconds: float | None = None  # from go to the child's exit, once finished
        self._start = time.perf_counter()
        self._child: subprocess.Popen | None = None
        if getattr(sys, "frozen", False) or not sys.executable:  # a frozen or embedding executable is no interpreter
            return  # that takes -c: the caller plots itself
        # the parent's own import path (a notebook's sys.path.insert, a venv's site), not the working directory's
        path = os.pathsep.join(p for p in sys.path if p)
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-c", RESULTS_PLOT, str(self.csv), str(os.getpid())], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env={**os.environ, "YOLO_VERBOSE": "False", "PYTHONPATH": path})
        except OSError:  # no process to spare (EAGAIN, ENOMEM): finish() says so, and the caller plots itself
            self._child = None
        if go:
            self.go()

    def go(self) -> None:
        """results.csv is complete: the child draws it (a line in the pipe's buffer: the write never blocks; the pipe
        is closed by ``finish``'s wait)."""
        self._start = time.perf_counter()
        if self._child is not None and self._child.stdin is not None:
            try:
                self._child.stdin.write(b"go\n")
                self._child.stdin.flush()
            except OSError:  # the child gone already: finish() finds it failed, and the caller plots itself
                pass

    def abandon(self) -> None:
        """The run will not wait for it (it stopped in the final validation): end the child and reap it."""
        if self._child is not None and self._child.poll() is None:
            self._child.kill()
        if self._child is not None:
            self._child.communicate()
        self._child = None

    def finish(self, on_plot: Callable[[Path], object] | None = None,
               timeout: float = RESULTS_WAIT_S) -> tuple[bool, float]:
        """Wait for the child (``timeout`` seconds at most: then it is killed); where it drew results.png and said
        nothing (``plot_results`` logs a CSV it cannot plot as an error and goes on), hand the file to ``on_plot`` as
        ``plot_results`` does. Returns whether it did, and the seconds waited: where it did not (no child, a failure,
        a message, the timeout) the caller draws it itself, as stock does, and its log shows what stock's shows."""
        if self._child is None:
            return False, 0.0
        start = time.perf_counter()
        while True:
            try:
                said, _ = self._child.communicate(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                late = time.perf_counter() - start > timeout
                if late or processes.stopped(self._child.pid):
                    self._child.kill()
                    self._child.communicate()
                    LOGGER.warning(f"yolofeed: results.png drawn here after {time.perf_counter() - start:.0f} s (its "
                                   f"child {'not done in time' if late else 'was stopped'})")
                    return False, time.perf_counter() - start
        waited = time.perf_counter() - start
        self.seconds = time.perf_counter() - self._start
        png = self.csv.with_name("results.png")
        if self._child.returncode != 0 or said.strip() or not png.is_file():
            return False, waited
        if on_plot is not None:
            on_plot(png)
        return True, waited


class PlotsBeside:
    """Where a ``FastTrainer`` makes Ultralytics' plots (see the module's doc): a mixin before Ultralytics' trainer in
    its bases (its state below); ``final_eval`` and the run's end call ``_validate_best`` and ``_stop_plots``."""

    _label_plots: InThread | None = None  # the training labels' plot, beside the warm-up
    _results_plot: ResultsPlot | None = None  # results.png, beside the final validation
    _figures: FigureDrawers | None = None  # the final validation's figures' children, from the last epoch
    plots_beside: dict | None = None  # each plot made beside: (seconds it took, seconds the run waited for it)

    def plot_training_labels(self):
        """Ultralytics' labels plot (``labels.jpg``), drawn in a thread beside the warm-up; the first epoch starts once
        it is drawn (``_join_label_plots``), and what it raises is raised there."""
        self._label_plots = InThread(super().plot_training_labels, "yolofeed-label-plots")

    def _join_label_plots(self) -> None:
        """Last at ``on_pretrain_routine_end``, after the warm-up: wait for the labels plot."""
        plots, self._label_plots = self._label_plots, None
        if plots is not None:
            waited = plots.join()
            self.plots_beside = {**(self.plots_beside or {}), "labels": (plots.seconds, waited)}

    def _start_figure_drawers(self, last_epoch: bool = True) -> None:
        """The final validation's figure children, started as the last epoch starts (``last_epoch``:
        ``on_train_epoch_start``), so that their imports run beside its training, or at ``final_eval``; once a run,
        on the rank that plots. results.png's child starts with them, told to draw at ``final_eval``
        (``_plot_results``)."""
        if (self._figures is None and RANK in {-1, 0} and self.args.plots
                and (not last_epoch or self.epoch == self.epochs - 1) and (n := FigureDrawers.count())):
            self._figures = FigureDrawers(n)
            if last_epoch and self._results_plot is None:
                self._results_plot = ResultsPlot(results_csv(self), go=False)

    def _plot_results(self) -> None:
        """At ``final_eval``, results.csv complete: results.png's child started with the last epoch draws it, or one
        started now."""
        if self._results_plot is not None:
            self._results_plot.go()
        else:
            self._results_plot = ResultsPlot(results_csv(self))

    def _validate_best(self, model: Any) -> Any:
        """``final_eval``'s validation of best.pt (``model``), in the validation thread where there is one, its figures
        drawn by the children; they end with it, whatever the validation thread did with them (a Ctrl-C while the
        validation waited in its queue: it never ran to end them)."""
        figures = self._figures
        try:
            return self._in_validation_thread(validate_drawing, self.validator, model, figures, self._figures_drawn,
                                              final=True)
        finally:
            if figures is not None:
                figures.close()
            self._figures = None

    def _figures_drawn(self, seconds: float | None, waited: float) -> None:
        self.plots_beside = {**(self.plots_beside or {}), "figures": (seconds, waited)}

    def plot_metrics(self):
        """Ultralytics' results.png, drawn beside the final validation (``final_eval``): waited for here, where stock
        draws it; drawn here as stock draws it where that did not serve (no child process, a failure, a message)."""
        plot, self._results_plot = self._results_plot, None
        if plot is not None:
            drawn, waited = plot.finish(self.on_plot)
            if drawn:
                self.plots_beside = {**(self.plots_beside or {}), "results": (plot.seconds, waited)}
                return
        super().plot_metrics()

    def _stop_plots(self) -> None:
        """At the run's end, whatever ended it: a results plot's child (the run stopped in final_eval) and figure
        children no validation took (it stopped before, or there was no best.pt) ended, no zombie kept with the
        trainer."""
        if self._results_plot is not None:
            self._results_plot.abandon()
            self._results_plot = None
        if self._figures is not None:
            self._figures.close()
            self._figures = None

"""Processes that must not outlive the one that started them, and signals that must not land mid-wait: whether a
process is still the one we knew, a child that dies with its parent, SIGTERM ending a process as Ctrl-C does, signals
deferred to where no lock or wait is held, and waits that Ctrl-C can cut short.

A pack build's workers and a bench's modes run in child processes. A parent killed alone (``kill -9``, the OOM
killer) cannot stop them: left running, a build's workers keep its files and a bench's mode keeps its GPU.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

LOGGER = logging.getLogger(__name__)
START_TOLERANCE = 1.0  # s: two readings of one process's start time agree far better than this
# A wait's step (``result``, ``wait_all``, ``get``, ``wait_for``, ``acquire``). Ctrl-C cuts a blocking wait short only
# where it is timed: polars, which Ultralytics imports to read results.csv, installs its SIGINT handler with SA_RESTART,
# and an untimed lock acquire is then restarted, so the KeyboardInterrupt waits for the wait's end (a validation's, a
# hung read's for ever). A timed one returns to Python, which runs the handler.
WAIT_STEP_S = 0.5
# threads a bounded wait gave up on in this command (``left_running``): the interpreter's exit aborts the process
# ("terminate called without an active exception") where one is inside torch then, so a process of yolofeed's own
# ends with os._exit instead (``own_process``)
LEFT_RUNNING: list[str] = []
_RANK_END = False  # end_rank_if_left_running's exit handler is registered

# First in each child, which takes the parent's PID as its last argument: SIGKILL when the parent dies, however it dies
# (Linux's parent-death signal, for the thread that started it, which must outlive the child's work: the training
# thread). A child ends on its own at the end of its stdin, but one stopped (SIGSTOP, a debugger) reads nothing, and
# would stay, stopped, holding its 0.3 GB, after the parent was killed.
# ``-c`` puts the working directory first on sys.path, where the parent has its own path (PYTHONPATH below): dropped
# before any import (a signal.py there would run in the child), unless the interpreter puts none there.
DIE_WITH_PARENT = """
import sys as _sys
if not _sys.flags.safe_path:  # PYTHONSAFEPATH or -P: no working folder to drop, the parent's path is all there is
    _sys.path.pop(0)
import os as _os
_parent = int(_sys.argv.pop())
if _sys.platform.startswith("linux"):
    try:
        import ctypes as _ctypes, signal as _signal
        _ctypes.CDLL(None).prctl(1, _signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except Exception:  # a libc without prctl: the child still ends at its stdin's end, unless stopped
        pass
    if _os.getppid() != _parent:  # the parent died before prctl took effect
        _os._exit(1)
"""


def process_start(pid: int) -> float | None:
    """The start time (epoch seconds) of process ``pid`` on this host; None if there is no such process."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, ValueError):
        return None
    except psutil.AccessDenied:  # exists, owned by someone else: no start time to compare
        return float("nan")


def process_alive(pid: int, started: float) -> bool:
    """Whether process ``pid`` on this host is still the one that started at ``started`` (not a reused PID)."""
    start = process_start(pid)
    if start is None:
        return False
    return start != start or abs(start - started) < START_TOLERANCE  # NaN: exists, not ours to inspect


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, a debugger's trace): it does nothing until someone resumes it."""
    import psutil

    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except (psutil.Error, OSError):  # gone: a wait on it ends by itself
        return False


def kill_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux's parent-death signal; it holds across
    ``exec``, so it also serves as ``subprocess.Popen(preexec_fn=kill_with_parent)``). False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0) == 0  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError) as e:
        LOGGER.debug(f"prctl(PR_SET_PDEATHSIG) unavailable ({e})")
        return False


def die_with_parent(pid: int, started: float) -> None:
    """End this process when its parent (``pid``, started at ``started``) dies, however it dies: the kernel's
    parent-death signal on Linux, and everywhere a thread that watches the parent every second."""
    kill_with_parent()  # where it fails, the watch below still ends us, within a second
    if os.getppid() != pid:  # the parent died before prctl took effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(pid, started), daemon=True, name="yolofeed-parent-watch").start()


def _watch_parent(pid: int, started: float, every: float = 1.0) -> None:
    """Exit once the parent is gone: reparented (POSIX), or its PID is free or reused (everywhere)."""
    while True:
        time.sleep(every)
        if os.getppid() != pid or not process_alive(pid, started):
            os._exit(1)


class Terminated(SystemExit):
    """SIGTERM's end of a command: exit status 143, and what the command says of what it kept (``said``), for the
    command line to print in one line."""

    def __init__(self, said: str = ""):
        super().__init__(128 + signal.SIGTERM)
        self.said = said


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """While inside, SIGTERM (``timeout``, ``docker stop``, a scheduler) ends this process as Ctrl-C does, its
    clean-up running, then with exit status 143 (``Terminated``, a ``SystemExit``).

    Only in the main thread and where nobody else handles SIGTERM; the previous handler is put back after.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Terminated

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def signals_deferred() -> Iterator[Callable[[], None]]:
    """While inside, SIGINT and SIGTERM are only noted (one ignored stays ignored); one noted is acted on at
    ``check()`` and as the block ends, SIGTERM where it came, its previous handler run then (Ctrl-C's
    KeyboardInterrupt, ``sigterm_exits``' SystemExit, or the default: the process ends), an exception on its way out
    included (it becomes the new one's context).

    Python raises KeyboardInterrupt (or the SystemExit a SIGTERM handler raises) at whatever bytecode the main thread
    is running. Inside a lock taken in two steps (tqdm's) that can leave it held, and what joins a thread waiting for
    it then waits for ever; a ``Thread.join`` cut short can release the thread's state lock it did not take (CPython's
    bpo-45274 fix), so the thread looks ended while it still runs inside torch, and the interpreter aborts if it exits
    then. Every wait inside must therefore be bounded: a deferred signal cannot cut it short. Only in the main thread
    (elsewhere handlers cannot be set, and no signal is raised there).
    """
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    if threading.current_thread() is not threading.main_thread() or None in previous.values():
        yield lambda: None  # None: a handler installed outside Python, which could not be put back
        return
    previous = {s: h for s, h in previous.items() if h != signal.SIG_IGN}  # one ignored stays ignored
    watched = tuple(previous)
    noted: list[int] = []

    def check() -> None:
        if not noted:
            return
        signum = signal.SIGTERM if signal.SIGTERM in noted else noted[0]  # SIGTERM after a Ctrl-C still ends us
        noted.clear()
        handler = previous[signum]
        if callable(handler):
            handler(signum, None)
        elif handler == signal.SIG_DFL:  # what the signal would have done: end the process
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for s in watched:
        signal.signal(s, lambda signum, frame: noted.append(signum))
    try:
        yield check
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        check()  # a signal that came after the last check


def result(future: concurrent.futures.Future) -> Any:
    """``future.result()``, waited for in timed steps (``WAIT_STEP_S``): Ctrl-C cuts it short."""
    while True:
        try:
            return future.result(WAIT_STEP_S)
        except concurrent.futures.TimeoutError:
            if future.done():  # it ended meanwhile, or what it ran raised TimeoutError: result() says which
                return future.result()


def wait_all(futures: Iterable[concurrent.futures.Future]) -> None:
    """``concurrent.futures.wait(futures)``, in timed steps: Ctrl-C cuts it short."""
    futures = list(futures)
    while concurrent.futures.wait(futures, WAIT_STEP_S).not_done:
        pass


def get(q: queue.Queue) -> Any:
    """``q.get()``, in timed steps: Ctrl-C cuts it short."""
    while True:
        try:
            return q.get(timeout=WAIT_STEP_S)
        except queue.Empty:
            pass


class Daemon:
    """``target(*args)`` in a daemon thread started now, with ``ended``: an event set as it returns, to wait on
    (``ended.wait(s)``, ``wait_for``) where a ``Thread.join`` would be the obvious wait. A join cut short by Ctrl-C may
    release the thread's state lock it did not take (CPython's bpo-45274 fix): the thread then looks ended (``join``
    returns, ``is_alive`` says False) while it still runs inside torch, and the interpreter aborts if it exits then."""

    def __init__(self, target: Callable[..., object], *args: Any, name: str):
        self.ended = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(target, args), name=name, daemon=True)
        self.thread.start()

    def _run(self, target: Callable[..., object], args: tuple) -> None:
        try:
            target(*args)
        finally:
            self.ended.set()

    def is_current(self) -> bool:
        """Whether the caller runs in this thread (which cannot wait for itself)."""
        return self.thread is threading.current_thread()


class Worker:
    """One daemon worker thread that runs what it is given in turn (``run`` waits, ``submit`` does not); ``first``, if
    given, runs in it before any job (a CUDA worker sets its device there: the caller's is not inherited).

    A daemon, so that an interpreter never hangs at exit on it; ``cancel`` skips what is queued, and ``close`` ends it
    once what is queued is done. A worker whose ``first`` failed, or that is closing, is not ``alive``: its callers
    run the work themselves (the jobs queued meanwhile get the failure, or run before it ends).
    """

    def __init__(self, name: str, first: Callable[[], object] | None = None):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.cancelled = threading.Event()  # set by the waiting thread when it stops waiting (Ctrl-C, an error)
        self.failed: BaseException | None = None  # what ``first`` raised
        self._closing = False
        self._worker = Daemon(self._serve_jobs, first, name=name)

    def _serve_jobs(self, first: Callable[[], object] | None) -> None:
        try:
            if first is not None:
                first()
        except BaseException as e:  # every queued job's waiter gets it, not a thread that has stopped
            self.failed = e
        while (job := self._jobs.get()) is not None:
            self._serve(*job)
            del job  # not kept while the next job is awaited: a job's arguments and result can be GPU memory

    def _serve(self, fn: Callable[..., Any], args: tuple, kwargs: dict, done: concurrent.futures.Future) -> None:
        if self.failed is not None:
            done.set_exception(self.failed)
        elif self.cancelled.is_set():  # the caller stopped waiting: what is queued behind is not run, and a later
            done.cancel()  # waiter gets CancelledError, not a wait without end
        elif done.set_running_or_notify_cancel():
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as e:  # handed to the waiting thread, which raises it there
                done.set_exception(e)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        """Queue ``fn(*args, **kwargs)`` behind what is queued; its future holds the result or the exception.

        Raises:
            RuntimeError: the worker ended or is closing (a job queued behind its end would never run).
        """
        if self._worker.ended.is_set() or self._closing:
            raise RuntimeError(f"yolofeed's {self._worker.thread.name} thread has stopped")
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((fn, args, kwargs, done))
        return done

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in the worker, after what is queued; returns its result or raises its exception."""
        return result(self.submit(fn, *args, **kwargs))

    def close(self, wait: float = 0.0) -> bool:
        """The worker ends once what is queued is done; waited for up to ``wait`` seconds. Returns whether it ended.

        The caller defers signals meanwhile (``signals_deferred``): a wait cut short by Ctrl-C or SIGTERM lets the
        interpreter exit while the worker is inside torch, and the process aborts ("terminate called without an active
        exception")."""
        self._closing = True
        self._jobs.put(None)
        if wait > 0 and not self._worker.is_current():
            return self._worker.ended.wait(wait)
        return self._worker.ended.is_set()

    def cancel(self) -> None:
        """Skip what is queued."""
        self.cancelled.set()

    def is_current(self) -> bool:
        """Whether the caller runs in the worker."""
        return self._worker.is_current()

    @property
    def alive(self) -> bool:
        """Whether it takes work: started, not failed in ``first``, not closing or ended."""
        return not (self._worker.ended.is_set() or self._closing or self.failed is not None)


SWITCH_S = 0.0005  # the interpreter's thread switch interval while ``switched_often`` holds (its default: 5 ms)
_switching = threading.Lock()
_switched = [0, 0.0]  # holders, the interval they found


@contextlib.contextmanager
def switched_often() -> Iterator[None]:
    """The interpreter's thread switch interval at ``SWITCH_S`` meanwhile (``sys.setswitchinterval``; the one found
    put back once the last holder leaves). A thread that runs many short torch calls beside a thread busy in Python
    (cuDNN's plans, made one convolution at a time, beside the trainer's build or the training) waits for the GIL
    after each call until the busy thread's time slice ends: up to 5 ms a call by default, seconds over a model's
    forward pass."""
    with _switching:
        if _switched[0] == 0:
            _switched[1] = sys.getswitchinterval()
            sys.setswitchinterval(min(SWITCH_S, _switched[1]))
        _switched[0] += 1
    try:
        yield
    finally:
        with _switching:
            _switched[0] -= 1
            if _switched[0] == 0:
                sys.setswitchinterval(_switched[1])


def wait_for(event: threading.Event) -> None:
    """``event.wait()``, in timed steps: Ctrl-C cuts it short. Wait for a thread on an event it sets as it returns, not
    with ``Thread.join``: a join cut short by Ctrl-C may release the thread's state lock it did not take (CPython's
    bpo-45274 fix), and the thread then looks ended while it runs."""
    while not event.wait(WAIT_STEP_S):
        pass


def acquire(lock: threading.Lock) -> None:
    """``lock.acquire()``, in timed steps: Ctrl-C cuts it short, and leaves the lock as it found it (an exception
    raised as a step took it gives it back)."""
    held = False
    try:
        while not held:
            held = lock.acquire(timeout=WAIT_STEP_S)
    except BaseException:
        if held:
            lock.release()
        raise


def left_running(what: str) -> None:
    """Note a thread a bounded wait gave up on (``LEFT_RUNNING``)."""
    LEFT_RUNNING.append(what)


def _end_now(name: str, code: int) -> None:
    """The process's end where a bounded wait gave up on a thread: one line naming the threads, the streams flushed,
    ``os._exit(code)``."""
    with contextlib.suppress(Exception):  # a closed pipe, say: the exit comes all the same
        print(f"{name}: {' and '.join(LEFT_RUNNING)} did not stop; ending the process now", file=sys.stderr,
              flush=True)
        sys.stdout.flush()
        logging.shutdown()
    os._exit(code)


def end_rank_if_left_running() -> None:
    """``own_process``' end for a DDP rank, whose main is Ultralytics' generated script: at the interpreter's exit
    (``atexit``, after the script's traceback is printed), where a bounded wait gave up on a thread, ``os._exit`` with
    the script's code: 130 after a Ctrl-C it did not catch, 1 after another exception, else 0 (a ``sys.exit(n)`` in
    the script would end 0: Ultralytics' does not call it). Registered once a process."""
    global _RANK_END
    if not _RANK_END:
        _RANK_END = True
        atexit.register(_end_rank)


def _end_rank() -> None:
    if LEFT_RUNNING:
        last = getattr(sys, "last_value", None)  # set where Python printed an exception the script did not catch
        _end_now(f"yolofeed (rank {os.environ.get('RANK', '?')})",
                 130 if isinstance(last, KeyboardInterrupt) else 1 if last is not None else 0)


def own_process(main: Callable[[], int | None], name: str = "yolofeed") -> int:
    """``main()`` as the whole of a process yolofeed started (the console script, a bench mode's process, a parity
    run's): where a bounded wait gave up on a thread (``LEFT_RUNNING``), the process ends at once (``os._exit``, with
    main's exit code: 130 after a Ctrl-C, 1 after an error main does not say, whose traceback is printed first), as
    the interpreter's exit would abort it where that thread is inside torch. Returns main's code otherwise (None: 0).
    ``main`` called in a process of the caller's (a test, a notebook) is never wrapped so."""
    LEFT_RUNNING.clear()
    code = 1  # an error main does not say: Python prints its traceback
    try:
        code = main() or 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1  # sys.exit("text") prints, exits 1
        raise
    except KeyboardInterrupt:
        code = 130
        raise
    except BaseException:
        if LEFT_RUNNING:  # printed here, as the exit below skips Python's own
            import traceback

            traceback.print_exc()
        raise
    finally:
        if LEFT_RUNNING:
            _end_now(name, code)
    return code

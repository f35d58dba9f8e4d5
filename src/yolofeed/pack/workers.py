"""The worker processes of a pack build: each fed over a pipe of its own, stoppable at any moment.

``concurrent.futures.ProcessPoolExecutor`` shares one result pipe among its workers and reads it from a
manager thread. Stopping a build (Ctrl-C, SIGTERM, a failed write) means ending workers mid-task, and
one ended while writing its result leaves half a message in that pipe: the manager thread waits for the
rest forever, and the shutdown that joins it hangs the build (1 Ctrl-C in 80 on the 2-core machine).
Here each worker has a duplex pipe of its own that only the parent reads, and no thread takes part:
stopping is kill, join and close, and nothing can wait on what a dead worker left behind.

Each worker holds one chunk at a time; the next is sent when its result arrives. The gap costs one pipe
round trip (well under a millisecond) per chunk of up to 64 images, ~0.1 s of work or more.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from yolofeed.processes import die_with_parent, process_start, signals_deferred

POLL_S = 0.5  # the longest wait before ``check`` runs: see ``processes.signals_deferred``
# How long ``stop`` waits for a worker it sent SIGTERM before it kills it: one that does not end on SIGTERM (an
# initializer's handler, say) would hang the build's join.
STOP_WAIT_S = 5.0
# How long ``close`` waits for the workers to run their finalizers and exit before it stops them.
CLOSE_WAIT_S = 10.0
# The signals a worker holds from its fork until ``_serve`` has set its own handlers. A worker forked a moment before
# a stop would otherwise run the parent's handler, which fork copies: one that defers the signal
# (``processes.signals_deferred``) let it live on, waiting for a job that never came, and the join hung the build (a
# stop at the first chunk: a full disk). Held, the signal waits and then ends it.
HELD = {signal.SIGINT, signal.SIGTERM}


class WorkerDied(Exception):
    """A worker process ended before returning its chunk; ``str()`` says how, e.g. "killed by signal 9 (SIGKILL)"."""


def mp_context() -> Any:
    """fork where there is one (workers start at once, sharing the imported modules); spawn elsewhere."""
    return mp.get_context("fork") if hasattr(os, "fork") else mp.get_context()


def _serve(conn: Any, initializer: Callable[..., None], initargs: tuple, finalizer: Callable[[], None],
           parent: tuple[int, float]) -> None:
    """A worker's life: set up, then answer each ``(fn, chunk)`` with ``(True, fn(chunk))`` or ``(False, error)``.

    It ends with its parent (``parent``: PID and start time), however the parent dies: a forked worker holds the
    other workers' ends of their pipes, so a parent killed alone leaves no pipe at EOF and the workers would wait
    for a job forever."""
    die_with_parent(*parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler, which fork copied: ``stop`` ends us
    if hasattr(signal, "pthread_sigmask"):  # held since the fork (``_held``): a SIGTERM sent meanwhile ends us now
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
    failed: Exception | None = None
    try:
        initializer(*initargs)
    except Exception as e:  # answered to the first chunk, so the parent raises it, not "a worker died"
        failed = e
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):  # the parent is gone or has closed our pipe
            break
        if job is None:
            break
        fn, chunk = job
        try:
            if failed is not None:
                raise failed
            reply = (True, fn(chunk))
        except Exception as e:  # a full disk (ENOSPC) in a write, say: the parent re-raises it
            reply = (False, e)
        conn.send(reply)
    if failed is None:
        finalizer()


class Workers:
    """``n`` worker processes (or, for ``n == 1``, the calling process itself) that map a function over chunks.

    Args:
        n: processes to start; 1 runs everything in the calling process (no fork: easy to debug and profile).
        initializer: called once in each worker with ``initargs`` (in-process: at construction).
        finalizer: called in each worker when it is told to stop (in-process: at ``close``/``stop``).
    """

    def __init__(self, n: int, initializer: Callable[..., None], initargs: tuple,
                 finalizer: Callable[[], None] = lambda: None, ctx: Any = None):
        self._finalizer = finalizer
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        if n <= 1:
            initializer(*initargs)
            return
        ctx = ctx or mp_context()
        me = (os.getpid(), process_start(os.getpid()) or 0.0)
        try:
            # a Ctrl-C noted, not raised, until every worker started is recorded: Python raises it in the main thread
            # whichever thread takes the signal, so the mask below cannot keep it out of a start cut after its fork
            with signals_deferred():
                for _ in range(n):
                    mine, theirs = ctx.Pipe(duplex=True)
                    p = ctx.Process(target=_serve, args=(theirs, initializer, initargs, finalizer, me), daemon=True,
                                    name="yolofeed-pack-worker")
                    self._procs.append(p)  # before it starts (a start that raises after its fork: see ``processes``)
                    self._conns.append(mine)
                    with _held(ctx):
                        p.start()
                    theirs.close()  # ours closed, the worker's death reads as EOF here
        except BaseException:
            self.stop()
            raise

    @property
    def processes(self) -> list[Any]:
        """The worker processes started (one being started when a stop came is not among them)."""
        return [p for p in self._procs if p.pid is not None]

    def imap(self, fn: Callable[[list], list], chunks: Iterable[list], check: Callable[[], None]) -> Iterator[Any]:
        """Each item of ``fn(chunk)`` for every chunk, chunk by chunk in completion order.

        ``check()`` runs after every chunk and at least every ``POLL_S`` seconds (signals are acted on there).

        Raises:
            WorkerDied: a worker ended before answering (the other workers are stopped first).
            Exception: whatever ``fn`` or the initializer raised in a worker.
        """
        chunks = iter(chunks)
        if not self._procs:
            for chunk in chunks:
                yield from fn(chunk)
                check()
            return
        busy: dict[Any, Any] = {}  # pipe -> its worker's sentinel, for the workers holding a chunk

        def feed(conn: Any, proc: Any) -> None:
            chunk = next(chunks, None)
            if chunk is None:
                return
            try:
                conn.send((fn, chunk))
            except OSError:  # the worker is gone: its sentinel is ready, the wait below says how
                pass
            busy[conn] = proc.sentinel

        for conn, proc in zip(self._conns, self._procs):
            feed(conn, proc)
        by_conn = dict(zip(self._conns, self._procs))
        while busy:
            ready = mp.connection.wait([*busy, *busy.values()], timeout=POLL_S)
            check()
            if any(r in busy for r in ready):
                conn = next(r for r in ready if r in busy)
                try:
                    ok, out = conn.recv()
                except (EOFError, OSError):
                    self._died()
                del busy[conn]
                if not ok:
                    raise out
                feed(conn, by_conn[conn])
                yield from out
            elif ready:  # only a sentinel: a worker ended without answering
                self._died()

    def _died(self) -> None:
        self.stop()
        raise WorkerDied(exit_codes(self.processes) or "no exit status")

    def close(self) -> None:
        """End the workers after their current chunk (the normal end of a build): each runs its finalizer and exits.
        One still there ``CLOSE_WAIT_S`` later (a finalizer stuck on a hung file system) is stopped as ``stop`` stops
        it: every result it wrote is already in the parent's hands or in the shared file's pages."""
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        deadline = time.monotonic() + CLOSE_WAIT_S
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
        if any(p.exitcode is None for p in self.processes):
            self.stop()
        else:
            self._finish()

    def stop(self) -> None:
        """End the workers now, mid-chunk (SIGTERM; their own handler is the default, which ends them), and kill those
        still there ``STOP_WAIT_S`` after (one that had not set that handler yet), all within one deadline; killed
        however the wait ends (a second Ctrl-C in it: the interpreter's exit would join them for ever)."""
        started = self.processes
        for p in started:
            if p.exitcode is None:
                with contextlib.suppress(OSError, ValueError):
                    p.terminate()
        deadline = time.monotonic() + STOP_WAIT_S
        try:
            for p in started:
                p.join(max(0.0, deadline - time.monotonic()))
        finally:
            for p in started:
                if p.exitcode is None:
                    with contextlib.suppress(OSError, ValueError):
                        p.kill()
            self._finish()

    def _finish(self) -> None:
        """Wait for the worker processes, close their pipes; in-process (no workers), run the finalizer here."""
        for p in self.processes:
            p.join()
        for conn in self._conns:
            conn.close()
        self._conns = []
        if not self._procs:
            self._finalizer()


@contextlib.contextmanager
def _held(ctx: Any) -> Iterator[None]:
    """``HELD`` blocked in this thread meanwhile, where a fork starts the worker: the worker is born holding them, and
    ``_serve`` lets them in once its own handlers are set. The parent's held ones come in as this ends."""
    if ctx.get_start_method() != "fork" or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, ())  # read only: a signal checked for here changes nothing
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, HELD)  # its signal check may raise: the finally puts the mask back
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def exit_codes(processes: list) -> str:
    """How stopped workers ended, e.g. "killed by signal 9 (SIGKILL)", for an error message."""
    codes = {p.exitcode for p in processes} - {None, 0}
    if codes - {-signal.SIGTERM}:  # ``stop`` sends SIGTERM to the others once one died
        codes -= {-signal.SIGTERM}
    words = []
    for c in sorted(codes):
        name = signal.Signals(-c).name if -c in signal.valid_signals() else "?"
        words.append(f"killed by signal {-c} ({name})" if c < 0 else f"exit status {c}")
    return ", ".join(words)

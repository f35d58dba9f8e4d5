"""The pack build's worker processes: every result once, errors carried over, and stopping never hangs."""

from __future__ import annotations

import errno
import os
import signal
import threading
import time

import pytest

from yolofeed.pack.workers import WorkerDied, Workers

BOUND = 30.0  # s: only to tell a hang from a slow machine


def _square(chunk: list[int]) -> list[int]:
    return [x * x for x in chunk]


def _disk_full(chunk: list[int]) -> list[int]:
    raise OSError(errno.ENOSPC, "No space left on device")


def _die_on_seven(chunk: list[int]) -> list[int]:
    if 7 in chunk:
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
    return chunk


def _huge(chunk: list[int]) -> list[bytes]:
    return [bytes(64 << 20)]  # far beyond a pipe's buffer: the worker is still writing it when it is stopped


def _nothing(*_: object) -> None:
    pass


def _bad_init(*_: object) -> None:
    raise RuntimeError("cannot open the temporary file")


def _within(seconds: float, fn):
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(value=fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still waiting after {seconds} s: a hang"
    return out.get("value")


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_item_comes_back_once(n):
    pool = Workers(n, _nothing, ())
    chunks = [list(range(k, min(k + 4, 50))) for k in range(0, 50, 4)]
    got = list(pool.imap(_square, iter(chunks), lambda: None))
    pool.close()
    assert sorted(got) == [x * x for x in range(50)]
    assert all(p.exitcode == 0 for p in pool.processes)


@pytest.mark.parametrize("n", [1, 2])
def test_an_error_in_a_worker_reaches_the_caller_as_itself(n):
    pool = Workers(n, _nothing, ())
    with pytest.raises(OSError) as e:
        list(pool.imap(_disk_full, iter([[1], [2]]), lambda: None))
    pool.stop()
    assert e.value.errno == errno.ENOSPC


def test_a_failed_initializer_is_raised_not_reported_as_a_death():
    pool = Workers(2, _bad_init, ())
    with pytest.raises(RuntimeError, match="cannot open the temporary file"):
        list(pool.imap(_square, iter([[1], [2], [3]]), lambda: None))
    pool.stop()


def test_a_killed_worker_is_one_error_that_says_how_and_the_others_end():
    pool = Workers(2, _nothing, ())
    with pytest.raises(WorkerDied, match=r"killed by signal 9 \(SIGKILL\)"):
        list(pool.imap(_die_on_seven, iter([[k] for k in range(20)]), lambda: None))
    assert all(p.exitcode is not None for p in pool.processes)


def test_stopping_while_a_worker_writes_its_result_does_not_hang():
    """The case that hung ProcessPoolExecutor's shutdown: a worker ended with half a message in its pipe."""
    pool = Workers(2, _nothing, ())

    def check():
        raise KeyboardInterrupt  # Ctrl-C, acted on as soon as the first bytes of a result arrive

    with pytest.raises(KeyboardInterrupt):
        list(pool.imap(_huge, iter([[1], [2]]), check))
    _within(BOUND, pool.stop)
    assert all(p.exitcode == -signal.SIGTERM for p in pool.processes)


def _deaf_to_sigterm(*_: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as the parent's deferring handler, still there after the fork


def test_a_worker_that_does_not_end_on_sigterm_is_killed_not_waited_for(monkeypatch):
    """A worker forked a moment before ``stop`` runs the parent's SIGTERM handler (fork copies it) until it sets the
    default; one that defers the signal left the worker waiting for a job, and ``stop``'s join hung the build (found
    by CI under load: a full tmpfs at the first chunk). It is killed after ``STOP_WAIT_S``."""
    from yolofeed.pack import workers

    monkeypatch.setattr(workers, "STOP_WAIT_S", 0.5)
    pool = Workers(4, _deaf_to_sigterm, ())
    try:
        assert sorted(pool.imap(_square, iter([[1], [2], [3], [4]]), lambda: None)) == [1, 4, 9, 16]  # serving
        t0 = time.monotonic()
        _within(BOUND, pool.stop)
        assert all(p.exitcode == -signal.SIGKILL for p in pool.processes)
        assert time.monotonic() - t0 < 4 * 0.5  # one deadline for them all, not one a worker
    finally:  # a failed test leaves no worker that would hang the interpreter's exit (it joins them)
        for p in pool.processes:
            if p.is_alive():
                p.kill()


def _stuck() -> None:
    time.sleep(3600)  # a finalizer's unmap on a file system that stopped answering


def test_a_finalizer_that_never_returns_is_stopped_not_waited_for(monkeypatch):
    """``close`` joined the workers without a bound: a finalizer stuck on a hung file system hung the build's end
    after every result was in. They are stopped ``CLOSE_WAIT_S`` after they were told to end."""
    from yolofeed.pack import workers

    monkeypatch.setattr(workers, "CLOSE_WAIT_S", 0.5)
    pool = Workers(2, _nothing, (), _stuck)
    try:
        assert sorted(pool.imap(_square, iter([[1], [2], [3]]), lambda: None)) == [1, 4, 9]
        _within(BOUND, pool.close)
        assert all(p.exitcode is not None for p in pool.processes)
    finally:
        for p in pool.processes:
            if p.is_alive():
                p.kill()


def _sigterm_myself(*_: object) -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # a stop's SIGTERM, come before the worker set its own handler


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask") or not hasattr(os, "fork"), reason="POSIX fork")
def test_a_sigterm_before_the_worker_set_its_handler_still_ends_it(monkeypatch):
    """A SIGTERM that reaches a worker before ``_serve`` sets its handlers meets the parent's handler, which fork
    copied; a deferring one let the worker live on (the hang CI found). The worker is born holding the signal, which
    then ends it, without ``stop``'s kill."""
    from yolofeed.pack import workers

    monkeypatch.setattr(workers, "die_with_parent", _sigterm_myself)  # the first thing _serve does
    deferred: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, _frame: deferred.append(signum))  # as signals_deferred
    try:
        pool = Workers(2, _nothing, ())
    finally:
        signal.signal(signal.SIGTERM, before)
    try:
        for p in pool.processes:
            p.join(BOUND / 3)
        assert [p.exitcode for p in pool.processes] == [-signal.SIGTERM] * 2
        assert deferred == []  # and the parent's own mask is as it was: no signal held back there
        assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) & workers.HELD == set()
    finally:
        for p in pool.processes:
            if p.is_alive():
                p.kill()
        pool.stop()


class _CutAfterFork:
    """A fork context whose second worker's start is cut by a Ctrl-C just after its fork."""

    def __init__(self) -> None:
        import multiprocessing as mp

        self.ctx, self.started = mp.get_context("fork"), []

    def get_start_method(self) -> str:
        return "fork"

    def Pipe(self, **kwargs: object):  # noqa: N802 (multiprocessing's name)
        return self.ctx.Pipe(**kwargs)

    def Process(self, **kwargs: object):  # noqa: N802
        p = self.ctx.Process(**kwargs)
        start = p.start

        def cut() -> None:
            start()
            self.started.append(p)
            if len(self.started) == 2:
                raise KeyboardInterrupt

        p.start = cut
        return p


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_ctrl_c_just_after_a_fork_leaves_no_worker_behind():
    """A worker is tracked before it starts: a Ctrl-C just after its fork stops it with the others (it waited for a
    job, untracked, until the parent exited)."""
    ctx = _CutAfterFork()
    with pytest.raises(KeyboardInterrupt):
        Workers(3, _nothing, (), ctx=ctx)
    try:
        assert len(ctx.started) == 2
        for p in ctx.started:
            p.join(BOUND / 3)
        assert [p.exitcode for p in ctx.started] == [-signal.SIGTERM] * 2
    finally:
        for p in ctx.started:
            if p.is_alive():
                p.kill()


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX")
def test_a_ctrl_c_as_the_signals_are_held_leaves_the_mask_as_it_was(monkeypatch):
    """CPython checks for signals as it changes the mask: a Ctrl-C then raised after the block, before the try that
    puts the mask back, left SIGINT and SIGTERM blocked in the parent for good (found by a reviewer: a later child
    inherited it, and SIGTERM no longer ended it)."""
    import multiprocessing as mp

    from yolofeed.pack import workers

    real = signal.pthread_sigmask

    def checked(how, mask):
        out = real(how, mask)
        if how == signal.SIG_BLOCK and set(mask) == workers.HELD:
            raise KeyboardInterrupt  # as PyErr_CheckSignals raises a Ctrl-C that came meanwhile
        return out

    before = real(signal.SIG_BLOCK, ())
    monkeypatch.setattr(signal, "pthread_sigmask", checked)
    with pytest.raises(KeyboardInterrupt), workers._held(mp.get_context("fork")):
        pass
    monkeypatch.setattr(signal, "pthread_sigmask", real)
    assert real(signal.SIG_BLOCK, ()) == before


def test_a_second_ctrl_c_while_stop_waits_still_kills_the_workers(monkeypatch):
    """A Ctrl-C in ``stop``'s wait (the build's second): the workers are killed all the same, or the interpreter's
    exit, which joins them, would wait for ever (found by a reviewer)."""
    from yolofeed.pack import workers

    monkeypatch.setattr(workers, "STOP_WAIT_S", 5.0)
    pool = Workers(2, _deaf_to_sigterm, ())
    try:
        assert sorted(pool.imap(_square, iter([[1], [2]]), lambda: None)) == [1, 4]
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            pool.stop()
        for p in pool.processes:
            p.join(BOUND)
        assert all(p.exitcode == -signal.SIGKILL for p in pool.processes)
    finally:
        for p in pool.processes:
            if p.is_alive():
                p.kill()

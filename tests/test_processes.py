"""Signals deferred to where no lock or wait is held: noted, acted on once at ``check()`` or as the block ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from yolofeed import processes
from yolofeed.processes import signals_deferred


class Stopped(Exception):
    """What the tests' handlers raise: a KeyboardInterrupt that escaped a broken deferral would stop the session."""


@contextlib.contextmanager
def handlers(**by_name):
    """Install handlers (name: handler) for the block, the previous ones put back after."""
    previous = {name: signal.signal(getattr(signal, name), h) for name, h in by_name.items()}
    try:
        yield
    finally:
        for name, h in previous.items():
            signal.signal(getattr(signal, name), h)


def _raise(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def test_signals_wait_for_check_then_run_the_previous_handler():
    with handlers(SIGINT=_raise):
        with signals_deferred() as check:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # delivered and noted: nothing raised here, inside a lock or not
            with pytest.raises(Stopped):
                check()
            check()  # noted once, acted on once
        assert signal.getsignal(signal.SIGINT) is _raise


def test_a_signal_after_the_last_check_is_acted_on_at_the_end():
    seen = []
    with handlers(SIGTERM=lambda signum, frame: seen.append(signum)):
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert seen == []
        assert seen == [signal.SIGTERM]


def test_a_signal_noted_while_an_exception_is_on_its_way_out_is_acted_on_after_it_with_it_as_context():
    reached = []

    def handler(signum, frame):
        raise Stopped(f"reached the end of the clean-up: {bool(reached)}")

    with handlers(SIGINT=handler), pytest.raises(Stopped) as raised:
        with signals_deferred():
            try:
                raise RuntimeError("the run failed")
            finally:  # a clean-up the signal came during: it runs to its end first
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                reached.append(True)
    assert str(raised.value) == "reached the end of the clean-up: True"
    assert isinstance(raised.value.__context__, RuntimeError)


def test_sigterm_noted_after_a_ctrl_c_is_the_one_acted_on():
    seen = []
    with handlers(SIGINT=lambda s, f: seen.append("SIGINT"), SIGTERM=lambda s, f: seen.append("SIGTERM")):
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        assert seen == ["SIGTERM"]


def test_an_ignored_signal_stays_ignored_and_takes_no_turn():
    seen = []
    with handlers(SIGINT=signal.SIG_IGN, SIGTERM=lambda s, f: seen.append("SIGTERM")):
        with signals_deferred() as check:
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            check()
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN and seen == []


def test_outside_the_main_thread_nothing_is_deferred():
    seen = []

    def run():
        with signals_deferred() as check:
            check()
            seen.append(signal.getsignal(signal.SIGINT))

    with handlers(SIGINT=_raise):
        t = threading.Thread(target=run)
        t.start()
        t.join()
    assert seen == [_raise]


# a child process: polars (which Ultralytics imports to read results.csv) installs its SIGINT handler with SA_RESTART,
# after which an untimed wait is not cut short by Ctrl-C; each of yolofeed's waits must still be
CHILD = """
import os, queue, signal, sys, threading, time
from concurrent.futures import Future
try:
    import polars
except ImportError:  # a release without it: the waits are still timed
    pass
from yolofeed import processes
never = Future()
waits = {"result": lambda: processes.result(never), "wait_all": lambda: processes.wait_all([never]),
         "get": lambda: processes.get(queue.Queue()), "wait_for": lambda: processes.wait_for(threading.Event()),
         "acquire": lambda: processes.acquire(held)}
held = threading.Lock()
held.acquire()
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
t = time.monotonic()
try:
    waits[sys.argv[1]]()
except KeyboardInterrupt:
    print(time.monotonic() - t)
"""


@pytest.mark.parametrize("wait", ["result", "wait_all", "get", "wait_for", "acquire"])
def test_ctrl_c_cuts_each_wait_short_after_polars_took_sigint(wait):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", CHILD, wait], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip(), out.stderr[-2000:]
    assert float(out.stdout) < 5  # untimed, it waited for ever (the subprocess's timeout)


def test_a_result_that_ends_between_two_steps_is_returned_and_its_own_timeout_error_raised():
    from concurrent.futures import Future

    from yolofeed import processes

    done = Future()
    threading.Timer(0.6, done.set_result, ("value",)).start()
    assert processes.result(done) == "value"
    failed = Future()
    failed.set_exception(TimeoutError("what it ran timed out"))
    with pytest.raises(TimeoutError, match="what it ran"):
        processes.result(failed)


# a bench mode's process whose run left a thread a bounded wait gave up on (one that never ends: the interpreter's exit
# would wait for it for ever, where one inside torch aborts it)
MODE_LEFT = """
import threading, time
import yolofeed.bench.run as bench
from yolofeed import processes

def mode_main():
    threading.Thread(target=time.sleep, args=(600,), name="yolofeed-validation").start()
    processes.left_running("the validation thread")
    {end}

bench.mode_main = mode_main
exec(bench._MODE_MAIN)
"""


@pytest.mark.parametrize("end, code", [("return None", 0), ("raise KeyboardInterrupt", 130), ("raise SystemExit()", 0),
                                       ("raise SystemExit('said')", 1), ("raise SystemExit(3)", 3)])
def test_a_bench_modes_process_that_left_a_thread_running_ends_at_once(end, code):
    out = subprocess.run([sys.executable, "-c", MODE_LEFT.format(end=end)], capture_output=True, text=True, timeout=60)
    assert out.returncode == code, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == ("yolofeed bench: the validation thread did not stop; ending the "
                                                   "process now")


def test_own_process_returns_mains_code_and_leaves_a_clean_run_alone():
    def interrupted():
        raise KeyboardInterrupt

    assert processes.own_process(lambda: 3) == 3
    assert processes.own_process(lambda: None) == 0
    with pytest.raises(KeyboardInterrupt):
        processes.own_process(interrupted)


RANK_LEFT = """
import atexit, sys, threading, time
from yolofeed import processes

atexit.register(lambda: print("a handler registered before ran", flush=True))  # runs after ours: os._exit skips it
processes.end_rank_if_left_running()
processes.end_rank_if_left_running()  # once a process, however many trainers it builds
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
if {left}:
    processes.left_running("the loader thread")
{end}
"""


@pytest.mark.parametrize("end, code", [("pass", 0), ("raise RuntimeError('boom')", 1),
                                       ("raise KeyboardInterrupt", 130)])
def test_a_ddp_rank_that_left_a_thread_running_ends_at_once_with_its_scripts_code(end, code):
    """A rank's main is Ultralytics' generated script, which own_process does not wrap: the same end at the
    interpreter's exit, after the script's traceback, with its code; a rank that left nothing running exits as
    Python would (the earlier exit handler runs)."""
    out = subprocess.run([sys.executable, "-c", RANK_LEFT.format(left=True, end=end)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "RANK": "1"})
    assert out.returncode == code, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == ("yolofeed (rank 1): the loader thread did not stop; ending the "
                                                   "process now")
    assert "handler registered before" not in out.stdout
    if code == 1:
        assert "RuntimeError: boom" in out.stderr
    clean = subprocess.run([sys.executable, "-c", RANK_LEFT.format(left=False, end=end)], capture_output=True,
                           text=True, timeout=60)
    assert "handler registered before ran" in clean.stdout and "did not stop" not in clean.stderr


def test_the_switch_interval_is_short_while_held_and_put_back_by_the_last_holder():
    """Held by two threads' passes at once (the early plans', the validations'), the interval found is put back when
    the last leaves, an error included; a shorter interval a user set is kept."""
    import sys

    from yolofeed import processes

    found = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        with processes.switched_often():
            assert sys.getswitchinterval() == pytest.approx(processes.SWITCH_S)
            with processes.switched_often():
                pass
            assert sys.getswitchinterval() == pytest.approx(processes.SWITCH_S)
        assert sys.getswitchinterval() == pytest.approx(0.005)
        with pytest.raises(ZeroDivisionError), processes.switched_often():
            raise ZeroDivisionError
        assert sys.getswitchinterval() == pytest.approx(0.005)
        sys.setswitchinterval(0.0001)
        with processes.switched_often():
            assert sys.getswitchinterval() == pytest.approx(0.0001, rel=0.05)
    finally:
        sys.setswitchinterval(found)

"""Signals deferred to where no lock or wait is held: noted, acted on once at ``check()`` or as the block ends."""

from __future__ import annotations

import os
import signal
import time

import pytest

from yolofeed.processes import signals_deferred


def test_signals_wait_for_check_then_run_the_previous_handler():
    with signals_deferred() as check:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # delivered and noted: nothing raised here, inside a lock or not
        with pytest.raises(KeyboardInterrupt):
            check()
        check()  # noted once, acted on once
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_signal_after_the_last_check_is_acted_on_at_the_end():
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert seen == []
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with signals_deferred() as check:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            check()
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_signal_noted_while_an_exception_is_on_its_way_out_is_acted_on_with_it_as_context():
    with pytest.raises(KeyboardInterrupt) as raised:
        with signals_deferred():
            try:
                raise RuntimeError("the run failed")
            finally:  # a clean-up the signal came during
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
    assert isinstance(raised.value.__context__, RuntimeError)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_outside_the_main_thread_nothing_is_deferred():
    import threading

    seen = []

    def run():
        with signals_deferred() as check:
            check()
            seen.append(signal.getsignal(signal.SIGINT))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [signal.default_int_handler]

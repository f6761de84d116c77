"""The runner's signal rules (:mod:`spotwise.engine.run.signals`): SIGTERM becomes an exception that
lets teardown run; during teardown SIGINT and SIGTERM are recorded, never raised."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from spotwise.engine.run import signals


def test_sigterm_raises_terminated_a_keyboard_interrupt_then_the_old_handler_is_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(signals.Terminated) as e:
        with signals.sigterm_raises():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):          # the handler runs between bytecodes
                pass
    assert isinstance(e.value, KeyboardInterrupt) and "SIGTERM" in str(e.value)
    assert signal.getsignal(signal.SIGTERM) is before


def test_signals_during_teardown_are_deferred_not_raised():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with signals.deferred() as got:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):
            os.kill(os.getpid(), s)
            for _ in range(1000):
                pass
    assert got == [signal.SIGINT, signal.SIGTERM, signal.SIGINT]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_outside_the_main_thread_nothing_changes():
    out = {}

    def body():
        with signals.sigterm_raises(), signals.deferred() as got:
            out["got"] = got
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert out["got"] == []

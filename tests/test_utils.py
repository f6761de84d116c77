"""The shared helpers in ``spotwise.utils``: retry, timestamps, free ports, process liveness."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from spotwise.utils import retry
from spotwise.utils import net
from spotwise.utils.net import free_port, service_port
from spotwise.utils.procs import group_alive, pid_alive, proc_state
from spotwise.utils.timefmt import iso_utc, iso_utc_or_none


class Flaky:
    def __init__(self, failures: int, exc: BaseException) -> None:
        self.failures, self.exc, self.calls = failures, exc, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc
        return "ok"


def test_retry_until_success_with_capped_backoff() -> None:
    sleeps: list[float] = []
    fn = Flaky(4, TimeoutError("slow"))
    out = retry.with_backoff(fn, should_retry=lambda e: True, attempts=6, base_s=1, cap_s=4,
                             jitter=lambda d: d, sleep=sleeps.append)
    assert out == "ok" and fn.calls == 5
    assert sleeps == [1, 2, 4, 4]


def test_retry_waits_at_least_what_retry_after_asks_and_caps_it() -> None:
    slept: list[float] = []
    asked = iter([30.0, None, 1e6])
    out = retry.with_backoff(Flaky(3, RuntimeError("429")), should_retry=lambda e: True, attempts=4, base_s=1,
                             sleep=slept.append, jitter=lambda d: d, retry_after=lambda e: next(asked))
    assert out == "ok" and slept == [30.0, 2.0, retry.MAX_RETRY_AFTER_S]
    assert retry.retry_after_header({"Retry-After": "12"}) == 12.0
    assert retry.retry_after_header({"Retry-After": "soon"}) is None and retry.retry_after_header(None) is None


def test_retry_not_retryable_raises_at_once() -> None:
    fn = Flaky(1, KeyError("x"))
    with pytest.raises(KeyError):
        retry.with_backoff(fn, should_retry=lambda e: False, sleep=pytest.fail)
    assert fn.calls == 1


def test_retry_exhausted_raises_last_error_or_give_up() -> None:
    err = TimeoutError("slow")
    with pytest.raises(TimeoutError) as ei:
        retry.with_backoff(Flaky(9, err), should_retry=lambda e: True, attempts=3, sleep=lambda s: None)
    assert ei.value is err
    with pytest.raises(RuntimeError, match="gave up") as ei2:
        retry.with_backoff(Flaky(9, err), should_retry=lambda e: True, attempts=3, sleep=lambda s: None,
                           give_up=lambda e: RuntimeError(f"gave up: {e}"))
    assert ei2.value.__cause__ is err


def test_jitters_stay_in_range() -> None:
    for _ in range(200):
        assert 0 <= retry.full_jitter(2.0) <= 2.0
        assert 1.0 <= retry.half_jitter(2.0) <= 2.0


def test_iso_utc() -> None:
    assert iso_utc(0) == "1970-01-01T00:00:00Z"
    assert iso_utc(1735732800.9) == "2025-01-01T12:00:00Z"
    assert iso_utc_or_none(None) is None and iso_utc_or_none(0) is None
    assert iso_utc_or_none(1735732800) == "2025-01-01T12:00:00Z"


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_pid_alive_running_zombie_and_gone() -> None:
    assert pid_alive(os.getpid()) and proc_state(os.getpid()) in {"R", "S"}
    assert not pid_alive(None) and not pid_alive(0)
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    try:
        for _ in range(200):          # wait until it exits but stays unreaped (a zombie)
            if proc_state(child.pid) == "Z":
                break
            time.sleep(0.02)
        assert proc_state(child.pid) == "Z"
        assert not pid_alive(child.pid)
        assert not group_alive(child.pid)
    finally:
        child.wait()
    assert not pid_alive(child.pid) and proc_state(child.pid) is None


def test_group_alive_for_a_running_group() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert group_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not group_alive(child.pid)


def test_service_ports_come_from_below_the_ephemeral_range_and_never_twice() -> None:
    """A port picked for a server that binds it later is never one the kernel hands out on its
    own (the ephemeral range) nor one this process handed out before, and it binds now."""
    low = int(net.EPHEMERAL_RANGE.read_text().split()[0]) if net.EPHEMERAL_RANGE.exists() else 32768
    ports = [service_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(net.SERVICE_PORTS_LO <= p < low for p in ports), ports
    taken = net.SERVICE_PORTS_LO + (ports[-1] + 1 - net.SERVICE_PORTS_LO) % (low - net.SERVICE_PORTS_LO)
    with socket.socket() as s:
        s.bind(("0.0.0.0", taken))                   # the next one of the walk is taken: skipped
        nxt = service_port()
        assert nxt != taken and nxt not in ports
    with socket.socket() as s:
        s.bind(("127.0.0.1", service_port("127.0.0.1")))


def test_service_port_falls_back_to_the_kernel_where_the_range_is_too_small(tmp_path, monkeypatch) -> None:
    rng = tmp_path / "ip_local_port_range"
    rng.write_text(f"{net.SERVICE_PORTS_LO + 10}\t60999\n")
    monkeypatch.setattr(net, "EPHEMERAL_RANGE", rng)
    port = service_port()
    assert port >= net.SERVICE_PORTS_LO + 10           # the kernel's pick: from its ephemeral range
    monkeypatch.setattr(net, "EPHEMERAL_RANGE", tmp_path / "missing")
    assert net._ephemeral_low() == 32768                # unreadable: Linux's default, checked by binding

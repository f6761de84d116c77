"""The front door (:mod:`spotwise.service.guard`) at the ASGI level: the token is checked and the
declared size refused before the body is read, and a streamed body is cut off at the limit."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from spotwise.service import auth
from spotwise.service.app import create_app
from spotwise.service.scheduler import Scheduler


@pytest.fixture
def app(sqlite_db, monkeypatch):
    monkeypatch.setenv("SPOTWISE_MAX_BODY_BYTES", "4096")
    return create_app(Scheduler(launcher=lambda job_id: None))


def call(app, headers, chunks=(b"{}",)):
    """Run one POST through the ASGI app; returns (status, body, how many times it read the body)."""
    reads = 0
    sent = []
    pending = list(chunks)

    async def receive():
        nonlocal reads
        reads += 1
        body = pending.pop(0) if pending else b""
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    async def send(msg):
        sent.append(msg)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/api/v1/budgets", "raw_path": b"/api/v1/budgets", "query_string": b"",
             "root_path": "", "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
             "client": ("127.0.0.1", 1), "server": ("testserver", 80)}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], body, reads


def test_unauthenticated_large_body_is_401_before_reading_it(app):
    status, _, reads = call(app, {"content-length": str(200 << 20), "content-type": "application/json"})
    assert status == 401 and reads == 0


def test_declared_large_body_with_a_token_is_413_before_reading_it(app):
    token = auth.create_token("limit")
    status, body, reads = call(app, {"content-length": str(200 << 20), "authorization": f"Bearer {token}",
                                     "content-type": "application/json"})
    assert status == 413 and reads == 0 and "4096" in json.loads(body)["detail"]


def test_streamed_body_is_cut_off_at_the_limit(app):
    token = auth.create_token("limit")
    chunks = [b"x" * 1024] * 100
    status, _, reads = call(app, {"transfer-encoding": "chunked", "authorization": f"Bearer {token}",
                                  "content-type": "application/json"}, chunks)
    assert status == 413 and reads <= 5


def test_small_body_passes(app):
    token = auth.create_token("limit")
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as c:
        assert c.post("/api/v1/budgets", json={"id": "small", "cap_usd": 5}).status_code == 201


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5"])
def test_a_bad_body_limit_stops_serve_before_it_listens_naming_the_setting(sqlite_db, monkeypatch, capsys, value):
    """Never a silent default: ``spotwise serve`` with a body limit that is not a whole number of
    bytes >= 1 exits 2 naming the setting, before it binds a port (the app is built first)."""
    from spotwise.cli import main

    monkeypatch.setenv("SPOTWISE_MAX_BODY_BYTES", value)
    assert main(["serve", "--port", "1"]) == 2          # port 1 would fail to bind as non-root anyway
    err = capsys.readouterr().err
    assert "SPOTWISE_MAX_BODY_BYTES" in err and "whole number" in err and "Traceback" not in err


def test_the_limit_is_read_once_when_the_app_is_built(sqlite_db, monkeypatch):
    """A setting changed (or broken) while the server runs does not reach a request."""
    monkeypatch.setenv("SPOTWISE_MAX_BODY_BYTES", "4096")
    app = create_app(Scheduler(launcher=lambda job_id: None))
    monkeypatch.setenv("SPOTWISE_MAX_BODY_BYTES", "not a number")
    status, _, reads = call(app, {"authorization": f"Bearer {auth.create_token('once')}", "content-length": "5000",
                                  "content-type": "application/json"})
    assert status == 413 and reads == 0

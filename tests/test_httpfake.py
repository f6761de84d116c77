"""The loopback server every wire-level fake uses (``tests/httpfake.py``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from httpfake import Exchange, LoopbackServer


def test_routes_by_method_and_answers_501_for_others() -> None:
    seen: list[tuple[str, str, bytes]] = []

    def post(ex: Exchange) -> None:
        seen.append((ex.command, ex.url.path, ex.read_body()))
        ex.send_json(201, {"ok": True}, headers={"X-Fake": "1"})

    with LoopbackServer({"GET": lambda ex: ex.send(200, "hi"), "POST": post}) as srv:
        assert srv.url == f"http://127.0.0.1:{srv.port}"
        with urllib.request.urlopen(srv.url + "/a?b=1") as r:
            assert (r.status, r.read(), r.headers["Content-Type"]) == (200, b"hi", "text/plain")
        req = urllib.request.Request(srv.url + "/p", data=b'{"x": 1}', method="POST")
        with urllib.request.urlopen(req) as r:
            assert (r.status, json.loads(r.read()), r.headers["X-Fake"]) == (201, {"ok": True}, "1")
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(urllib.request.Request(srv.url + "/", method="DELETE"))
        assert ei.value.code == 501
    assert seen == [("POST", "/p", b'{"x": 1}')]


def test_stop_is_idempotent_and_safe_before_start() -> None:
    LoopbackServer({}).stop()
    srv = LoopbackServer({"GET": lambda ex: ex.send(204)}).start()
    srv.stop()
    srv.stop()

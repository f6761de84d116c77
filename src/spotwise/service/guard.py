"""The HTTP front door, in front of every route (a plain ASGI middleware).

What it enforces, and why here:

* **Token before body.** A request to ``/api/`` or ``/metrics`` that carries a body is answered
  401 before a byte of the body is read unless it presents a valid token: an unauthenticated
  client must not make the server buffer anything.
* **Body limit.** ``Content-Length`` above :func:`max_body_bytes` (``SPOTWISE_MAX_BODY_BYTES``,
  default 1 MiB; a task spec is a few KiB) is a 413 at once; a chunked body is counted as it
  arrives and refused with 413 as soon as it passes the limit, so memory stays bounded either way.
* **Browser headers.** Every response gets ``X-Frame-Options: DENY``,
  ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer``; every response except
  FastAPI's interactive docs (which load their own scripts) gets a ``Content-Security-Policy``
  that allows only this origin's stylesheet and no scripts or framing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from fastapi import HTTPException

from spotwise.config import setting, where
from spotwise.errors import InputError, Problem

DEFAULT_MAX_BODY = 1 << 20
CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
HEADERS = [(b"x-frame-options", b"DENY"), (b"x-content-type-options", b"nosniff"),
           (b"referrer-policy", b"no-referrer")]
NO_CSP = ("/docs", "/redoc")
GUARDED = ("/api/", "/metrics")


def max_body_bytes() -> int:
    """The body limit in force: ``SPOTWISE_MAX_BODY_BYTES`` (``service.max_body_bytes``), else 1 MiB.
    A value that is not a whole number >= 1 is an :class:`InputError` naming the setting (``spotwise
    serve`` exits 2 before it listens), never a silent default. Read once, when the app is built:
    a setting changed or broken while the server runs cannot surface inside a request."""
    raw = setting("SPOTWISE_MAX_BODY_BYTES")
    if raw is None or raw.strip() == "":
        return DEFAULT_MAX_BODY
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise InputError(Problem(where("SPOTWISE_MAX_BODY_BYTES"), raw, "a whole number of bytes >= 1"))
    return n


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when a streamed body passes the limit (FastAPI re-raises
    HTTPExceptions from body parsing as they are, so this reaches the client as a 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(status_code=413, detail=f"request body larger than {limit} bytes")


def _token(headers: dict[bytes, bytes]) -> str | None:
    h = headers.get(b"authorization", b"").decode("latin-1")
    if h[:7].lower() == "bearer ":
        return h[7:].strip()
    for part in headers.get(b"cookie", b"").decode("latin-1").split(";"):
        k, _, v = part.strip().partition("=")
        if k == "spotwise_token":
            return v
    return None


async def _answer(send, status: int, detail: str, extra: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *HEADERS, *extra]})
    await send({"type": "http.response.body", "body": body})


class Guard:
    def __init__(self, app, limit: int | None = None) -> None:
        self.app = app
        self.limit = max_body_bytes() if limit is None else limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        headers = dict(scope.get("headers") or [])
        limit = self.limit
        has_body = b"content-length" in headers and headers[b"content-length"] != b"0" \
            or b"transfer-encoding" in headers
        if has_body and path.startswith(GUARDED):
            from anyio import to_thread

            from spotwise.service import auth

            if not await to_thread.run_sync(auth.verify, _token(headers)):
                return await _answer(send, 401, "a valid API token is required: Authorization: Bearer <token>",
                                     [(b"www-authenticate", b"Bearer")])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                return await _answer(send, 400, "Content-Length is not a number")
            if n > limit:
                return await _answer(send, 413, f"request body larger than {limit} bytes")
        seen = 0

        async def counted_receive():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return msg

        csp = not path.startswith(NO_CSP)

        async def with_headers(msg):
            if msg["type"] == "http.response.start":
                msg = dict(msg)
                msg["headers"] = [*msg.get("headers", []), *HEADERS,
                                  *([(b"content-security-policy", CSP.encode())] if csp else [])]
            await send(msg)

        await self.app(scope, counted_receive, with_headers)

"""API tokens: random, shown once, stored as SHA-256 only.

A token is ``sw_`` + 32 random bytes (URL-safe base64). The database keeps ``sha256(token)``, so a
copy of the database does not give access. :func:`verify` hashes what a request presents and looks
the hash up (the lookup is by an indexed unique column; comparing hashes, not secrets).

A server verifies the same few tokens on every request, so a *valid* result is remembered for
``CACHE_SECONDS`` (per process, keyed by the hash). Revoking a token clears this process's cache at
once; another process (a second server on the same database) stops accepting it within
``CACHE_SECONDS``. Invalid tokens are never cached (a token created a moment ago works at once).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time

from sqlalchemy import select

from spotwise.errors import InputError, Problem
from spotwise.engine.state import db

PREFIX = "sw_"
CACHE_SECONDS = 5.0
_valid_until: dict[str, float] = {}
_cache_lock = threading.Lock()


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(name: str = "default") -> str:
    if not name or len(name) > 128:
        raise InputError(Problem("--name", name, "1-128 characters"), source="token")
    token = PREFIX + secrets.token_urlsafe(32)
    with db.session() as s:
        s.add(db.ApiToken(name=name, sha256=digest(token), created_at=time.time(), revoked=False))
        s.commit()
    return token


def verify(token: str | None) -> bool:
    if not token or not token.startswith(PREFIX) or len(token) > 200:
        return False
    h = digest(token)
    key = f"{db.database_url()}|{h}"
    now = time.monotonic()
    if _valid_until.get(key, 0.0) > now:
        return True
    with db.session() as s:
        row = s.scalars(select(db.ApiToken).where(db.ApiToken.sha256 == h)).first()
        ok = row is not None and not row.revoked
    with _cache_lock:
        if ok:
            if len(_valid_until) > 10_000:
                _valid_until.clear()
            _valid_until[key] = now + CACHE_SECONDS
        else:
            _valid_until.pop(key, None)
    return ok


def list_tokens() -> list[dict]:
    with db.session() as s:
        return [{"id": t.id, "name": t.name, "created_at": t.created_at, "revoked": bool(t.revoked),
                 "sha256_prefix": t.sha256[:12]} for t in s.scalars(select(db.ApiToken).order_by(db.ApiToken.id))]


def revoke(token_id: int) -> None:
    with db.session() as s:
        t = s.get(db.ApiToken, token_id)
        if t is None:
            raise InputError(Problem("ID", token_id, "the id of a token shown by `spotwise token list`"), source="token")
        t.revoked = True
        s.commit()
    with _cache_lock:
        _valid_until.clear()

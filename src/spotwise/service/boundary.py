"""The API's trust boundary: who may call it, and what a caller may not make the server do.

- A token (``Authorization: Bearer <token>``, or the dashboard's ``spotwise_token`` cookie) from
  ``spotwise token create``; without a valid one the answer is 401 (:func:`require_token`).
- A NUL character in any query, path or body string is a 422 (:func:`refuse_nul`; PostgreSQL
  cannot store one; it was a 500).
- A token holder may start jobs, but not act as the server user on its disk (:func:`confine_spec`):
  a task's ``file://`` checkpoint storage only under the server's file storage root
  (``SPOTWISE_FILE_STORAGE_ROOT``, default ``$SPOTWISE_HOME/checkpoints``), and a ``local.trace``
  only from the shipped traces or ``$SPOTWISE_HOME/traces``, with one answer for every refused trace
  path (so the API does not tell which files exist).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import HTTPException, Request

from spotwise.errors import InputError, Problem
from spotwise.service import auth


def bearer_token(request: Request) -> str | None:
    h = request.headers.get("authorization", "")
    if h[:7].lower() == "bearer ":
        return h[7:].strip()
    return request.cookies.get("spotwise_token")


def _has_nul(v) -> bool:
    if isinstance(v, str):
        return "\x00" in v
    if isinstance(v, dict):
        return any(_has_nul(k) or _has_nul(x) for k, x in v.items())
    if isinstance(v, list):
        return any(_has_nul(x) for x in v)
    return False


async def refuse_nul(request: Request) -> None:
    """422 for a NUL character anywhere in the query, the path or a JSON body's strings."""
    where = [f"query {k!r}" for k, v in request.query_params.multi_items() if "\x00" in k + v]
    where += [f"path {k!r}" for k, v in request.path_params.items() if _has_nul(v)]
    if not where and request.method in ("POST", "PUT", "PATCH"):
        try:
            body = await request.json()
        except ValueError:
            body = None          # not JSON: the body's own validation answers
        if _has_nul(body):
            where.append("body")
    if where:
        raise InputError(Problem(", ".join(where), "\\u0000", "text without NUL characters"), source="request")


TRACE_DIRS_NOTE = "the shipped traces or $SPOTWISE_HOME/traces"


def confine_spec(spec) -> None:
    """Refuse what an API caller may not make the server do: write ``file://`` checkpoints outside
    the storage root, or read a ``local.trace`` outside the trace directories."""
    from spotwise.paths import home
    from spotwise.policies.traces import builtin_traces_dir
    from spotwise.runtime.storage import BadStorageUri, confine_file_uri
    from spotwise.taskspec import TRACE_ALLOWED, check_trace_file

    probs = []
    uri = spec.training.checkpoint.storage
    try:
        confine_file_uri(uri)
    except BadStorageUri as e:
        probs.append(Problem("task.training.checkpoint.storage", uri, str(e)))
    trace = spec.local.trace
    if trace:
        allowed = f"{TRACE_ALLOWED}, in {TRACE_DIRS_NOTE}"
        real = Path(trace).resolve() if "\x00" not in trace else None
        roots = [builtin_traces_dir().resolve(), (home() / "traces").resolve()]
        if real is None or not any(r in real.parents for r in roots):
            probs.append(Problem("task.local.trace", trace, allowed))
        else:
            try:
                check_trace_file(str(real), field="task.local.trace")
            except InputError:
                probs.append(Problem("task.local.trace", trace, allowed))
    if probs:
        raise InputError(probs, source="task")


def require_token(request: Request) -> None:
    if not auth.verify(bearer_token(request)):
        raise HTTPException(status_code=401, detail="a valid API token is required: Authorization: Bearer <token> "
                                                    "(create one with `spotwise token create`)",
                            headers={"WWW-Authenticate": "Bearer"})

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
- User code (a task's own ``training.entrypoint``, ``training.train_func``, ``workdir``, ``pip``
  or ``env``: each runs what it likes on the cluster, with the run's storage credentials) only
  when the server enables it (:func:`serves_user_code`: ``SPOTWISE_SERVE_USER_CODE=1``), else 403
  naming the fields. Even then a ``workdir`` only as the storage URI of a zip and ``pip`` only as a
  list: a path (a directory, a requirements file) would be read from the server's disk (422).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import HTTPException, Request

from spotwise.config import setting
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
USER_CODE_ENV = "SPOTWISE_SERVE_USER_CODE"


def serves_user_code() -> bool:
    """Whether this server runs tasks with code of their own: ``SPOTWISE_SERVE_USER_CODE=1`` (or
    ``true``/``yes``) in its environment, read per request. Off by default: every token holder
    could otherwise run anything on the cluster the server pays for."""
    return (setting(USER_CODE_ENV) or "").strip().lower() in ("1", "true", "yes")


def user_code_fields(spec) -> list[str]:
    """The fields of ``spec`` that bring code of the user's (only those the task set)."""
    from spotwise.runtime.config import BUILTIN_ENTRYPOINTS

    given = {"task.training.entrypoint": spec.training.entrypoint not in BUILTIN_ENTRYPOINTS,
             "task.training.train_func": spec.training.train_func is not None,
             "task.workdir": spec.workdir is not None, "task.pip": spec.pip is not None, "task.env": bool(spec.env)}
    return [f for f, set_ in given.items() if set_]


def _confine_code(spec) -> list[Problem]:
    """What user code may not name even when served: a path on the server's disk."""
    from spotwise.taskcode import WORKDIR_URI_ALLOWED, WORKDIR_URI_RE

    probs = []
    if spec.workdir is not None and not WORKDIR_URI_RE.match(spec.workdir):
        probs.append(Problem("task.workdir", spec.workdir, "through the API, the storage URI of a zip of your code "
                             "(s3://bucket/path/code.zip; gs:// and https:// too): a directory would be read from "
                             f"the server's disk (the task file's {WORKDIR_URI_ALLOWED.split(',')[0]} is for "
                             "`spotwise launch`)"))
    if isinstance(spec.pip, str):
        probs.append(Problem("task.pip", spec.pip, "through the API, a list of requirements: a requirements file "
                                                   "would be read from the server's disk"))
    return probs


def confine_spec(spec) -> None:
    """Refuse what an API caller may not make the server do: write ``file://`` checkpoints or read a
    ``file://`` token file (``training.data``) outside the storage root, or read a ``local.trace`` or ``spot_history`` outside the trace directories."""
    from spotwise.runtime.storage.base import BadStorageUri, confine_file_uri
    from spotwise.taskspec import HISTORY_ALLOWED, TRACE_ALLOWED, check_trace_file, load_history

    code = user_code_fields(spec)
    if code and not serves_user_code():
        raise HTTPException(status_code=403, detail=f"{', '.join(code)}: this server does not run user code "
                                                    f"(its operator enables it with {USER_CODE_ENV}=1); use the "
                                                    "built-in entrypoint tiny-gpt or llama, or `spotwise launch`")
    probs = _confine_code(spec) if code else []
    stores = spec.training.checkpoint.storage      # one URI, or each cloud's
    for name, uri in (stores.items() if isinstance(stores, dict) else [("", stores)]):
        try:
            confine_file_uri(uri)
        except BadStorageUri as e:
            probs.append(Problem("task.training.checkpoint.storage" + (f".{name}" if name else ""), uri, str(e)))
    data = spec.training.data
    if data is not None:        # a file:// token file is read with the server's rights: the same root
        try:
            confine_file_uri(data.uri)
        except BadStorageUri as e:
            probs.append(Problem("task.training.data.uri", data.uri, str(e)))
    for name, path, allowed, check in (("task.local.trace", spec.local.trace, TRACE_ALLOWED, check_trace_file),
                                       ("task.spot_history", spec.spot_history, HISTORY_ALLOWED, load_history)):
        if path:
            probs.extend(_confine_trace(name, path, allowed, check))
    if probs:
        raise InputError(probs, source="task")


def _confine_trace(name: str, path: str, allowed: str, check) -> list[Problem]:
    """No problem when ``path`` is a trace ``check`` accepts inside the trace directories; else one,
    the same whether the file is outside them, missing, a directory or not a trace."""
    from spotwise.paths import home
    from spotwise.policies.traces import builtin_traces_dir

    refused = [Problem(name, path, f"{allowed}, in {TRACE_DIRS_NOTE}")]
    real = Path(path).resolve() if "\x00" not in path else None
    roots = [builtin_traces_dir().resolve(), (home() / "traces").resolve()]
    if real is None or not any(r in real.parents for r in roots):
        return refused
    try:
        check(str(real), field=name)
    except InputError:
        return refused
    return []


def require_token(request: Request) -> None:
    if not auth.verify(bearer_token(request)):
        raise HTTPException(status_code=401, detail="a valid API token is required: Authorization: Bearer <token> "
                                                    "(create one with `spotwise token create`)",
                            headers={"WWW-Authenticate": "Bearer"})

"""A node's cache of token files: each is fetched once per node, verified, and memory-mapped from there.

Why a cache at all, even for ``file://``: training memory-maps the token file and reads windows of
it at every step for hours; a file read from object storage must be local for that, and a local
one read in place could be rewritten under the run (a new ``spotwise data tokenize`` to the same
path), which would change the batches of a resumed run. The cached copy is verified once and
never changes.

Layout: ``$SPOTWISE_HOME/cache/data/<sha256>/<name>`` with the ``meta.json`` beside it, keyed by the
sha256 that the source's ``meta.json`` declares: a file tokenized again (a new sha256) is fetched
again, an unchanged one never is.

Protocol (:func:`fetch`), safe for any number of processes of one node asking at once (the ranks
of a node, or two runs): read the source's ``meta.json`` (small); if the cached file is there, use
it; else take an exclusive ``flock`` on ``<sha256>.lock``, look again (another process may have
finished meanwhile), download to a temporary name, check its size and sha256 against the meta,
write the meta, and ``rename`` the file into place. A name in the cache therefore always holds a
verified file; a download that dies half-way leaves only a temporary file, removed by the next
attempt. A download whose sha256 differs (a corrupt transfer, or a token file replaced without its
meta) is refused with an :class:`~spotwise.errors.InputError` and nothing is cached.

Entries are never evicted: ``rm -r $SPOTWISE_HOME/cache/data`` frees the space (nothing else
keeps state there).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from spotwise.errors import InputError, Problem
from spotwise.runtime.storage.base import Storage, open_storage
from spotwise.runtime.data.tokens import META_NAME, check_token_meta, file_sha256

log = logging.getLogger("spotwise.data")
FIELD = "training.data.uri"


def cache_root() -> Path:
    """``$SPOTWISE_HOME/cache/data``: where this node keeps the token files it fetched."""
    from spotwise.paths import home

    return home() / "cache" / "data"


def split_uri(uri: str) -> tuple[str, str]:
    """``(URI of the token file's directory, the file's name)``; the meta is ``META_NAME`` there."""
    parent, _, name = uri.rstrip("/").rpartition("/")
    return parent, name


def read_meta(uri: str, store: Storage | None = None, *, field: str = FIELD) -> dict:
    """The ``meta.json`` beside the token file at ``uri``, parsed; an :class:`InputError` naming
    ``field`` when it is missing or not JSON (any other storage failure propagates)."""
    parent, _ = split_uri(uri)
    store = store or open_storage(parent)
    raw = store.get_bytes(META_NAME)
    if raw is None:
        raise InputError(Problem(field, uri, f"a token file with its {META_NAME} beside it ({parent}/{META_NAME} "
                                             "is missing; `spotwise data tokenize` writes both)"), source="data")
    try:
        meta = json.loads(raw)
    except ValueError:
        raise InputError(Problem(field, uri, f"a token file whose {META_NAME} is JSON (it is not: written by "
                                             "something other than `spotwise data tokenize`?)"), source="data") from None
    if not isinstance(meta, dict):
        raise InputError(Problem(field, uri, f"a token file whose {META_NAME} is a JSON object"), source="data")
    return meta


@dataclass(frozen=True)
class Fetched:
    """Where the verified copy is, its meta, and whether this call downloaded it."""

    path: Path
    meta: dict
    downloaded: bool


def _meta_problems(uri: str, meta: dict) -> list[Problem]:
    probs = [Problem(FIELD, uri, f"a token file whose {META_NAME} is valid: {p}") for p in check_token_meta(meta)]
    _, name = split_uri(uri)
    if meta.get("tokens_file") not in (None, name):
        probs.append(Problem(FIELD, uri, f"the token file its {META_NAME} describes ({meta.get('tokens_file')!r}), "
                                         f"not {name!r}"))
    return probs


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def pin_problem(uri: str, meta: dict, sha256: str | None) -> Problem | None:
    """The problem when the meta's sha256 is not the pinned ``sha256`` (None: no pin, or it matches)."""
    if sha256 is None or meta.get("sha256") == sha256:
        return None
    return Problem("training.data.sha256", sha256,
                   f"the sha256 of the token file at {uri}, whose {META_NAME} now says {meta.get('sha256')}: the "
                   "file changed since the run was launched (a resumed run trains on the data it started "
                   "with; launch a new run for the new file)")


def fetch(uri: str, *, sha256: str | None = None, root: Path | None = None, store: Storage | None = None,
          on_wait: Callable[[], None] | None = None) -> Fetched:
    """The verified local copy of the token file at ``uri`` (see the module's protocol).

    ``root`` defaults to :func:`cache_root`; ``store`` to the storage of the file's directory;
    ``on_wait`` is called when another process holds the download lock (a test's hook; the wait
    is logged either way). Raises :class:`InputError` (field ``training.data.uri``) for a missing
    or invalid meta, a missing token file or one whose size or sha256 is not the meta's, and
    (field ``training.data.sha256``) when ``sha256`` is given and the meta declares another."""
    parent, name = split_uri(uri)
    store = store or open_storage(parent)
    meta = read_meta(uri, store)
    probs = _meta_problems(uri, meta)
    pinned = pin_problem(uri, meta, sha256)
    if pinned is not None:
        probs.append(pinned)
    if probs:
        raise InputError(probs, source="data")
    sha, size = meta["sha256"], meta["size_bytes"]
    entry = (root or cache_root()) / sha
    final = entry / name
    if final.is_file() and final.stat().st_size == size:
        return Fetched(final, meta, downloaded=False)
    entry.mkdir(parents=True, exist_ok=True)
    with open(entry.parent / f"{sha}.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process's download of %s", uri)
            if on_wait is not None:
                on_wait()
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if final.is_file() and final.stat().st_size == size:
                return Fetched(final, meta, downloaded=False)
            return Fetched(_download(uri, store, meta, entry, name), meta, downloaded=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _download(uri: str, store: Storage, meta: dict, entry: Path, name: str) -> Path:
    """Download under the lock: temporary name, size and sha256 checked, meta written, then renamed."""
    for stale in entry.glob(f".{name}.part*"):        # a download that died half-way
        stale.unlink(missing_ok=True)
    tmp = entry / f".{name}.part{os.getpid()}"
    if not store.has(name):
        raise InputError(Problem(FIELD, uri, f"an existing token file (its {META_NAME} is there, the file is not)"),
                         source="data")
    log.info("fetching %s (%d bytes) into %s", uri, meta["size_bytes"], entry)
    try:
        store.get_file(name, tmp)
        got_size, got_sha = tmp.stat().st_size, file_sha256(tmp)
        if got_size != meta["size_bytes"] or got_sha != meta["sha256"]:
            raise InputError(Problem(FIELD, uri, f"a token file matching its {META_NAME}: fetched {got_size} bytes "
                                                 f"with sha256 {got_sha}, the meta says {meta['size_bytes']} bytes "
                                                 f"with sha256 {meta['sha256']} (a corrupt transfer, or the file "
                                                 "was replaced without its meta)"), source="data")
        _atomic_write(entry / META_NAME, (json.dumps(meta, indent=2) + "\n").encode())
        final = entry / name
        os.replace(tmp, final)
        return final
    finally:
        tmp.unlink(missing_ok=True)

"""A node's cache of ``init_from`` weight directories: fetched once per node, like token files.

The same protocol as :mod:`spotwise.runtime.data.cache` (a lock per entry, downloads to a
temporary name renamed into place, so a name in the cache always holds a whole file), for a
directory in the Hugging Face layout: ``config.json``, then ``model.safetensors.index.json`` and
the shards it names, or the single ``model.safetensors``.

Layout: ``$SPOTWISE_HOME/cache/models/<key>/``, ``key`` the sha256 of the source's
``config.json`` and index (or, for a single file, of the config and the file's size): a directory
whose files change gets a new entry. Each downloaded file's sha256 is computed and written to
``sha256.json`` in the entry, and a file is accepted only when its size is the size the source
lists; the ranks of a node share one download.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
from pathlib import Path

from spotwise.errors import InputError, Problem
from spotwise.runtime.weights.config import CONFIG_NAME, FIELD, INDEX_NAME, SINGLE_NAME
from spotwise.runtime.storage.base import Storage, open_storage

log = logging.getLogger("spotwise.data")
MANIFEST = "sha256.json"


def models_root() -> Path:
    from spotwise.paths import home

    return home() / "cache" / "models"


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            sha.update(block)
    return sha.hexdigest()


def _listing(uri: str, store: Storage) -> tuple[str, list[str]]:
    """``(entry key, the files to fetch)`` of the directory at ``uri``."""
    config = store.get_bytes(CONFIG_NAME)
    if config is None:
        raise InputError(Problem(FIELD, uri, f"a directory in the Hugging Face Llama layout ({CONFIG_NAME} is "
                                             "missing)"), source="init_from")
    index = store.get_bytes(INDEX_NAME)
    key = hashlib.sha256(config)
    if index is not None:
        try:
            shards = sorted(set(json.loads(index)["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise InputError(Problem(FIELD, uri, f"an {INDEX_NAME} with a weight_map"), source="init_from") from None
        key.update(index)
        return key.hexdigest(), [CONFIG_NAME, INDEX_NAME, *shards]
    if not store.has(SINGLE_NAME):
        raise InputError(Problem(FIELD, uri, f"a directory with {INDEX_NAME} and its shards or {SINGLE_NAME} "
                                             "(neither is there)"), source="init_from")
    key.update(str(store.list(SINGLE_NAME)).encode())
    return key.hexdigest(), [CONFIG_NAME, SINGLE_NAME]


def fetch_model(uri: str, *, root: Path | None = None, store: Storage | None = None) -> Path:
    """The local copy of the HF directory at ``uri`` (see the module docstring); an
    :class:`InputError` naming ``training.init_from`` when a file is missing."""
    store = store or open_storage(uri.rstrip("/"))
    key, files = _listing(uri, store)
    entry = (root or models_root()) / key
    if (entry / MANIFEST).is_file():
        return entry
    entry.mkdir(parents=True, exist_ok=True)
    with open(entry.parent / f"{key}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (entry / MANIFEST).is_file():        # another rank of this node fetched it meanwhile
                return entry
            sums = {}
            for name in files:
                final = entry / name
                if not final.is_file():
                    if not store.has(name):
                        raise InputError(Problem(FIELD, uri, f"a complete directory ({name} is missing)"),
                                         source="init_from")
                    tmp = entry / f".{name}.part{os.getpid()}"
                    log.info("fetching %s/%s into %s", uri.rstrip("/"), name, entry)
                    try:
                        store.get_file(name, tmp)
                        os.replace(tmp, final)
                    finally:
                        tmp.unlink(missing_ok=True)
                sums[name] = _sha256(final)
            tmp = entry / f".{MANIFEST}.tmp{os.getpid()}"
            tmp.write_text(json.dumps(sums, indent=2) + "\n")
            os.replace(tmp, entry / MANIFEST)
            return entry
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

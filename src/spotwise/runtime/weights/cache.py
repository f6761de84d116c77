"""A node's cache of ``init_from`` weight directories: fetched once per node, like token files.

The same protocol as :mod:`spotwise.runtime.data.cache` (a lock per entry, downloads to a
temporary name renamed into place, so a name in the cache always holds a whole file), for a
directory in the Hugging Face layout: ``config.json``, then ``model.safetensors.index.json`` and
the shards it names, or the single ``model.safetensors``.

Layout: ``$SPOTWISE_HOME/cache/models/<key>/``, ``key`` the sha256 of the source's
``config.json``, index (or, for a single file, the file's size) and ``sha256.json``: a directory
whose files change gets a new entry. The ranks of a node share one download.

Checked downloads: a source directory with a ``sha256.json`` (``{file name: sha256 hex}``, what
``spotwise export`` writes beside its files, or ``sha256sum`` output turned into JSON by the user)
has every downloaded file checked against it; a file it does not list, or whose sha256 differs (a
corrupt transfer, a shard replaced without its sums), is refused with an :class:`InputError`
naming ``training.init_from`` and the file, and nothing is cached. Without one (a directory as
``huggingface-cli download`` leaves it), each file's sha256 is still computed and recorded. Either
way the entry's own ``spotwise-manifest.json`` lists every file it holds, written last: an entry is used only
when that manifest is there and every file it lists is present with the size it had.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
from pathlib import Path

from spotwise.errors import InputError, Problem
from spotwise.runtime.weights.config import CONFIG_NAME, FIELD, INDEX_NAME, SINGLE_NAME, SUMS_NAME
from spotwise.runtime.storage.base import Storage, open_storage
from spotwise.runtime.data.tokens import file_sha256

log = logging.getLogger("spotwise.data")
MANIFEST = "spotwise-manifest.json"   # {file: {sha256, bytes}}: the entry is whole


def models_root() -> Path:
    from spotwise.paths import home

    return home() / "cache" / "models"


def _declared(uri: str, store: Storage) -> tuple[bytes, dict[str, str] | None]:
    """The source's ``sha256.json`` (raw, parsed), or ``(b"", None)`` when it has none."""
    raw = store.get_bytes(SUMS_NAME)
    if raw is None:
        return b"", None
    try:
        sums = json.loads(raw)
        ok = isinstance(sums, dict) and all(
            isinstance(k, str) and isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)
            for k, v in sums.items())
    except ValueError:
        ok = False
    if not ok:
        raise InputError(Problem(FIELD, uri, f"a {SUMS_NAME} that maps each file name to its sha256 (64 lowercase "
                                             "hex digits)"), source="init_from")
    return raw, sums


def _listing(uri: str, store: Storage) -> tuple[str, list[str], dict[str, str] | None]:
    """``(entry key, the files to fetch, the sums its sha256.json declares or None)`` of the
    directory at ``uri``."""
    config = store.get_bytes(CONFIG_NAME)
    if config is None:
        raise InputError(Problem(FIELD, uri, f"a directory in the Hugging Face Llama layout ({CONFIG_NAME} is "
                                             "missing)"), source="init_from")
    index = store.get_bytes(INDEX_NAME)
    key = hashlib.sha256(config)
    raw_sums, declared = _declared(uri, store)
    key.update(raw_sums)
    if index is not None:
        try:
            shards = sorted(set(json.loads(index)["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise InputError(Problem(FIELD, uri, f"an {INDEX_NAME} with a weight_map"), source="init_from") from None
        key.update(index)
        return key.hexdigest(), [CONFIG_NAME, INDEX_NAME, *shards], declared
    if not store.has(SINGLE_NAME):
        raise InputError(Problem(FIELD, uri, f"a directory with {INDEX_NAME} and its shards or {SINGLE_NAME} "
                                             "(neither is there)"), source="init_from")
    key.update(str(store.list(SINGLE_NAME)).encode())
    return key.hexdigest(), [CONFIG_NAME, SINGLE_NAME], declared


def _usable(entry: Path) -> bool:
    """Whether ``entry`` holds a whole download: its manifest, and every file it lists at its size."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return all((entry / name).is_file() and (entry / name).stat().st_size == info.get("bytes")
               for name, info in manifest.items() if isinstance(info, dict))


def fetch_model(uri: str, *, root: Path | None = None, store: Storage | None = None) -> Path:
    """The local copy of the HF directory at ``uri`` (see the module docstring); an
    :class:`InputError` naming ``training.init_from`` when a file is missing or its sha256 is not
    the one the source's ``sha256.json`` declares."""
    store = store or open_storage(uri.rstrip("/"))
    key, files, declared = _listing(uri, store)
    entry = (root or models_root()) / key
    if _usable(entry):
        return entry
    entry.mkdir(parents=True, exist_ok=True)
    with open(entry.parent / f"{key}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if _usable(entry):        # another rank of this node fetched it meanwhile
                return entry
            (entry / MANIFEST).unlink(missing_ok=True)
            manifest = {}
            for name in files:
                final = entry / name
                if declared is not None and name not in declared:
                    raise InputError(Problem(FIELD, uri, f"a {SUMS_NAME} that lists every file ({name} is not in "
                                                         "it)"), source="init_from")
                if not final.is_file():
                    if not store.has(name):
                        raise InputError(Problem(FIELD, uri, f"a complete directory ({name} is missing)"),
                                         source="init_from")
                    tmp = entry / f".{name}.part{os.getpid()}"
                    log.info("fetching %s/%s into %s", uri.rstrip("/"), name, entry)
                    try:
                        store.get_file(name, tmp)
                        sha = _checked(uri, name, tmp, declared)
                        os.replace(tmp, final)
                    finally:
                        tmp.unlink(missing_ok=True)
                else:                                   # left by a download that died at a later file
                    sha = _checked(uri, name, final, declared)
                manifest[name] = {"sha256": sha, "bytes": final.stat().st_size}
            tmp = entry / f".{MANIFEST}.tmp{os.getpid()}"
            tmp.write_text(json.dumps(manifest, indent=2) + "\n")
            os.replace(tmp, entry / MANIFEST)
            return entry
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _checked(uri: str, name: str, path: Path, declared: dict[str, str] | None) -> str:
    """``path``'s sha256; refused (the file removed) when ``declared`` gives ``name`` another."""
    got = file_sha256(path)
    if declared is not None and got != declared[name]:
        path.unlink(missing_ok=True)
        raise InputError(Problem(FIELD, uri, f"files whose sha256 is the one {SUMS_NAME} declares ({name}: "
                                             f"{got}, declared {declared[name]}; a corrupt download or a file "
                                             "replaced without its sums)"), source="init_from")
    return got

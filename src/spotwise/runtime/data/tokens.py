"""Token files: a flat array of token ids on disk and the ``meta.json`` beside it.

What ``spotwise data tokenize`` writes and what training will read. The format is deliberately
plain so that any program can use it without spotwise:

* ``tokens.bin`` (any name): the token ids of every document, one after another, little-endian
  ``uint16`` when the vocabulary fits (<= 65,536 ids), else ``uint32``. No header, so
  ``numpy.memmap(path, dtype)`` reads it; optional end-of-document ids stand *between* documents.
* ``meta.json`` in the same directory: the dtype, vocabulary size, token count, byte size and sha256
  of the token file, the tokenizer, the inputs and the date (:func:`write_meta` lists the fields).

Why a sha256 and a size: a token file is made once and read by every rank of every run, often from
object storage; a truncated upload or a file from another tokenizer would otherwise train silently
on garbage. The size check is free (:meth:`TokenFile.open`), the sha256 costs a full read, so it
runs only on request (``verify=True``, :meth:`TokenFile.verify`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spotwise.errors import InputError, Problem

FORMAT = "spotwise-tokens"
VERSION = 1
META_NAME = "meta.json"
DTYPES: dict[str, np.dtype[Any]] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def dtype_for_vocab(vocab_size: int) -> str:
    """``"uint16"`` when every id of a ``vocab_size`` vocabulary fits in 16 bits, else ``"uint32"``."""
    if vocab_size <= 0 or vocab_size > 2**32:
        raise ValueError(f"vocab_size {vocab_size}: allowed 1..{2**32}")
    return "uint16" if vocab_size <= 2**16 else "uint32"


def meta_path(tokens_path: Path) -> Path:
    """Where the meta of a token file lives: ``meta.json`` in the same directory."""
    return Path(tokens_path).with_name(META_NAME)


class TokenWriter:
    """Appends token ids to a file in chunks, hashing as it goes; never holds the corpus.

    ``write`` takes any integer array; ids outside ``0..vocab_size-1`` are a bug of the tokenizer
    (``ValueError``), not silently wrapped into the narrower dtype."""

    def __init__(self, path: Path, vocab_size: int) -> None:
        self.path = Path(path)
        self.vocab_size = vocab_size
        self.dtype_name = dtype_for_vocab(vocab_size)
        self._dtype = DTYPES[self.dtype_name]
        self._sha = hashlib.sha256()
        self.count = 0
        self._f = open(self.path, "wb")

    def write(self, ids: Any) -> None:
        arr = np.asarray(ids)
        if arr.size == 0:
            return
        if int(arr.min()) < 0 or int(arr.max()) >= self.vocab_size:
            raise ValueError(f"token id out of range 0..{self.vocab_size - 1}: {int(arr.min())}..{int(arr.max())}")
        data = arr.astype(self._dtype, copy=False).tobytes()
        self._f.write(data)
        self._sha.update(data)
        self.count += int(arr.size)

    def close(self) -> dict:
        """Close the file; its ``dtype``, ``token_count``, ``size_bytes`` and ``sha256``."""
        self._f.close()
        return {"dtype": self.dtype_name, "token_count": self.count,
                "size_bytes": self.count * self._dtype.itemsize, "sha256": self._sha.hexdigest()}

    def abort(self) -> None:
        """Close and delete the partial file (bad input found half-way)."""
        self._f.close()
        self.path.unlink(missing_ok=True)


def write_meta(path: Path, *, tokens_file: str, vocab_size: int, written: dict, tokenizer: dict,
               eod_id: int | None, inputs: list[dict], documents: int, created_at: str) -> dict:
    """Write ``meta.json`` at ``path`` and return it. Fields: ``format``/``version``; ``tokens_file``
    (the token file's name, so a meta beside the wrong file is caught); ``dtype``, ``byteorder``,
    ``vocab_size``, ``token_count``, ``size_bytes``, ``sha256`` (of the token file); ``tokenizer``
    (``{"kind": "bytes"}`` or ``{"kind": "tokenizer.json", "name", "path", "sha256"}``); ``eod_id``
    (the end-of-document id between documents, or null); ``documents``; ``inputs`` (name, format,
    size_bytes, documents, tokens each); ``created_at`` (UTC, ISO 8601)."""
    from spotwise import __version__

    meta = {"format": FORMAT, "version": VERSION, "tokens_file": tokens_file, "dtype": written["dtype"],
            "byteorder": "little", "vocab_size": vocab_size, "token_count": written["token_count"],
            "size_bytes": written["size_bytes"], "sha256": written["sha256"], "tokenizer": tokenizer,
            "eod_id": eod_id, "documents": documents, "inputs": inputs, "created_at": created_at,
            "spotwise_version": __version__}
    Path(path).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def check_token_meta(meta: Any, vocab_size: int | None = None, *, file_size: int | None = None) -> list[str]:
    """The problems of a token file's meta, as sentences (empty: fine). For pre-launch checks.

    Checked: the fields are there with the right types; the dtype is one spotwise writes and holds
    every id of the vocabulary; ``size_bytes`` is ``token_count`` times the dtype's width and, when
    ``file_size`` is given, the file's real size; and, when ``vocab_size`` (the model's) is given,
    that the model's embedding has a row for every id the tokens may hold. A model vocabulary
    *larger* than the tokens' is fine (vocabularies are often padded to a multiple of 64)."""
    if not isinstance(meta, dict):
        return [f"meta is not a JSON object (got {type(meta).__name__})"]
    probs: list[str] = []
    if meta.get("format") != FORMAT:
        probs.append(f"format: got {meta.get('format')!r}; allowed: {FORMAT!r}")
    ints = {}
    for k in ("vocab_size", "token_count", "size_bytes"):
        v = meta.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            probs.append(f"{k}: got {v!r}; allowed: a whole number >= 0")
        else:
            ints[k] = v
    dtype = meta.get("dtype")
    if dtype not in DTYPES:
        probs.append(f"dtype: got {dtype!r}; allowed: {', '.join(DTYPES)}")
    elif "vocab_size" in ints and ints["vocab_size"] > np.iinfo(DTYPES[dtype]).max + 1:
        probs.append(f"dtype: {dtype} cannot hold the ids of a {ints['vocab_size']}-token vocabulary")
    if meta.get("byteorder", "little") != "little":
        probs.append(f"byteorder: got {meta.get('byteorder')!r}; allowed: 'little'")
    if dtype in DTYPES and "token_count" in ints and "size_bytes" in ints:
        want = ints["token_count"] * DTYPES[dtype].itemsize
        if ints["size_bytes"] != want:
            probs.append(f"size_bytes: {ints['size_bytes']} but {ints['token_count']} {dtype} tokens take {want}")
    if file_size is not None and "size_bytes" in ints and file_size != ints["size_bytes"]:
        probs.append(f"size: the token file has {file_size} bytes but meta says {ints['size_bytes']} "
                     "(truncated or replaced?)")
    if vocab_size is not None and "vocab_size" in ints and ints["vocab_size"] > vocab_size:
        probs.append(f"vocab_size: the tokens use ids up to {ints['vocab_size'] - 1} but the model's vocabulary "
                     f"has {vocab_size} (tokenized with another tokenizer?)")
    sha = meta.get("sha256")
    if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        probs.append(f"sha256: got {sha!r}; allowed: 64 lowercase hex digits")
    return probs


@dataclass(frozen=True)
class TokenFile:
    """An opened token file: its ``meta`` and its ``tokens`` as a read-only numpy memmap (nothing is
    read until used, so a 100 GB file opens at once and each rank pages in only its windows)."""

    path: Path
    meta: dict
    tokens: np.ndarray

    @classmethod
    def open(cls, path: str | Path, *, vocab_size: int | None = None, verify: bool = False) -> "TokenFile":
        """Open ``path`` with the ``meta.json`` beside it. Raises :class:`~spotwise.errors.InputError`
        (field: the path) when the meta is missing or unreadable, names another file, or fails
        :func:`check_token_meta` (with ``vocab_size`` and the real file size); ``verify`` also
        compares the sha256 (reads the whole file)."""
        path = Path(path)
        mp = meta_path(path)
        try:
            meta = json.loads(mp.read_text())
        except FileNotFoundError:
            raise InputError(Problem(str(mp), "missing", f"the {META_NAME} that `spotwise data tokenize` "
                                                         "writes beside the token file"), source="token file") from None
        except (OSError, ValueError) as e:
            raise InputError(Problem(str(mp), type(e).__name__, "a readable JSON file"), source="token file") from None
        if not path.is_file():
            raise InputError(Problem(str(path), "missing", "an existing token file"), source="token file")
        probs = check_token_meta(meta, vocab_size, file_size=path.stat().st_size)
        if isinstance(meta, dict) and meta.get("tokens_file") not in (None, path.name):
            probs.append(f"tokens_file: meta describes {meta.get('tokens_file')!r}, not {path.name!r}")
        if probs:
            raise InputError([Problem(str(path), p, "a token file that matches its meta.json") for p in probs],
                             source="token file")
        count = meta["token_count"]
        tokens = (np.memmap(path, dtype=DTYPES[meta["dtype"]], mode="r", shape=(count,)) if count
                  else np.zeros(0, dtype=DTYPES[meta["dtype"]]))
        tf = cls(path=path, meta=meta, tokens=tokens)
        if verify:
            tf.verify()
        return tf

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def eod_id(self) -> int | None:
        return self.meta.get("eod_id")

    def __len__(self) -> int:
        return int(self.meta["token_count"])

    def verify(self) -> None:
        """Compare the file's sha256 with the meta's (reads it all, in 8 MiB blocks); InputError if not."""
        got = file_sha256(self.path)
        if got != self.meta["sha256"]:
            raise InputError(Problem(str(self.path), f"sha256 {got}",
                                     f"the meta's sha256 {self.meta['sha256']} (changed since it was written?)"),
                             source="token file")


def file_sha256(path: Path) -> str:
    """The sha256 (hex) of the file at ``path``, read in 8 MiB blocks: the one way a token file, a
    cached download or an exported weight file is hashed."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            sha.update(block)
    return sha.hexdigest()

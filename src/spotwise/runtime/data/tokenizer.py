"""Tokenizers for ``spotwise data tokenize``: bytes (built in) or a ``tokenizer.json`` file.

* ``bytes``: each UTF-8 byte is its id (vocabulary 256); with an end-of-document token the id 256
  is added (vocabulary 257). What the built-in byte-level GPT trains on, and needs no file.
* a ``tokenizer.json`` (the Hugging Face ``tokenizers`` format) through the ``tokenizers`` library
  (the ``spotwise[data]`` extra). Only a local file is read: nothing is fetched from a model hub,
  so a tokenization is reproducible from the file whose sha256 the meta records.

Both give ids as numpy arrays and encode a batch at a time (``tokenizers`` spreads a batch over
the cores). A missing or malformed file is an :class:`~spotwise.errors.InputError` naming
``--tokenizer``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from spotwise.errors import InputError, Problem

TOKENIZER_FLAG = "--tokenizer"
ALLOWED = "bytes, or the path of a tokenizer.json file (Hugging Face tokenizers format)"


class Tokenizer(Protocol):
    vocab_size: int
    eod_id: int | None
    # written before / after each document: the special tokens the tokenizer's own post-processor
    # puts around a sequence (Llama 3's tokenizer.json: <|begin_of_text|> before, nothing after)
    doc_prefix: tuple[int, ...]
    doc_suffix: tuple[int, ...]

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]: ...
    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...
    def describe(self) -> dict: ...


class BytesTokenizer:
    """UTF-8 bytes as ids; ``eod``: id 256 stands between documents (vocabulary 257)."""

    doc_prefix: tuple[int, ...] = ()
    doc_suffix: tuple[int, ...] = ()

    def __init__(self, *, eod: bool = False) -> None:
        self.eod_id: int | None = 256 if eod else None
        self.vocab_size = 257 if eod else 256

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of ``ids``; end-of-document ids are dropped."""
        arr = np.asarray(ids)
        if self.eod_id is not None:
            arr = arr[arr != self.eod_id]
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def describe(self) -> dict:
        return {"kind": "bytes"}


class JsonTokenizer:
    """A ``tokenizer.json`` through the ``tokenizers`` library. The special tokens its post-processor
    adds around a sequence (BOS/EOS as the tokenizer defines them: Llama 3's adds
    ``<|begin_of_text|>``) go once around each *document* (:attr:`doc_prefix`, :attr:`doc_suffix`,
    found by encoding a probe text with and without them), never around each piece of a long one;
    ``eod_token`` names the vocabulary entry written between documents."""

    def __init__(self, path: Path, *, eod_token: str | None = None) -> None:
        from spotwise.extras import require

        tokenizers = require("tokenizers", "data", "--tokenizer PATH/tokenizer.json")
        self.path = Path(path)
        if not self.path.is_file():
            raise InputError(Problem(TOKENIZER_FLAG, str(path), f"{ALLOWED} (no such file)"), source="data tokenize")
        raw = self.path.read_bytes()
        self.sha256 = hashlib.sha256(raw).hexdigest()
        try:
            self._tok = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as e:  # noqa: BLE001 - the library raises plain Exception for any malformed file
            first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            raise InputError(Problem(TOKENIZER_FLAG, str(path), f"{ALLOWED} (this one does not load: {first})"),
                             source="data tokenize") from None
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.doc_prefix, self.doc_suffix = self._specials()
        self.eod_id = None
        if eod_token is not None:
            tid = self._tok.token_to_id(eod_token)
            if tid is None:
                raise InputError(Problem("--eod-token", eod_token, f"a token of {self.path.name}'s vocabulary "
                                         "(e.g. <|endoftext|> or </s>)"), source="data tokenize")
            self.eod_id = int(tid)

    def _specials(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ids the post-processor puts before and after a sequence."""
        plain = list(self._tok.encode("a", add_special_tokens=False).ids)
        full = list(self._tok.encode("a", add_special_tokens=True).ids)
        for i in range(len(full) - len(plain) + 1):
            if full[i:i + len(plain)] == plain:
                return tuple(full[:i]), tuple(full[i + len(plain):])
        return (), ()

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encs = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encs]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return str(self._tok.decode([int(i) for i in np.asarray(ids)], skip_special_tokens=False))

    def describe(self) -> dict:
        out: dict[str, object] = {"kind": "tokenizer.json", "name": self.path.name, "path": str(self.path),
                                  "sha256": self.sha256}
        if self.doc_prefix or self.doc_suffix:
            out.update(doc_prefix=list(self.doc_prefix), doc_suffix=list(self.doc_suffix))
        return out


def load_tokenizer(spec: str, *, eod: bool = False, eod_token: str | None = None) -> Tokenizer:
    """``bytes`` or a path to a ``tokenizer.json``; ``eod``/``eod_token`` as the two classes take them.

    ``eod_token`` is for a ``tokenizer.json`` only (bytes has its own id 256), and anything that
    is neither ``bytes`` nor an existing file is refused naming ``--tokenizer``."""
    if spec == "bytes":
        if eod_token is not None:
            raise InputError(Problem("--eod-token", eod_token, "only with --tokenizer PATH/tokenizer.json "
                                     "(the bytes tokenizer's end-of-document id is 256: use --eod)"),
                             source="data tokenize")
        return BytesTokenizer(eod=eod)
    if eod and eod_token is None:
        raise InputError(Problem("--eod", True, "with a tokenizer.json, name its end-of-document token: "
                                 "--eod-token TOKEN"), source="data tokenize")
    if "://" in spec:
        return JsonTokenizer(_fetch_tokenizer(spec), eod_token=eod_token)
    return JsonTokenizer(Path(spec), eod_token=eod_token)


def _fetch_tokenizer(uri: str) -> Path:
    """A ``tokenizer.json`` at a storage URI (file://, s3://, gs://, az://), copied to a local
    temporary file of the same name (its sha256 goes into the meta like a local file's)."""
    import tempfile

    from spotwise.runtime.storage.base import BadStorageUri, open_storage

    parent, _, name = uri.rstrip("/").rpartition("/")
    try:
        raw = open_storage(parent).get_bytes(name)
    except BadStorageUri as e:
        raise InputError(Problem(TOKENIZER_FLAG, uri, f"{ALLOWED}, or its storage URI ({e})"),
                         source="data tokenize") from None
    if raw is None:
        raise InputError(Problem(TOKENIZER_FLAG, uri, f"{ALLOWED}, or its storage URI (nothing is there)"),
                         source="data tokenize")
    local = Path(tempfile.mkdtemp(prefix="spotwise-tokenizer-")) / name
    local.write_bytes(raw)
    return local

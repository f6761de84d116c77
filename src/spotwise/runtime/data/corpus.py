"""Your corpus into a token file: the inputs ``spotwise data tokenize`` reads, and the streaming pass.

Inputs, told apart by extension (or all of one format with ``input_format``):

* text (``.txt``, ``.md``, source files, ...): each file is one document, UTF-8;
* JSON lines (``.jsonl``, ``.ndjson``): each line an object whose ``field`` (``text``) is a document;
* Parquet (``.parquet``, the ``spotwise[data]`` extra's pyarrow): each row's ``field`` column.

Contract: memory stays bounded whatever the corpus size. Text files are read in pieces of about
:data:`PIECE_BYTES`, cut after a line end where there is one (a document longer than that is
encoded piece by piece: tokenizers that split words at whitespace, as BPE ones do, give the same
ids); JSON lines and Parquet rows are read a batch at a time; ids go to disk in chunks
(:class:`~spotwise.runtime.data.tokens.TokenWriter`). Every input is checked (exists, a file, a known
format) before anything is read, all problems in one message; a bad line or row found half-way
stops the pass, deletes the partial output and names the file, the line and ``--field``.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

from spotwise.errors import InputError, Problem
from spotwise.runtime.data.tokenizer import Tokenizer
from spotwise.runtime.data.tokens import TokenWriter, write_meta

SOURCE = "data tokenize"
PIECE_BYTES = 1 << 20          # a text piece; also how much text one encode_batch gets
TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst", ".tex", ".html", ".py", ".c", ".h", ".cc", ".cpp", ".hpp",
                 ".rs", ".go", ".java", ".js", ".ts", ".sh", ".toml", ".yaml", ".yml")
FORMATS = {"text": TEXT_SUFFIXES, "jsonl": (".jsonl", ".ndjson"), "parquet": (".parquet",)}


def allowed_inputs() -> str:
    return ("; ".join(f"{name}: {', '.join(sfx)}" for name, sfx in FORMATS.items())
            + " (or --input-format text|jsonl|parquet for other names)")


@dataclass(frozen=True)
class Source:
    """One input: the name as given, its path, format and size in bytes."""

    name: str
    path: Path
    format: str
    size: int


@dataclass(frozen=True)
class Piece:
    """Text read from a source: ``doc_end`` when a document ends with it; ``nbytes`` read for it."""

    text: str
    doc_end: bool
    nbytes: int


def plan_inputs(names: list[str], input_format: str | None = None) -> list[Source]:
    """The inputs as :class:`Source` s, or one :class:`InputError` listing every bad one (field ``IN``)."""
    if input_format is not None and input_format not in FORMATS:
        raise InputError(Problem("--input-format", input_format, ", ".join(FORMATS)), source=SOURCE)
    if not names:
        raise InputError(Problem("IN", [], "one or more input files, then OUT"), source=SOURCE)
    out, probs = [], []
    for n in names:
        p = Path(n)
        fmt = input_format or next((f for f, sfx in FORMATS.items() if p.name.lower().endswith(sfx)), None)
        if not p.exists():
            probs.append(Problem("IN", n, "an existing file (no such file)"))
        elif not p.is_file():
            probs.append(Problem("IN", n, "a file (directories are not walked: pass their files, e.g. dir/*.txt)"))
        elif fmt is None:
            probs.append(Problem("IN", n, allowed_inputs()))
        else:
            out.append(Source(n, p, fmt, p.stat().st_size))
    if probs:
        raise InputError(probs, source=SOURCE)
    return out


def _text_pieces(src: Source) -> Iterator[Piece]:
    dec = codecs.getincrementaldecoder("utf-8")("strict")
    carry, offset = "", 0
    with open(src.path, "rb") as f:
        while True:
            raw = f.read(PIECE_BYTES)
            try:
                text = carry + dec.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                raise InputError(Problem("IN", src.name, f"UTF-8 text (invalid byte near offset {offset + e.start})"),
                                 source=SOURCE) from None
            offset += len(raw)
            if not raw:
                yield Piece(text, True, 0)
                return
            cut = text.rfind("\n") + 1 or len(text)
            carry = text[cut:]
            yield Piece(text[:cut], False, len(raw))


def _jsonl_pieces(src: Source, field: str) -> Iterator[Piece]:
    with open(src.path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                yield Piece("", False, len(line))
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                raise InputError(Problem(f"IN {src.name} line {lineno}", line[:60].decode("utf-8", "replace"),
                                         "a JSON object (UTF-8) on each line"), source=SOURCE) from None
            if not isinstance(obj, dict) or not isinstance(obj.get(field), str):
                got = (type(obj).__name__ if not isinstance(obj, dict)
                       else "no such key" if field not in obj else type(obj[field]).__name__)
                raise InputError(Problem(f"--field {field} ({src.name} line {lineno})", got,
                                         f"each line an object with a string {field!r} (choose the key with --field)"),
                                 source=SOURCE)
            yield Piece(obj[field], True, len(line))


def _parquet_pieces(src: Source, field: str) -> Iterator[Piece]:
    from spotwise.extras import require

    require("pyarrow", "data", "Parquet input")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(src.path)
    except (OSError, pa.ArrowException) as e:
        raise InputError(Problem("IN", src.name, f"a Parquet file ({str(e)[:120]})"), source=SOURCE) from None
    schema = pf.schema_arrow
    if field not in schema.names:
        raise InputError(Problem(f"--field {field} ({src.name})", "no such column",
                                 f"a string column: one of {', '.join(schema.names)}"), source=SOURCE)
    typ = schema.field(field).type
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
        raise InputError(Problem(f"--field {field} ({src.name})", str(typ), "a string column"), source=SOURCE)
    rows = max(pf.metadata.num_rows, 1)
    row = 0
    for batch in pf.iter_batches(columns=[field], batch_size=1024):
        col = batch.column(0)
        if col.null_count:
            at = row + next(i for i, v in enumerate(col.is_null().to_pylist()) if v)
            raise InputError(Problem(f"--field {field} ({src.name} row {at})", None, "a string (not null)"),
                             source=SOURCE)
        texts = col.to_pylist()
        share = src.size * len(texts) // rows
        for i, t in enumerate(texts):
            yield Piece(t, True, share if i == 0 else 0)
        row += len(texts)


def pieces(src: Source, field: str = "text") -> Iterator[Piece]:
    """The text of one input, in order, as :class:`Piece` s."""
    if src.format == "text":
        return _text_pieces(src)
    if src.format == "jsonl":
        return _jsonl_pieces(src, field)
    return _parquet_pieces(src, field)


def tokenize_corpus(sources: list[Source], tok: Tokenizer, out: Path, *, field: str = "text",
                    progress: Callable[[int], None] | None = None) -> dict:
    """Tokenize ``sources`` into the token file ``out`` and ``meta.json`` beside it; returns the meta.

    Written to a temporary name and renamed at the end, so ``out`` is never a partial file. Empty
    documents are skipped (no end-of-document id for them); an input with no text at all is an
    :class:`InputError` naming ``IN``. ``progress(n)`` is told the bytes read as they are."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.partial")
    writer = TokenWriter(tmp, tok.vocab_size)
    eod = tok.eod_id
    docs_total = 0
    in_doc = False          # the current document has tokens already
    inputs = []
    try:
        for src in sources:
            n_docs, n_tokens = 0, writer.count
            batch: list[Piece] = []
            size = 0

            def flush() -> None:
                nonlocal in_doc, docs_total, n_docs
                for piece, ids in zip(batch, tok.encode_batch([p.text for p in batch])):
                    if len(ids):
                        if not in_doc and docs_total and eod is not None:
                            writer.write([eod])
                        if not in_doc and tok.doc_prefix:
                            writer.write(list(tok.doc_prefix))
                        writer.write(ids)
                        in_doc = True
                    if piece.doc_end and in_doc:
                        if tok.doc_suffix:
                            writer.write(list(tok.doc_suffix))
                        docs_total, n_docs, in_doc = docs_total + 1, n_docs + 1, False
                    if progress and piece.nbytes:
                        progress(piece.nbytes)
                batch.clear()

            for p in pieces(src, field):
                batch.append(p)
                size += len(p.text)
                if size >= PIECE_BYTES or len(batch) >= 4096:
                    flush()
                    size = 0
            flush()
            inputs.append({"name": src.name, "format": src.format, "size_bytes": src.size,
                           "documents": n_docs, "tokens": writer.count - n_tokens})
        if writer.count == 0:
            raise InputError(Problem("IN", [s.name for s in sources],
                                     "input with some text (every input was empty)"), source=SOURCE)
    except BaseException:
        writer.abort()
        raise
    written = writer.close()
    tmp.replace(out)
    created = datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return write_meta(out.with_name("meta.json"), tokens_file=out.name, vocab_size=tok.vocab_size,
                      written=written, tokenizer=tok.describe(), eod_id=eod, inputs=inputs,
                      documents=docs_total, created_at=created)

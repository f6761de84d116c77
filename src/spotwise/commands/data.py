"""``spotwise data tokenize IN... OUT``: your text, JSON lines or Parquet into a flat token file.

The work is :func:`spotwise.runtime.data.corpus.tokenize_corpus` (the format: :mod:`spotwise.runtime.
tokens`); this module reads the flags, shows a progress bar on a terminal (none off one, so logs
and pipes stay clean), and puts the result where ``OUT`` says: a path or ``file://`` URI is written
in place (through a temporary name); an ``s3://``, ``gs://`` or ``az://`` URI is written to a local temporary directory
first and then uploaded with the storage layer, ``meta.json`` beside it. If that upload fails the
local files are kept and the message says where, so a long tokenization is not lost.
"""

from __future__ import annotations

from typing import Any, List, Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option, print_json, print_table

SOURCE = "data tokenize"


def _local_out(out: str):
    """``(local path, storage URI of its directory or None)`` for ``OUT``; InputError naming ``OUT``."""
    from pathlib import Path
    from urllib.parse import urlparse

    from spotwise.errors import InputError, Problem
    from spotwise.runtime.storage.base import BadStorageUri, URI_FORMS, check_uri, file_uri_path

    scheme = urlparse(out).scheme
    if scheme in ("file", "s3", "gs", "az"):
        try:
            check_uri(out)
        except BadStorageUri as e:
            raise InputError(Problem("OUT", out, str(e)), source=SOURCE) from None
    elif "://" in out:
        raise InputError(Problem("OUT", out, f"a path, or {URI_FORMS}"), source=SOURCE)
    if scheme in ("s3", "gs", "az"):
        parent, _, name = out[len(f"{scheme}://"):].rpartition("/")
        if scheme == "az" and "/" not in parent:   # az://ACCOUNT/CONTAINER/...: the name comes after both
            parent = ""
        if not parent or not name or name == "meta.json":
            form = ("az://ACCOUNT/CONTAINER/[PREFIX/]NAME, e.g. az://myaccount/my-container/data/tokens.bin"
                    if scheme == "az" else f"{scheme}://BUCKET/[PREFIX/]NAME, e.g. {scheme}://my-bucket/data/tokens.bin")
            raise InputError(Problem("OUT", out, form), source=SOURCE)
        return name, f"{scheme}://{parent}"
    path = file_uri_path(out) if scheme == "file" else Path(out)
    if path.is_dir() or out.endswith("/"):
        raise InputError(Problem("OUT", out, "a file name for the tokens, e.g. data/tokens.bin (meta.json goes "
                                 "beside it)"), source=SOURCE)
    if path.name == "meta.json":
        raise InputError(Problem("OUT", out, "a name other than meta.json (that is the meta's name)"), source=SOURCE)
    return path, None


def tokenize(inputs: list[str], out: str, *, tokenizer: str = "bytes", field: str = "text", eod: bool = False,
             eod_token: str | None = None, input_format: str | None = None, show_progress: bool = False) -> dict:
    """Tokenize ``inputs`` into ``out`` (path, ``file://``, ``s3://``, ``gs://`` or ``az://``); the meta plus
    where it went."""
    import shutil
    import tempfile
    from pathlib import Path

    from spotwise.errors import InputError, Problem, SpotwiseError
    from spotwise.runtime.data.corpus import plan_inputs, tokenize_corpus
    from spotwise.runtime.data.tokenizer import load_tokenizer

    if not field:
        raise InputError(Problem("--field", field, "a non-empty key or column name"), source=SOURCE)
    sources = plan_inputs(inputs, input_format)
    target, remote = _local_out(out)
    tok = load_tokenizer(tokenizer, eod=eod, eod_token=eod_token)
    if remote is None:
        path = Path(target)
        if any(path.resolve() == s.path.resolve() for s in sources):
            raise InputError(Problem("OUT", out, "a path that is not one of the inputs"), source=SOURCE)
        path.parent.mkdir(parents=True, exist_ok=True)
        workdir = None
    else:
        store = _reachable(remote, out, str(target))
        workdir = Path(tempfile.mkdtemp(prefix="spotwise-tokens-"))
        path = workdir / str(target)

    with _progress(sum(s.size for s in sources), show_progress) as advance:
        try:
            meta = tokenize_corpus(sources, tok, path, field=field, progress=advance)
        except BaseException:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
    if remote is None:
        return {**meta, "out": str(path), "meta": str(path.with_name("meta.json"))}

    try:
        store.put_file(path, path.name)
        store.put_file(path.with_name("meta.json"), "meta.json")
    except SpotwiseError:
        raise
    except Exception as e:  # noqa: BLE001 - any storage failure: keep the local files and say where they are
        raise SpotwiseError(f"OUT {out}: upload failed ({type(e).__name__}: {str(e)[:200]}); the tokens and "
                            f"meta.json are kept in {workdir}") from None
    shutil.rmtree(str(workdir), ignore_errors=True)
    return {**meta, "out": store.child_uri(path.name), "meta": store.child_uri("meta.json")}


def _reachable(remote: str, out: str, name: str):
    """The storage of ``remote``, after one listing call proves the bucket is there and ours to
    read: a typo in the bucket name fails now, not after hours of tokenizing (exit 1, naming OUT)."""
    from spotwise.errors import SpotwiseError
    from spotwise.runtime.storage.base import open_storage

    store = open_storage(remote)
    try:
        store.list(name)
    except SpotwiseError:
        raise
    except Exception as e:  # noqa: BLE001 - any storage failure (no bucket, no rights, no network): say so, no trace
        raise SpotwiseError(f"OUT {out}: cannot reach it ({type(e).__name__}: {str(e)[:200]})") from None
    return store


class _progress:
    """A Rich progress bar on stderr (bytes read of ``total``) when ``show``; else a no-op."""

    def __init__(self, total: int, show: bool) -> None:
        self.total, self.show = total, show
        self.bar: Any = None

    def __enter__(self):
        if not self.show:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("tokenizing"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                            console=Console(stderr=True), transient=True)
        self.bar.__enter__()
        task = self.bar.add_task("tokenizing", total=self.total)
        bar = self.bar
        return lambda n: bar.advance(task, n)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


@COMMANDS.register("data")
def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Your training data: tokenize text into a token file.", no_args_is_help=True)

    @group.command("tokenize", help="Tokenize text files, JSON lines (.jsonl) or Parquet into a flat token file "
                   "OUT (uint16 when the vocabulary fits, else uint32) with meta.json beside it. OUT may be "
                   "a path, file:///abs/path, s3://bucket/prefix/NAME, gs://bucket/prefix/NAME or "
                   "az://account/container/prefix/NAME.")
    def tokenize_cmd(
        paths: Optional[List[str]] = typer.Argument(None, metavar="IN... OUT", help="Inputs, then the token file."),
        tokenizer: str = typer.Option("bytes", "--tokenizer", help="bytes (default), or PATH/tokenizer.json "
                                      "(needs the data extra; read locally, never downloaded)."),
        field: str = typer.Option("text", "--field", help="The JSON key or Parquet column holding the text."),
        eod: bool = typer.Option(False, "--eod", help="An end-of-document id between documents (bytes: id 256, "
                                 "vocabulary 257)."),
        eod_token: Optional[str] = typer.Option(None, "--eod-token", help="With a tokenizer.json: the vocabulary "
                                                "token to put between documents (implies --eod)."),
        input_format: Optional[str] = typer.Option(None, "--input-format", help="text, jsonl or parquet for every "
                                                   "input (default: by extension)."),
        fmt: Format = format_option(),
    ) -> None:
        import sys

        from spotwise.errors import InputError, Problem

        paths = list(paths or [])
        if len(paths) < 2:
            raise InputError(Problem("IN... OUT", paths, "one or more input files, then the output token file"),
                             source=SOURCE)
        meta = tokenize(paths[:-1], paths[-1], tokenizer=tokenizer, field=field, eod=eod or eod_token is not None,
                        eod_token=eod_token, input_format=input_format, show_progress=sys.stderr.isatty())
        if fmt is Format.json:
            print_json(meta)
            return
        tk = meta["tokenizer"]
        row = {"tokens": f"{meta['token_count']:,}", "documents": f"{meta['documents']:,}", "dtype": meta["dtype"],
               "vocab": meta["vocab_size"], "tokenizer": tk.get("name", tk["kind"]),
               "eod_id": meta["eod_id"], "out": meta["out"]}
        print_table([row], list(row), title="data tokenize",
                    footnotes=[f"meta: {meta['meta']}", f"sha256: {meta['sha256']}"])

    app.add_typer(group, name="data")

"""``spotwise data tokenize``: inputs, tokenizers, the token file and its meta, s3:// output, bad input.

Runs the CLI in-process (``spotwise.cli.main``), so pytest's captured stderr is not a terminal: no
progress bar may appear there. Nothing is downloaded: the text is Python's own standard library,
the tokenizer.json files are trained or built here with the ``tokenizers`` library itself.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from spotwise.cli import main
from spotwise.runtime.data.tokenizer import BytesTokenizer
from spotwise.runtime.data.tokens import TokenFile

STDLIB = Path(sysconfig.get_paths()["stdlib"])
LIB_FILES = sorted((STDLIB / "json").glob("*.py"))


def run(capsys, *args):
    rc = main(["data", "tokenize", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def tokenize_json(capsys, *args) -> dict:
    rc, out, err = run(capsys, *args, "--format", "json")
    assert rc == 0, err
    assert err == ""            # off a terminal: no progress bar, nothing else
    return json.loads(out)


def split_docs(ids: np.ndarray, eod: int) -> list[np.ndarray]:
    cuts = np.flatnonzero(ids == eod)
    return np.split(ids, cuts) if len(cuts) else [ids]


def test_bytes_round_trip_on_the_stdlib_with_eod(capsys, tmp_path):
    out = tmp_path / "data" / "tokens.bin"
    meta = tokenize_json(capsys, *LIB_FILES, out, "--eod")
    texts = [p.read_text(encoding="utf-8") for p in LIB_FILES]
    tf = TokenFile.open(out, vocab_size=257, verify=True)
    assert (meta["dtype"], meta["vocab_size"], meta["eod_id"], tf.tokens.dtype) == ("uint16", 257, 256, np.uint16)
    assert meta["token_count"] == sum(len(t.encode()) for t in texts) + len(texts) - 1    # eod BETWEEN docs
    tok = BytesTokenizer(eod=True)
    docs = [d[d != 256] for d in split_docs(np.asarray(tf.tokens), 256)]
    assert [tok.decode(d) for d in docs] == texts
    assert meta["documents"] == len(texts)
    assert meta["tokenizer"] == {"kind": "bytes"}
    assert [(i["name"], i["size_bytes"], i["format"]) for i in meta["inputs"]] == \
        [(str(p), p.stat().st_size, "text") for p in LIB_FILES]
    assert meta["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert meta["size_bytes"] == out.stat().st_size == 2 * meta["token_count"]
    assert meta["created_at"].endswith("Z") and meta["tokens_file"] == "tokens.bin"
    on_disk = json.loads((out.parent / "meta.json").read_text())
    assert on_disk == {k: v for k, v in meta.items() if k not in ("out", "meta")}
    assert not list(out.parent.glob(".*partial"))


def test_bytes_without_eod_is_vocab_256_and_pieces_of_a_long_file_join(capsys, tmp_path, monkeypatch):
    import spotwise.runtime.data.corpus as corpus

    monkeypatch.setattr(corpus, "PIECE_BYTES", 1000)           # many pieces per file
    src = tmp_path / "u.txt"
    text = "héllo wörld ✓\r\n" * 300 + "x" * 2500 + "\nend"     # multi-byte chars across piece edges
    src.write_text(text, encoding="utf-8", newline="")
    out = tmp_path / "t.bin"
    meta = tokenize_json(capsys, src, out)
    assert (meta["vocab_size"], meta["eod_id"], meta["dtype"]) == (256, None, "uint16")
    assert BytesTokenizer().decode(np.fromfile(out, dtype="<u2")) == text


def _bpe_tokenizer_json(path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    sentences = ["the quick brown fox jumps over the lazy dog", "a token file is a flat array of ids",
                 "spot instances are cheap until they are preempted"] * 20
    tok.train_from_iterator(sentences, trainer=trainer)
    tok.save(str(path))
    return path


def test_a_bpe_tokenizer_json_encodes_and_decodes_jsonl(capsys, tmp_path):
    pytest.importorskip("tokenizers")
    tj = _bpe_tokenizer_json(tmp_path / "tokenizer.json")
    docs = ["the quick brown fox", "spot instances are cheap", "ünïcode too ✓"]
    src = tmp_path / "docs.jsonl"
    src.write_text("\n".join(json.dumps({"body": d, "id": i}) for i, d in enumerate(docs)) + "\n\n")
    out = tmp_path / "t.bin"
    meta = tokenize_json(capsys, src, out, "--tokenizer", tj, "--field", "body", "--eod-token", "<|endoftext|>")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tj))
    eod = tok.token_to_id("<|endoftext|>")
    assert meta["eod_id"] == eod and meta["vocab_size"] == tok.get_vocab_size() and meta["dtype"] == "uint16"
    assert meta["tokenizer"] == {"kind": "tokenizer.json", "name": "tokenizer.json", "path": str(tj),
                                 "sha256": hashlib.sha256(tj.read_bytes()).hexdigest()}
    ids = np.asarray(TokenFile.open(out).tokens)
    parts = [[int(i) for i in d if i != eod] for d in split_docs(ids, eod)]
    assert [tok.decode(p) for p in parts] == docs
    assert meta["documents"] == 3 and meta["inputs"][0]["format"] == "jsonl"


def test_a_vocab_past_65536_is_written_as_uint32(capsys, tmp_path):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(70_000)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    src = tmp_path / "a.txt"
    src.write_text("w5 w69999 w65536")
    meta = tokenize_json(capsys, src, tmp_path / "t.bin", "--tokenizer", tmp_path / "tokenizer.json")
    tf = TokenFile.open(tmp_path / "t.bin", verify=True)
    assert meta["dtype"] == "uint32" and tf.tokens.dtype == np.uint32
    assert list(tf.tokens) == [5, 69999, 65536]


def test_parquet_input(capsys, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    docs = [f"row {i}: " + "lorem ipsum " * (i % 5) for i in range(2500)]
    pq.write_table(pa.table({"text": docs, "n": list(range(2500))}), tmp_path / "d.parquet", row_group_size=700)
    out = tmp_path / "t.bin"
    meta = tokenize_json(capsys, tmp_path / "d.parquet", out, "--eod")
    ids = np.asarray(TokenFile.open(out).tokens)
    assert [BytesTokenizer().decode(d[d != 256]) for d in split_docs(ids, 256)] == docs
    assert meta["documents"] == 2500 and meta["inputs"][0]["format"] == "parquet"


def test_s3_out_uploads_the_tokens_and_meta_beside_them(capsys, tmp_path, monkeypatch):
    boto3 = pytest.importorskip("boto3")
    from moto import mock_aws

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)      # re-read TMPDIR
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="corpus")
        meta = tokenize_json(capsys, LIB_FILES[0], "s3://corpus/data/v1/tokens.bin")
        blob = s3.get_object(Bucket="corpus", Key="data/v1/tokens.bin")["Body"].read()
        remote_meta = json.loads(s3.get_object(Bucket="corpus", Key="data/v1/meta.json")["Body"].read())
        assert meta["out"] == "s3://corpus/data/v1/tokens.bin" and meta["meta"] == "s3://corpus/data/v1/meta.json"
        assert remote_meta["sha256"] == hashlib.sha256(blob).hexdigest() == meta["sha256"]
        assert BytesTokenizer().decode(np.frombuffer(blob, "<u2")) == LIB_FILES[0].read_text()
        assert list((tmp_path / "tmp").iterdir()) == []          # the local copy is gone after the upload

        import spotwise.runtime.storage.base as storage
        import spotwise.runtime.storage.retry as storage_retry

        monkeypatch.setattr(storage_retry, "with_backoff", lambda fn, **kw: fn())     # no retries: fail at once
        rc, out, err = run(capsys, LIB_FILES[0], "s3://no-such-bucket/tokens.bin")    # found before tokenizing
        assert rc == 1 and "OUT s3://no-such-bucket/tokens.bin: cannot reach it" in err and "NoSuchBucket" in err
        assert list((tmp_path / "tmp").iterdir()) == []

        def broken(self, local, key):
            raise OSError("connection reset")

        monkeypatch.setattr(storage.S3Storage, "put_file", broken)
        rc, out, err = run(capsys, LIB_FILES[0], "s3://corpus/data/v2/tokens.bin")
        assert rc == 1 and "upload failed" in err and "kept in" in err and "Traceback" not in err
        kept = Path(err.split("kept in ")[1].split()[0])
        assert (kept / "tokens.bin").read_bytes() == blob and (kept / "meta.json").exists()


def test_gs_out_uploads_the_tokens_and_meta_beside_them(capsys, monkeypatch):
    pytest.importorskip("google.cloud.storage")
    from emulator.gcs_server import GcsEmulator

    with GcsEmulator() as gcs:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
        gcs.create_bucket("corpus")
        meta = tokenize_json(capsys, LIB_FILES[0], "gs://corpus/data/v1/tokens.bin")
        from spotwise.runtime.storage.base import open_storage

        st = open_storage("gs://corpus/data/v1")
        blob = st.get_bytes("tokens.bin")
        assert meta["out"] == "gs://corpus/data/v1/tokens.bin" and meta["meta"] == "gs://corpus/data/v1/meta.json"
        assert blob is not None and json.loads(st.get_bytes("meta.json") or b"{}")["sha256"] == meta["sha256"]
        assert hashlib.sha256(blob).hexdigest() == meta["sha256"]


def test_az_out_uploads_the_tokens_and_meta_beside_them(capsys, monkeypatch):
    pytest.importorskip("azure.storage.blob")
    from emulator.azurite_server import Azurite, azurite_bin

    if azurite_bin() is None:
        pytest.skip("azurite is not installed (scripts/install.sh --test installs it with npm)")
    with Azurite() as az:
        for k, v in az.env().items():
            monkeypatch.setenv(k, v)
        az.create_container("corpus")
        meta = tokenize_json(capsys, LIB_FILES[0], "az://devstoreaccount1/corpus/data/v1/tokens.bin")
        from spotwise.runtime.storage.base import open_storage

        st = open_storage("az://devstoreaccount1/corpus/data/v1")
        blob = st.get_bytes("tokens.bin")
        assert meta["out"] == "az://devstoreaccount1/corpus/data/v1/tokens.bin"
        assert meta["meta"] == "az://devstoreaccount1/corpus/data/v1/meta.json"
        assert blob is not None and json.loads(st.get_bytes("meta.json") or b"{}")["sha256"] == meta["sha256"]
        assert hashlib.sha256(blob).hexdigest() == meta["sha256"]


def _write(tmp_path: Path, name: str, data: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return p


BAD = [
    # (files to make, argv after `data tokenize` with {d} = the tmp dir, needle in the message)
    ({}, ["{d}/nope.txt", "{d}/t.bin"], "IN: got '{d}/nope.txt'; allowed: an existing file"),
    ({"x.csv": "a,b"}, ["{d}/x.csv", "{d}/t.bin"], ".jsonl"),
    ({}, ["{d}", "{d}/t.bin"], "directories are not walked"),
    ({"e.txt": ""}, ["{d}/e.txt", "{d}/t.bin"], "every input was empty"),
    ({"e.jsonl": "\n\n"}, ["{d}/e.jsonl", "{d}/t.bin"], "every input was empty"),
    ({"a.txt": b"ok \xff\xfe bad"}, ["{d}/a.txt", "{d}/t.bin"], "UTF-8 text"),
    ({"a.jsonl": '{"text": "ok"}\n[1, 2]\n'}, ["{d}/a.jsonl", "{d}/t.bin"], "--field text ({d}/a.jsonl line 2)"),
    ({"a.jsonl": '{"text": "ok"}\n{"body": "x"}\n'}, ["{d}/a.jsonl", "{d}/t.bin"], "no such key"),
    ({"a.jsonl": '{"text": 3}\n'}, ["{d}/a.jsonl", "{d}/t.bin"], "got 'int'"),
    ({"a.jsonl": 'not json\n'}, ["{d}/a.jsonl", "{d}/t.bin"], "a JSON object (UTF-8) on each line"),
    ({"a.txt": "hi"}, ["{d}/a.txt", "{d}/t.bin", "--field", ""], "--field"),
    ({"a.txt": "hi"}, ["{d}/t.bin"], "one or more input files, then the output token file"),
    ({"a.txt": "hi"}, ["{d}/a.txt", "{d}/t.bin", "--tokenizer", "{d}/missing.json"], "--tokenizer"),
    ({"a.txt": "hi", "tokenizer.json": "{not json"}, ["{d}/a.txt", "{d}/t.bin", "--tokenizer", "{d}/tokenizer.json"],
     "--tokenizer: got '{d}/tokenizer.json'"),
    ({"a.txt": "hi"}, ["{d}/a.txt", "{d}/t.bin", "--eod-token", "</s>"], "--eod-token"),
    ({"a.txt": "hi"}, ["{d}/a.txt", "{d}/t.bin", "--input-format", "csv"], "--input-format"),
    ({"a.txt": "hi"}, ["{d}/a.txt", "{d}"], "OUT"),
    ({"a.txt": "hi"}, ["{d}/a.txt", "{d}/meta.json"], "OUT"),
    ({"a.txt": "hi"}, ["{d}/a.txt", "{d}/a.txt"], "not one of the inputs"),
    ({"a.txt": "hi"}, ["{d}/a.txt", "ftp://host/t.bin"], "OUT"),
    ({"a.txt": "hi"}, ["{d}/a.txt", "s3://Bad_Bucket/t.bin"], "OUT"),
    ({"a.txt": "hi"}, ["{d}/a.txt", "file://relative/t.bin"], "OUT"),
    ({"a.txt": "hi"}, ["{d}/a.txt", "az://myaccount/corpus"], "az://ACCOUNT/CONTAINER/[PREFIX/]NAME"),   # no name
    ({"a.txt": "hi"}, ["{d}/a.txt", "az://My_Account/corpus/t.bin"], "valid storage account name"),
    ({"a.txt": "hi"}, ["{d}/a.txt", "az://myaccount/my--corpus/t.bin"], "valid container name"),
]


@pytest.mark.parametrize("files,argv,needle", BAD, ids=[f"{i}-{b[2][:30]}" for i, b in enumerate(BAD)])
def test_bad_input_exits_2_naming_what_is_wrong(capsys, tmp_path, files, argv, needle):
    for name, data in files.items():
        _write(tmp_path, name, data)
    d = str(tmp_path)
    rc, out, err = run(capsys, *[a.format(d=d) for a in argv])
    assert rc == 2, err
    assert needle.format(d=d) in err
    assert "Traceback" not in err + out
    assert not (tmp_path / "t.bin").exists() and not list(tmp_path.glob(".*partial"))


def test_a_malformed_parquet_or_column_exits_2(capsys, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["a", None]}), tmp_path / "n.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "i.parquet")
    _write(tmp_path, "bad.parquet", "not parquet at all")
    for name, needle in [("n.parquet", "n.parquet row 1)"), ("n.parquet", "one of body"),
                         ("i.parquet", "a string column"), ("bad.parquet", "a Parquet file")]:
        field = ["--field", "body"] if "row 1" in needle else []
        rc, out, err = run(capsys, tmp_path / name, tmp_path / "t.bin", *field)
        assert rc == 2 and needle in err and "Traceback" not in err, (name, err)


def test_without_the_data_extra_a_tokenizer_json_names_it(capsys, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tokenizers", None)      # as if not installed
    _write(tmp_path, "a.txt", "hi")
    _write(tmp_path, "tokenizer.json", "{}")
    rc, out, err = run(capsys, tmp_path / "a.txt", tmp_path / "t.bin", "--tokenizer", tmp_path / "tokenizer.json")
    assert rc == 3 and "pip install 'spotwise[data]'" in err and "Traceback" not in err


def test_a_tokenizer_json_eod_must_be_named_and_in_the_vocab(capsys, tmp_path):
    pytest.importorskip("tokenizers")
    tj = _bpe_tokenizer_json(tmp_path / "tokenizer.json")
    _write(tmp_path, "a.txt", "hi")
    for extra, needle in [(["--eod"], "--eod: got True; allowed: with a tokenizer.json, name its end-of-document"),
                          (["--eod-token", "</nope>"], "--eod-token: got '</nope>'; allowed: a token of tokenizer.json")]:
        rc, out, err = run(capsys, tmp_path / "a.txt", tmp_path / "t.bin", "--tokenizer", tj, *extra)
        assert rc == 2 and needle in err, err


def test_a_tokenizers_own_bos_and_eos_go_once_around_each_document_and_a_uri_is_read(capsys, tmp_path):
    """A tokenizer.json whose post-processor adds BOS/EOS (as Llama 3's adds <|begin_of_text|>):
    each document gets them once, however many pieces it is read in; the tokenizer may be named
    by a storage URI (file:// here), its sha256 in the meta."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, processors

    tj = _bpe_tokenizer_json(tmp_path / "plain.json")
    tok = Tokenizer.from_file(str(tj))
    tok.add_special_tokens(["<s>", "</s>"])
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", bos),
                                                                                              ("</s>", eos)])
    (tmp_path / "tk").mkdir()
    tok.save(str(tmp_path / "tk" / "tokenizer.json"))
    docs = ["the quick brown fox", "spot instances are cheap"]
    src = tmp_path / "docs.jsonl"
    src.write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n")
    out = tmp_path / "t.bin"
    meta = tokenize_json(capsys, src, out, "--tokenizer", f"file://{tmp_path}/tk/tokenizer.json")
    ids = [int(i) for i in TokenFile.open(out).tokens]
    want = []
    for d in docs:
        want += [bos, *tok.encode(d, add_special_tokens=False).ids, eos]
    assert ids == want
    assert meta["tokenizer"]["sha256"] == hashlib.sha256((tmp_path / "tk" / "tokenizer.json").read_bytes()).hexdigest()
    assert (meta["tokenizer"]["doc_prefix"], meta["tokenizer"]["doc_suffix"]) == ([bos], [eos])

"""The token-file reader (TokenFile.open) and check_token_meta, the pre-launch check of a meta."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spotwise.errors import InputError
from spotwise.runtime.data.tokens import TokenFile, TokenWriter, check_token_meta, dtype_for_vocab, write_meta


def make(tmp_path, ids, vocab=257, name="tokens.bin"):
    w = TokenWriter(tmp_path / name, vocab)
    for chunk in np.array_split(np.asarray(ids), 3):
        w.write(chunk)
    written = w.close()
    return write_meta(tmp_path / "meta.json", tokens_file=name, vocab_size=vocab, written=written,
                      tokenizer={"kind": "bytes"}, eod_id=256 if vocab == 257 else None, inputs=[], documents=1,
                      created_at="2026-11-27T00:00:00Z")


def test_dtype_follows_the_vocab():
    assert [dtype_for_vocab(v) for v in (256, 257, 65536, 65537, 200_000)] == \
        ["uint16", "uint16", "uint16", "uint32", "uint32"]
    with pytest.raises(ValueError):
        dtype_for_vocab(0)


def test_the_writer_refuses_ids_outside_the_vocab(tmp_path):
    w = TokenWriter(tmp_path / "t.bin", 256)
    with pytest.raises(ValueError, match="out of range"):
        w.write([1, 256])
    w.abort()
    assert not (tmp_path / "t.bin").exists()


def test_open_memmaps_and_verifies(tmp_path):
    ids = np.arange(1000) % 257
    meta = make(tmp_path, ids)
    tf = TokenFile.open(tmp_path / "tokens.bin", vocab_size=257, verify=True)
    assert isinstance(tf.tokens, np.memmap) and len(tf) == 1000 and tf.vocab_size == 257 and tf.eod_id == 256
    assert np.array_equal(tf.tokens, ids) and meta["size_bytes"] == 2000
    assert TokenFile.open(tmp_path / "tokens.bin", vocab_size=512).vocab_size == 257   # a padded model vocab is fine


def test_open_catches_a_changed_a_truncated_and_a_foreign_file(tmp_path):
    make(tmp_path, np.arange(100))
    p = tmp_path / "tokens.bin"
    data = bytearray(p.read_bytes())
    data[0] ^= 1
    p.write_bytes(bytes(data))
    TokenFile.open(p)                                     # same size: only the sha256 can tell
    with pytest.raises(InputError, match="sha256"):
        TokenFile.open(p, verify=True)
    p.write_bytes(bytes(data[:-2]))
    with pytest.raises(InputError, match="truncated"):
        TokenFile.open(p)
    (tmp_path / "other.bin").write_bytes(bytes(data))
    with pytest.raises(InputError, match="tokens_file"):
        TokenFile.open(tmp_path / "other.bin")
    with pytest.raises(InputError, match="vocab"):
        make(tmp_path, np.arange(100))
        TokenFile.open(p, vocab_size=128)
    (tmp_path / "meta.json").unlink()
    with pytest.raises(InputError, match="meta.json"):
        TokenFile.open(p)
    (tmp_path / "meta.json").write_text("{nope")
    with pytest.raises(InputError, match="JSON"):
        TokenFile.open(p)


def test_check_token_meta_names_each_problem(tmp_path):
    good = make(tmp_path, np.arange(10), vocab=70_000)
    assert good["dtype"] == "uint32"
    assert check_token_meta(good, 70_000, file_size=40) == []
    assert check_token_meta(json.loads(json.dumps(good)), 100_000) == []
    cases = [
        (dict(good), 50_000, None, "the model's vocabulary has 50000"),
        (dict(good, dtype="uint16"), None, None, "cannot hold"),
        (dict(good, dtype="float32"), None, None, "dtype: got 'float32'"),
        (dict(good, size_bytes=41), None, None, "size_bytes: 41"),
        (dict(good), None, 39, "the token file has 39 bytes"),
        (dict(good, token_count=-1), None, None, "token_count"),
        (dict(good, format="npy"), None, None, "format"),
        (dict(good, sha256="abc"), None, None, "sha256"),
        (dict(good, byteorder="big"), None, None, "byteorder"),
    ]
    for meta, vocab, size, needle in cases:
        probs = check_token_meta(meta, vocab, file_size=size)
        assert any(needle in p for p in probs), (needle, probs)
    assert check_token_meta([1, 2]) == ["meta is not a JSON object (got list)"]

"""Training on a token file (training.data): the node cache, the batches of a step, S3, exact resume.

Token files are made by ``spotwise data tokenize`` (in-process) from a few of Python's own
standard-library sources, bytes tokenizer (vocabulary 256, what tiny-gpt takes). No Ray here.
"""

from __future__ import annotations

import multiprocessing
import sysconfig
from pathlib import Path

import boto3
import numpy as np
import pytest
import torch

from spotwise.cli import main
from spotwise.errors import InputError
from spotwise.runtime.api import CheckpointConfig, ModelConfig, TrainConfig
from spotwise.runtime.training.builtin import gpt_spec
from spotwise.runtime.checkpoint.checkpointer import run_storage
from spotwise.runtime.config import DataConfig
from spotwise.runtime.data.cache import fetch
from spotwise.runtime.data.dataset import DataNeeds, TokenBatches, WindowOrder, check_data, token_batches
from spotwise.runtime.training.loop import LocalSession, run_loop
from spotwise.runtime.storage.base import LocalStorage

from ..fakes import EnvPatch

STDLIB = Path(sysconfig.get_paths()["stdlib"])
TINY = ModelConfig(seq_len=16, d_model=32, n_layers=2, n_heads=2)


def tokenize(out: Path, files, *flags: str) -> Path:
    assert main(["data", "tokenize", *map(str, files), str(out), *flags]) == 0
    return out


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("SPOTWISE_HOME", str(h))
    return h


@pytest.fixture
def token_file(tmp_path, capsys) -> Path:
    p = tokenize(tmp_path / "data" / "tokens.bin", sorted((STDLIB / "json").glob("*.py")))
    capsys.readouterr()
    return p


# --- the cache ---------------------------------------------------------------------------------------


class GatedStore(LocalStorage):
    """A local store whose download says it started, then waits for ``gate`` (bounded)."""

    def __init__(self, root, started, gate) -> None:
        super().__init__(root)
        self.started, self.gate = started, gate

    def get_file(self, key, local):
        self.started.set()
        self.gate.wait(60)
        super().get_file(key, local)


def _fetch_child(uri, root, started, waiting, first, results):
    if first:
        store = GatedStore(Path(uri[len("file://"):]).parent, started, waiting)
    else:
        started.wait(60)               # the first process holds the lock and is downloading
        store = None
    got = fetch(uri, root=Path(root), store=store, on_wait=waiting.set)
    results.put((first, got.downloaded, str(got.path)))


def test_two_processes_at_once_download_once(tmp_path, token_file):
    ctx = multiprocessing.get_context("fork")
    started, waiting, results = ctx.Event(), ctx.Event(), ctx.Queue()
    uri, root = f"file://{token_file}", str(tmp_path / "cache")
    procs = [ctx.Process(target=_fetch_child, args=(uri, root, started, waiting, first, results))
             for first in (True, False)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    got = sorted(results.get(timeout=10) for _ in procs)
    assert waiting.is_set()                         # the second one did find the lock taken
    assert [(first, downloaded) for first, downloaded, _ in got] == [(False, False), (True, True)]
    assert got[0][2] == got[1][2] and Path(got[0][2]).read_bytes() == token_file.read_bytes()
    assert fetch(uri, root=Path(root)).downloaded is False


class CorruptingStore(LocalStorage):
    def get_file(self, key, local):
        super().get_file(key, local)
        data = bytearray(Path(local).read_bytes())
        data[len(data) // 2] ^= 0xFF                     # same size: only the sha256 can tell
        Path(local).write_bytes(bytes(data))


def test_a_corrupt_download_is_refused_and_nothing_is_cached(tmp_path, token_file):
    uri, root = f"file://{token_file}", tmp_path / "cache"
    with pytest.raises(InputError, match="sha256") as e:
        fetch(uri, root=root, store=CorruptingStore(token_file.parent))
    assert "training.data.uri" in str(e.value)
    assert [p.name for p in root.rglob("*") if p.is_file() and not p.name.endswith(".lock")] == []
    good = fetch(uri, root=root)
    assert good.downloaded and good.path.read_bytes() == token_file.read_bytes()


def test_a_changed_file_is_fetched_again(tmp_path, token_file, capsys):
    uri, root = f"file://{token_file}", tmp_path / "cache"
    one = fetch(uri, root=root)
    assert one.downloaded and not fetch(uri, root=root).downloaded
    tokenize(token_file, sorted((STDLIB / "email").glob("*.py"))[:3])      # same URI, new contents
    two = fetch(uri, root=root)
    assert two.downloaded and two.path != one.path
    assert two.path.read_bytes() == token_file.read_bytes() != one.path.read_bytes()
    assert two.path.parent.name == two.meta["sha256"]


def test_a_token_file_replaced_without_its_meta_is_refused(tmp_path, token_file):
    token_file.write_bytes(token_file.read_bytes()[::-1])
    with pytest.raises(InputError, match="replaced without its meta"):
        fetch(f"file://{token_file}", root=tmp_path / "cache")


def test_a_run_pinned_to_a_sha256_refuses_a_file_tokenized_again(home, tmp_path, token_file):
    pin = fetch(f"file://{token_file}", root=tmp_path / "cache").meta["sha256"]
    data = DataConfig(uri=f"file://{token_file}", sha256=pin)
    assert token_batches(data, seq_len=16, batch_size=4, seed=0, vocab_size=256)(0, 0, 1)[0].shape == (4, 16)
    tokenize(token_file, sorted((STDLIB / "email").glob("*.py"))[:3])      # the same URI, new contents
    with pytest.raises(InputError, match="changed since the run was launched") as e:
        token_batches(data, seq_len=16, batch_size=4, seed=0, vocab_size=256)(0, 0, 1)
    assert "training.data.sha256" in str(e.value)
    with pytest.raises(InputError, match="training.data.sha256"):
        check_data(data.uri, DataNeeds(vocab_size=256, seq_len=16, batch_size=4), sha256=pin)


# --- the batches -------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4099])
def test_each_epoch_visits_every_window_once(n):
    order = WindowOrder(n, seed=5)
    epochs = [order(np.arange(e * n, (e + 1) * n)) for e in range(3)]
    for perm in epochs:
        assert sorted(perm.tolist()) == list(range(n))
    if n >= 64:
        assert not np.array_equal(epochs[0], epochs[1])                  # an order per epoch
        assert not np.array_equal(epochs[0], WindowOrder(n, seed=6)(np.arange(n)))   # and per seed
        assert not np.array_equal(epochs[0], np.arange(n))


def test_batches_are_a_pure_function_of_step_and_split_across_ranks(home, token_file):
    data = DataConfig(uri=f"file://{token_file}")
    fn = token_batches(data, seq_len=16, batch_size=4, seed=3, vocab_size=256)
    other = token_batches(data, seq_len=16, batch_size=4, seed=3, vocab_size=256)
    tokens = np.fromfile(token_file, dtype="<u2")
    n = len(tokens) // 17
    seen = []
    for step in (0, 5, 1, 5, n // 4 + 2):
        x, y = fn(step, 0, 1)
        assert x.shape == y.shape == (4, 16) and x.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])
        x2, y2 = other(step, 0, 1)                     # another process's function: the same batch
        assert torch.equal(x, x2) and torch.equal(y, y2)
        halves = [fn(step, r, 2) for r in (0, 1)]
        assert torch.equal(torch.cat([h[0] for h in halves]), x) and torch.equal(torch.cat([h[1] for h in halves]), y)
        for row, w in zip(x.numpy(), fn.windows(step, 0, 1)):   # window w of the file, first seq_len tokens
            assert np.array_equal(row, tokens[w * 17:w * 17 + 16])
        seen.append(fn.windows(step, 0, 1).tolist())
    assert seen[1] == seen[3]
    steps_per_epoch = n // 4
    windows = np.concatenate([fn.windows(s, 0, 1) for s in range(steps_per_epoch)])
    assert len(set(windows.tolist())) == len(windows)               # no window twice within an epoch


def test_the_batch_function_pickles_without_its_memmap(home, token_file):
    import pickle

    fn = token_batches(DataConfig(uri=f"file://{token_file}"), seq_len=16, batch_size=4, seed=0, vocab_size=256)
    x, _ = fn(2, 0, 1)
    back = pickle.loads(pickle.dumps(fn))
    assert isinstance(back, TokenBatches) and back._tokens is None
    assert torch.equal(back(2, 0, 1)[0], x)


def test_check_data_reads_only_the_meta_and_the_size(tmp_path, home, token_file, capsys):
    meta = check_data(f"file://{token_file}", DataNeeds(vocab_size=256, seq_len=16, batch_size=4))
    assert meta["vocab_size"] == 256 and not (home / "cache").exists()      # nothing fetched
    eod = tokenize(tmp_path / "eod" / "tokens.bin", sorted((STDLIB / "json").glob("*.py")), "--eod")  # vocab 257
    with pytest.raises(InputError, match="vocab"):
        check_data(f"file://{eod}", DataNeeds(vocab_size=256, seq_len=16, batch_size=4))
    with pytest.raises(InputError, match="at least"):
        check_data(f"file://{token_file}", DataNeeds(vocab_size=256, seq_len=4096, batch_size=64))
    with pytest.raises(InputError, match="cannot take uint16"):
        check_data(f"file://{token_file}", DataNeeds(vocab_size=256, seq_len=16, batch_size=4, dtypes=("uint32",)))


# --- S3 ----------------------------------------------------------------------------------------------


def test_reads_the_token_file_from_s3(moto, home, token_file):
    with EnvPatch(moto.env()):
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="tokens")
        s3.upload_file(str(token_file), "tokens", "sets/json/tokens.bin")
        s3.upload_file(str(token_file.with_name("meta.json")), "tokens", "sets/json/meta.json")
        uri = "s3://tokens/sets/json/tokens.bin"
        needs = DataNeeds(vocab_size=256, seq_len=16, batch_size=4)
        assert check_data(uri, needs)["sha256"] == fetch(f"file://{token_file}", root=home / "x").meta["sha256"]
        from_s3 = token_batches(DataConfig(uri=uri), seq_len=16, batch_size=4, seed=1, vocab_size=256)
        x, y = from_s3(7, 1, 2)
        with pytest.raises(InputError, match="meta.json"):
            check_data("s3://tokens/nothing/tokens.bin", needs)
        s3.delete_object(Bucket="tokens", Key="sets/json/tokens.bin")
        with pytest.raises(InputError, match="an existing token file"):
            check_data(uri, needs)
    cached = list((home / "cache" / "data").glob("*/tokens.bin"))
    assert len(cached) == 1 and cached[0].read_bytes() == token_file.read_bytes()
    local = token_batches(DataConfig(uri=f"file://{token_file}"), seq_len=16, batch_size=4, seed=1, vocab_size=256)
    assert all(torch.equal(a, b) for a, b in zip((x, y), local(7, 1, 2)))


# --- tiny-gpt on a token file: interrupted and resumed == uninterrupted ----------------------------------


def cfg(uri: str, steps: int) -> TrainConfig:
    return TrainConfig(model=TINY, steps=steps, batch_size=4, data=DataConfig(uri=uri),
                       checkpoint=CheckpointConfig(interval_steps=2, keep_last=2), precision="fp32")


def test_the_data_section_round_trips_to_the_job_process():
    c = cfg("s3://tokens/sets/json/tokens.bin", 3)
    assert TrainConfig.model_validate_json(c.model_dump_json()) == c
    assert TrainConfig().data is None


def test_tiny_gpt_on_a_token_file_resumes_exactly(pg1, home, tmp_path, token_file):
    uri = f"file://{token_file}"
    spec = gpt_spec(cfg(uri, 7))
    assert isinstance(spec.batch_fn, TokenBatches)
    ref = run_loop(spec, LocalSession(), run_storage(f"file://{tmp_path}", "ref"))
    part = run_loop(gpt_spec(cfg(uri, 4)), LocalSession(), run_storage(f"file://{tmp_path}", "run"))
    s = LocalSession()
    full = run_loop(gpt_spec(cfg(uri, 7)), s, run_storage(f"file://{tmp_path}", "run"))
    stdlib = run_loop(gpt_spec(TrainConfig(model=TINY, steps=7, batch_size=4, precision="fp32")), LocalSession(),
                      run_storage(f"file://{tmp_path}", "stdlib"))
    assert s.resumes == [(4, 1)]
    assert part.model_sha256 != ref.model_sha256
    assert full.model_sha256 == ref.model_sha256
    assert full.losses == ref.losses[4:]
    assert stdlib.model_sha256 != ref.model_sha256                # the token file is what it trained on

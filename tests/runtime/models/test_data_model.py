import torch

from spotwise.runtime.api import ModelConfig
from spotwise.runtime.data.stdlib import batch_for, corpus_tensor, global_offsets, stdlib_corpus
from spotwise.runtime.checkpoint.digest import model_sha256
from spotwise.runtime.models.gpt import GPT, build_gpt, count_params, lm_loss


def test_corpus_is_stdlib_text_and_cached():
    data = stdlib_corpus()
    assert 1_000_000 < len(data) <= 8 * 1024 * 1024
    assert b"def " in data and b"import " in data
    assert stdlib_corpus() is data  # in-memory cache


def test_batch_is_pure_function_of_seed_step_rank_world():
    kw = dict(seed=3, step=17, batch_size=8, seq_len=16)
    a = batch_for(rank=1, world_size=2, **kw)
    b = batch_for(rank=1, world_size=2, **kw)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert a[0].shape == (4, 16) and a[0].dtype == torch.int64
    # targets are inputs shifted by one byte
    assert torch.equal(a[0][:, 1:], a[1][:, :-1])
    # different step -> different data
    c = batch_for(rank=1, world_size=2, **{**kw, "step": 18})
    assert not torch.equal(a[0], c[0])


def test_global_batch_does_not_depend_on_world_size():
    kw = dict(seed=0, step=5, batch_size=8, seq_len=16)
    whole = batch_for(rank=0, world_size=1, **kw)[0]
    halves = torch.cat([batch_for(rank=r, world_size=2, **kw)[0] for r in range(2)])
    quarters = torch.cat([batch_for(rank=r, world_size=4, **kw)[0] for r in range(4)])
    assert torch.equal(whole, halves) and torch.equal(whole, quarters)


def test_offsets_stay_in_corpus():
    n = int(corpus_tensor().numel())
    offs = global_offsets(seed=1, step=0, batch_size=1000, seq_len=128, n_tokens=n)
    assert offs.min() >= 0 and offs.max() + 129 <= n


def test_model_shapes_and_size():
    cfg = ModelConfig()
    m = build_gpt(cfg, seed=0)
    assert 2_000_000 < count_params(m) < 10_000_000   # "a few million"
    x = torch.randint(0, 256, (2, cfg.seq_len))
    out = m(x)
    assert out.shape == (2, cfg.seq_len, 256)
    loss = lm_loss(out, x)
    assert abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.5   # near-uniform at init


def test_same_seed_same_weights_and_sha():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=2, seq_len=8)
    a, b, c = build_gpt(cfg, seed=1), build_gpt(cfg, seed=1), build_gpt(cfg, seed=2)
    assert model_sha256(a.state_dict()) == model_sha256(b.state_dict())
    assert model_sha256(a.state_dict()) != model_sha256(c.state_dict())


def test_sha_canonical_order_and_content():
    import hashlib

    sd = {"b": torch.tensor([1.0, 2.0]), "a": torch.zeros(2, 1, dtype=torch.bfloat16)}
    h = hashlib.sha256()
    h.update(b"a\0torch.bfloat16\x002,1\0" + bytes(4))
    h.update(b"b\0torch.float32\x002\0" + torch.tensor([1.0, 2.0]).numpy().tobytes())
    assert model_sha256(sd) == h.hexdigest()
    # insertion order does not matter; a flipped bit does
    assert model_sha256(dict(reversed(list(sd.items())))) == h.hexdigest()
    sd["b"] = torch.tensor([1.0, 2.0000002])
    assert model_sha256(sd) != h.hexdigest()


def test_gpt_is_a_module():
    assert issubclass(GPT, torch.nn.Module)

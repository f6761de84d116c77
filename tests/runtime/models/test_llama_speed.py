"""The built-in Llama's speed knobs (issue 49, item 6): grouped-query attention without k/v copies,
the root split into its own FSDP units, ``training.compile`` per block before FSDP."""

import torch
import torch.nn.functional as F

from spotwise.runtime.llama_config import LlamaConfig
from spotwise.runtime.models import llama as llama_mod
from spotwise.runtime.models.llama import Attention, build_llama, rope_tables
from spotwise.runtime.training.parallel import parallelize


def test_gqa_hands_sdpa_the_kv_heads_as_they_are(monkeypatch):
    """Failed before: k and v were expanded to n_heads copies before attention."""
    cfg = LlamaConfig(dim=64, n_layers=1, n_heads=8, n_kv_heads=2, seq_len=16)
    torch.manual_seed(0)
    att = Attention(cfg)
    x = torch.randn(2, 16, 64)
    cos, sin = rope_tables(16, cfg.head_dim, cfg.rope_theta, x.device)
    calls = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append((q.shape[1], k.shape[1], v.shape[1], kw.get("enable_gqa")))
        return real(q, k, v, **kw)

    monkeypatch.setattr(llama_mod.F, "scaled_dot_product_attention", spy)
    out = att(x, cos, sin)
    assert calls == [(8, 2, 2, True)]
    # the same attention as repeating each kv head over its group of query heads
    b, t = 2, 16
    q = llama_mod.apply_rope(att.wq(x).view(b, t, 8, 8).transpose(1, 2), cos, sin)
    k = llama_mod.apply_rope(att.wk(x).view(b, t, 2, 8).transpose(1, 2), cos, sin).repeat_interleave(4, dim=1)
    v = att.wv(x).view(b, t, 2, 8).transpose(1, 2).repeat_interleave(4, dim=1)
    ref = att.wo(real(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1))
    torch.testing.assert_close(out, ref)


def test_plain_multi_head_attention_asks_for_no_gqa(monkeypatch):
    cfg = LlamaConfig(dim=32, n_layers=1, n_heads=4, seq_len=8)
    att = Attention(cfg)
    calls = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append(kw.get("enable_gqa"))
        return real(q, k, v, **kw)

    monkeypatch.setattr(llama_mod.F, "scaled_dot_product_attention", spy)
    cos, sin = rope_tables(8, cfg.head_dim, cfg.rope_theta, torch.device("cpu"))
    att(torch.randn(1, 8, 32), cos, sin)
    assert calls == [False]


def test_the_root_is_split_into_embedding_and_norm_plus_output_units(pg1):
    """Failed before: the root FSDP unit held the embedding, the final norm and the output head,
    all three unsharded for the whole step."""
    from torch.distributed.fsdp import FSDPModule

    model = parallelize(build_llama(LlamaConfig(flavor="debug"), seed=0), device=torch.device("cpu"),
                        precision="fp32")
    for m in (model.tok_embeddings, model.norm, model.output, *model.blocks):
        assert isinstance(m, FSDPModule)
    # the root owns no parameter of its own: each is in a block's, the embedding's or the head's unit
    owned = {id(p) for m in (model.tok_embeddings, model.norm, model.output, *model.blocks) for p in m.parameters()}
    assert all(id(p) in owned for p in model.parameters())
    logits = model(torch.zeros(1, 8, dtype=torch.long))
    assert logits.shape == (1, 8, 256) and torch.isfinite(logits).all()


def test_compile_wraps_each_block_after_checkpointing_and_before_fsdp_and_trains_alike(pg1, monkeypatch):
    """torchtitan's order (models/llama3/parallelize.py: activation checkpointing, compile, FSDP).
    Failed before as a task key: training.compile did not exist. The blocks go through Dynamo and
    AOTAutograd (``aot_eager``: the graphs checkpointing and FSDP's hooks must survive), not
    inductor's CPU code generation, which no GPU node runs (there inductor emits Triton) and which
    cost ~50 s of CPU here, minutes on a loaded machine, as a slow test."""
    import torch.distributed.fsdp as fsdp

    from spotwise.runtime.config import TrainConfig
    from spotwise.runtime.training.builtin import llama_spec

    cfg = TrainConfig(entrypoint="llama", model={"flavor": "debug", "seq_len": 32}, compile=True,
                      activation_checkpointing=True)
    spec = llama_spec(cfg)
    assert spec.compile is True
    order: list[str] = []
    real_shard, real_compile = fsdp.fully_shard, torch.nn.Module.compile

    def shard(module, **kw):
        order.append("shard")
        return real_shard(module, **kw)

    def compile_(self, *a, **kw):
        order.append(f"compile {type(self).__name__}")
        assert not a and not kw, (a, kw)        # the product compiles with torch's defaults
        return real_compile(self, backend="aot_eager")

    monkeypatch.setattr(fsdp, "fully_shard", shard)
    monkeypatch.setattr(torch.nn.Module, "compile", compile_)
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    losses = []
    for on in (False, True):
        model = parallelize(build_llama(cfg.llama, seed=0), device=torch.device("cpu"), precision="fp32",
                            activation_checkpointing=True, compile=on)
        logits = model(x)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, 256), x[:, 1:].reshape(-1))
        loss.backward()
        losses.append((loss.detach(), model.blocks[0].attention.wq.weight.grad.full_tensor()))
    assert order[order.index("compile Block"):] == ["compile Block"] * 2 + ["shard"] * 5
    torch.testing.assert_close(losses[0][0], losses[1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(losses[0][1], losses[1][1], rtol=1e-4, atol=1e-6)


def test_num_threads_is_fixed_on_cpu_ranks_only():
    from spotwise.runtime.training.loop import fix_threads

    before = torch.get_num_threads()
    try:
        fix_threads(1, torch.device("cuda", 0))
        assert torch.get_num_threads() == before
        fix_threads(1, torch.device("cpu"))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)

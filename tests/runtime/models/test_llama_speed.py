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

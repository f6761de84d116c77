"""The built-in Llama: its task-file section, its size arithmetic, meta-device build and sharding,
initial weights independent of the world size, gradient accumulation, exact resume."""

import json
import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from torch.distributed.tensor import DTensor, Shard

from spotwise.runtime.training.builtin import builtin_spec, llama_spec
from spotwise.runtime.checkpoint.checkpointer import run_storage
from spotwise.runtime.config import CheckpointConfig, ModelConfig, TrainConfig
from spotwise.runtime.models.llama import Llama, apply_rope, rope_tables
from spotwise.runtime.llama_config import FLAVORS, LlamaConfig
from spotwise.runtime.training.loop import LocalSession, full_model_sha256, run_loop, train_step
from spotwise.runtime.training.parallel import parallelize
from spotwise.runtime.training.optim import warmup_cosine

from torchrun import run_json

CPU = torch.device("cpu")


def llama(**kw) -> TrainConfig:
    return TrainConfig(**{"entrypoint": "llama", "model": {"flavor": "debug"}, **kw})


def errors(**kw) -> dict[str, str]:
    with pytest.raises(ValidationError) as e:
        TrainConfig(**kw)
    return {".".join(str(p) for p in err["loc"]): err["msg"] for err in e.value.errors()}


# --- the task file's section ---------------------------------------------------------------------

def test_flavors_resolve_and_round_trip_through_json():
    for name, dims in FLAVORS.items():
        cfg = llama(model={"flavor": name})
        dump = cfg.model.model_dump(exclude={"flavor"})
        assert {k: dump[k] for k in dims} == dims
        assert TrainConfig.model_validate(json.loads(cfg.model_dump_json())) == cfg
    tweaked = llama(model={"flavor": "1b", "seq_len": 512}).model
    assert (tweaked.dim, tweaked.seq_len) == (2048, 512)


def test_explicit_dimensions_take_llamas_defaults():
    m = llama(model={"dim": 256, "n_layers": 3, "n_heads": 8}).model
    assert (m.n_kv_heads, m.ffn_dim, m.vocab_size) == (8, 768, 256)     # 8/3 * 256 = 682 -> 768


@pytest.mark.parametrize("model, field, says", [
    ({"flavor": "70b"}, "model.flavor", "'debug', '125m', '1b', '8b', 'llama3.2-1b' or 'llama3.1-8b'"),
    ({"flavor": "debug", "n_kv_heads": 3}, "model", "n_heads (4) must be divisible by n_kv_heads (3)"),
    ({"flavor": "debug", "dim": 102}, "model", "dim (102) must be divisible by n_heads (4)"),
    ({"dim": 80, "n_heads": 16, "n_layers": 1}, "model", "dim / n_heads (5) must be even"),
    ({"flavor": "debug", "vocab_size": 100}, "model.vocab_size", "greater than or equal to 256"),
    ({"flavor": "debug", "n_layers": 0}, "model.n_layers", "greater than or equal to 1"),
    ({"dim": 64}, "model", "n_layers, n_heads missing"),
    ({"flavor": "debug", "d_model": 64}, "model.d_model", "Extra inputs are not permitted"),
])
def test_bad_llama_sections_name_the_field(model, field, says):
    errs = errors(entrypoint="llama", model=model)
    assert field in errs and says in errs[field], errs


def test_the_section_schema_follows_the_entrypoint():
    assert "model.flavor" in errors(model={"flavor": "debug"})              # tiny-gpt has no flavor
    assert isinstance(TrainConfig(model={"d_model": 64}).model, ModelConfig)
    assert "model" in errors(entrypoint="llama", model=ModelConfig(d_model=64))
    assert isinstance(TrainConfig(entrypoint="llama", model={"flavor": "debug"}).model, LlamaConfig)
    assert "model" in errors(model=LlamaConfig(flavor="debug"))             # a llama section for tiny-gpt
    with pytest.raises(ValidationError, match="give flavor"):
        TrainConfig(entrypoint="llama")       # no silent size: a flavor or dimensions


def test_grad_accum_warmup_and_checkpointing_keys():
    cfg = llama(grad_accum=4, batch_size=8, warmup_steps=5, activation_checkpointing=True)
    spec = llama_spec(cfg)
    assert (spec.grad_accum, spec.activation_checkpointing) == (4, True)
    assert "grad_accum (3)" in errors(entrypoint="llama", model={"flavor": "debug"}, grad_accum=3)[""]
    assert "only entrypoint 'llama'" in errors(warmup_steps=3)[""]          # tiny-gpt's LR is constant
    assert "warmup_steps (9)" in errors(entrypoint="llama", model={"flavor": "debug"}, steps=5, warmup_steps=9)[""]
    # a user entrypoint: grad_accum/activation_checkpointing replace its spec's; a Ray Train function refuses them
    user = TrainConfig(entrypoint="pkg.mod:make", grad_accum=2, activation_checkpointing=True)
    assert user.overrides() == {"grad_accum": 2, "activation_checkpointing": True}
    assert "grad_accum: a Ray Train function" in errors(train_func="pkg.mod:train", grad_accum=2)[""]
    # tiny-gpt takes them too
    assert builtin_spec(TrainConfig(grad_accum=2)).grad_accum == 2


def test_warmup_then_cosine_is_a_pure_function_of_step():
    f = [warmup_cosine(s, lr=1.0, warmup=4, total=15, min_ratio=0.1) for s in range(17)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0]
    assert f[4] == 1.0 and f[14] == pytest.approx(0.1) and f[16] == pytest.approx(0.1)
    assert f[9] == pytest.approx(0.55)                 # half-way through the cosine: the mid-point
    assert all(a >= b for a, b in zip(f[4:], f[5:]))
    assert llama_spec(llama(steps=14, warmup_steps=4, lr=1.0)).lr_fn(2) == 0.75


# --- size arithmetic ------------------------------------------------------------------------------

@pytest.mark.parametrize("flavor", list(FLAVORS))
def test_parameter_count_is_the_models(flavor):
    cfg = LlamaConfig(flavor=flavor)
    with torch.device("meta"):
        model = Llama(cfg)
    assert cfg.n_params() == sum(p.numel() for p in model.parameters())


def test_flavor_sizes():
    assert LlamaConfig(flavor="8b").n_params() == 8_030_261_248        # Llama 3 8B's published count
    assert LlamaConfig(flavor="llama3.1-8b").n_params() == 8_030_261_248
    assert LlamaConfig(flavor="llama3.2-1b").n_params() == 1_235_814_400
    assert 1.0e9 < LlamaConfig(flavor="1b").n_params() < 1.2e9
    assert 1.2e8 < LlamaConfig(flavor="125m").n_params() < 1.3e8
    assert 2e5 < LlamaConfig(flavor="debug").n_params() < 1e6


@pytest.mark.parametrize("flavor, count, factor", [("llama3.2-1b", 1_235_814_400, 32.0),
                                                   ("llama3.1-8b", 8_030_261_248, 8.0)])
def test_published_flavors_have_the_published_parameter_counts(flavor, count, factor):
    """Meta's published counts (the Hugging Face model cards' safetensors totals) of Llama 3.2 1B
    and 3.1 8B, counted on the model built on the meta device (the tied head counted once)."""
    cfg = LlamaConfig(flavor=flavor)
    with torch.device("meta"):
        model = Llama(cfg)
    assert sum(p.numel() for p in model.parameters()) == count
    assert (model.output.weight is model.tok_embeddings.weight) == (flavor == "llama3.2-1b")
    assert cfg.vocab_size == 128256 and cfg.rope_theta == 500000.0 and cfg.rope_scaling is not None
    assert (cfg.rope_scaling.factor, cfg.rope_scaling.low_freq_factor, cfg.rope_scaling.high_freq_factor,
            cfg.rope_scaling.original_max_positions) == (factor, 1.0, 4.0, 8192)


def test_tie_embeddings_is_a_model_option(pg1):
    tied = parallelize(llama_spec(llama(model={"flavor": "debug", "tie_embeddings": True})).model_fn(),
                       device=CPU, precision="fp32")
    assert LlamaConfig(flavor="debug", tie_embeddings=True).n_params() == sum(p.numel() for p in tied.parameters())
    assert tied.output.weight is tied.tok_embeddings.weight
    assert tied(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 256)


def test_llama3_rope_scaling_keeps_high_frequencies_and_stretches_low_ones():
    from spotwise.runtime.llama_config import RopeScaling
    from spotwise.runtime.models.llama import llama3_scale

    s = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192)
    inv = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128))
    out = llama3_scale(inv, s)
    wavelen = 2 * math.pi / inv
    assert torch.equal(out[wavelen < 2048], inv[wavelen < 2048])
    assert torch.allclose(out[wavelen > 8192], inv[wavelen > 8192] / 8)
    mid = (wavelen > 2048) & (wavelen < 8192)
    assert mid.any() and bool(((out[mid] < inv[mid]) & (out[mid] > inv[mid] / 8)).all())


# --- the model ------------------------------------------------------------------------------------

def test_rope_is_computed_in_fp32_and_preserves_norms():
    cos, sin = rope_tables(16, 8, 10000.0, CPU)
    assert cos.dtype == sin.dtype == torch.float32
    x = torch.randn(2, 3, 16, 8)
    y = apply_rope(x, cos, sin)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert torch.equal(y[:, :, 0], x[:, :, 0])                         # position 0: no rotation
    assert apply_rope(x.bfloat16(), cos, sin).dtype == torch.bfloat16


def test_built_on_meta_and_sharded_before_any_parameter_has_storage(pg1, monkeypatch):
    import torch.distributed.fsdp as fsdp

    seen: list[tuple[str, bool]] = []
    real = fsdp.fully_shard

    def spy(module, **kw):
        mods = module if isinstance(module, list) else [module]      # a list: one unit of several
        seen.append(("+".join(type(m).__name__ for m in mods), all(p.is_meta for m in mods for p in m.parameters())))
        return real(module, **kw)

    monkeypatch.setattr(fsdp, "fully_shard", spy)
    spec = llama_spec(llama())
    model = spec.model_fn()
    assert all(p.is_meta for p in model.parameters())
    model = parallelize(model, device=CPU, precision="fp32")
    # every block, the embedding, the final norm with the head, then the root, was sharded while
    # nothing had storage
    assert seen == [("Block", True)] * 2 + [("Embedding", True), ("RMSNorm+Linear", True), ("Llama", True)]
    for blk in model.blocks:
        for p in blk.parameters():
            assert isinstance(p, DTensor) and p.placements == (Shard(0),) and not p.is_meta
    assert all(not p.is_meta for p in model.parameters())
    norm = model.blocks[0].attention_norm.weight.full_tensor()
    assert torch.equal(norm, torch.ones_like(norm))
    wq = model.blocks[0].attention.wq.weight.full_tensor()
    assert 0.015 < wq.std().item() < 0.025


def test_init_depends_on_seed_and_name_only(pg1):
    def weights(seed):
        m = parallelize(llama_spec(llama(seed=seed)).model_fn(), device=CPU, precision="fp32")
        return full_model_sha256(m), m.blocks[0].attention.wq.weight.full_tensor(), m.blocks[1].attention.wq.weight.full_tensor()

    a, b, c = weights(1), weights(1), weights(2)
    assert a[0] == b[0] != c[0]
    assert not torch.equal(a[1], a[2])                  # two parameters of one shape draw different values


@pytest.mark.slow
def test_two_ranks_start_from_the_one_rank_weights(pg1, tmp_path):
    """... and measure the one-rank held-out loss (training.eval's windows split over the ranks,
    unequally: 7 windows)."""
    from spotwise.runtime.training.evaluate import eval_loss

    from .llama_ranks import eval_tokens

    m1 = parallelize(llama_spec(llama(seed=5)).model_fn(), device=CPU, precision="fp32")
    one = full_model_sha256(m1)
    ev1 = eval_loss(m1, eval_tokens(), 32, device=CPU, batch=2)
    out = run_json([str(Path(__file__).with_name("llama_ranks.py")), "5"], 2, timeout=300)
    assert out["world"] == 2 and out["local"] <= math.ceil(out["total"] / 2) + 64
    assert out["sha"] == one
    assert out["eval"] == pytest.approx(ev1, rel=1e-12, abs=0)


def test_grad_accum_4_equals_one_batch(pg1):
    """One optimizer step on a batch of 8 as 4 micro-batches of 2 equals one step on the 8 at once:
    the same mean gradient, summed in another order. Plain SGD without clipping, so each weight
    moves by exactly lr x its gradient; lr 1000 because this init's gradients are small (1e-7 to
    1e-4), and a move must stand well above the fp32 resolution of the weight it is taken from.
    Per parameter the two moves agree to rtol 1e-3, plus 1e-3 of the parameter's largest move for
    the elements near zero. A wrong scaling of the micro-batch losses (their sum instead of their
    mean: 4x) fails it by far; a clipped norm would hide such a scaling, hence no clipping. Not
    AdamW: its first step is about lr x sign(gradient), which turns
    a rounding-sized difference in a near-zero gradient into a full lr (seen: after another test
    had changed torch's thread count, which changes the order of the sums)."""
    import functools

    sgd = functools.partial(torch.optim.SGD, lr=1000.0)

    def after_one_step(grad_accum):
        spec = llama_spec(llama(batch_size=8, precision="fp32", grad_accum=grad_accum), optimizer_fn=sgd,
                          grad_clip=None, lr_fn=None)        # the optimizer's lr, not the schedule's
        model = parallelize(spec.model_fn(), device=CPU, precision="fp32")
        optim = spec.optimizer_fn(model.parameters())
        loss = train_step(spec, model, optim, 0, rank=0, world=1, device=CPU)
        return loss, {n: p.full_tensor().detach() for n, p in model.named_parameters()}

    start = parallelize(llama_spec(llama()).model_fn(), device=CPU, precision="fp32")
    w0 = {n: p.full_tensor().detach() for n, p in start.named_parameters()}
    loss1, w1 = after_one_step(1)
    loss4, w4 = after_one_step(4)
    assert loss4 == pytest.approx(loss1, rel=1e-5)
    moved = {n: (w0[n] - w1[n]).abs().max().item() for n in w1}
    assert min(moved.values()) > 1e-4, moved                    # every parameter moved, well above rounding
    for n in w1:
        assert torch.allclose(w0[n] - w4[n], w0[n] - w1[n], rtol=1e-3, atol=1e-3 * moved[n]), n


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_uninterrupted_equals_resumed(pg1, tmp_path, precision):
    """Preempted at step 4 of 7 (the just-in-time checkpoint), resumed: bitwise the weights of a
    run never interrupted. Warmup + cosine, 2 micro-batches: the schedule is a function of step."""
    class PreemptAt4(LocalSession):
        def report_progress(self, step, loss, perf=None):
            self.preempted = step == 4

    cfg = llama(steps=7, batch_size=4, grad_accum=2, warmup_steps=2, precision=precision,
                model={"flavor": "debug", "seq_len": 32}, checkpoint=CheckpointConfig(interval_steps=100))
    ref = run_loop(llama_spec(cfg), LocalSession(), run_storage(f"file://{tmp_path}", "ref"))
    st = run_storage(f"file://{tmp_path}", "run")
    part = run_loop(llama_spec(cfg, agree_interval_s=0), PreemptAt4(), st)
    assert part.preempted and part.steps_completed == 4
    s = LocalSession()
    full = run_loop(llama_spec(cfg), s, st)
    assert ref.precision == full.precision == precision
    assert s.resumes == [(4, 1)]
    assert full.model_sha256 == ref.model_sha256
    assert full.losses == ref.losses[4:]

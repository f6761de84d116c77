"""The optimizer (issue 49, item 5): the built-in AdamW's knobs and groups, a fresh run's first
update as a plain AdamW's, and the guard against non-finite losses and gradient norms."""

import math

import pytest
import torch
from torch import nn

from spotwise.errors import InputError
from spotwise.runtime.checkpoint.checkpointer import run_storage
from spotwise.runtime.checkpoint.layout import committed_steps
from spotwise.runtime.config import TrainConfig
from spotwise.runtime.llama_config import LlamaConfig
from spotwise.runtime.models.llama import Llama
from spotwise.runtime.optim_config import OptimizerConfig
from spotwise.runtime.training.builtin import llama_spec
from spotwise.runtime.training.loop import LocalSession, TrainSpec, run_loop
from spotwise.runtime.training.optim import AdamWFactory, Diverged, NonFiniteGuard, init_optimizer_state
from spotwise.runtime.training.saving import train_state
from spotwise.taskspec import parse_taskspec


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _grads(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def test_a_checkpointable_state_is_a_fresh_state_so_the_first_update_is_a_plain_adamws():
    """Failed before the fix: get_state_dict primed the optimizer with a zero-gradient step that
    AdamW counted, so the first real update was sqrt(1 + b2) / (1 + b1) = 0.74x a plain one."""
    a, b = _net(), _net()
    oa, ob = (torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.0) for m in (a, b))
    train_state(a, oa)                       # what the loop does on a fresh run, to look for a checkpoint
    before = [p.detach().clone() for p in b.parameters()]
    for m, o in ((a, oa), (b, ob)):
        _grads(m, 1)
        o.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    # and the plain update is lr-sized (Adam's first step moves each weight by ~lr)
    moved = max(float((p.detach() - q).abs().max()) for p, q in zip(b.parameters(), before))
    assert math.isclose(moved, 1e-2, rel_tol=1e-3)


def test_init_leaves_an_optimizer_with_state_alone():
    m = _net()
    o = torch.optim.AdamW(m.parameters(), lr=1e-2)
    _grads(m, 2)
    o.step()
    o.zero_grad()
    steps = [float(s["step"]) for s in o.state.values()]
    init_optimizer_state(o)
    assert [float(s["step"]) for s in o.state.values()] == steps == [1.0] * 4


def test_the_loops_first_step_is_a_plain_adamw_step(pg1, tmp_path):
    """Through run_loop (fp32, one rank): one step of the loop equals one plain AdamW step on the
    same batch. Failed before the fix (the loop's look for a checkpoint primed the optimizer)."""
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))

    def loss_fn(model, batch):
        return model(batch).pow(2).mean()

    spec = TrainSpec(model_fn=_net, batch_fn=lambda step, rank, world: x, loss_fn=loss_fn,
                     optimizer_fn=lambda ps: torch.optim.AdamW(ps, lr=1e-2), steps=1, precision="fp32",
                     grad_clip=None, async_save=False)
    run_loop(spec, LocalSession(), run_storage(f"file://{tmp_path}", "one"))
    ref = _net()
    o = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    loss_fn(ref, x).backward()
    o.step()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    loaded = _net(seed=99)
    spec2 = TrainSpec(model_fn=lambda: loaded, batch_fn=spec.batch_fn, loss_fn=loss_fn,
                      optimizer_fn=spec.optimizer_fn, steps=1, precision="fp32", async_save=False)
    run_loop(spec2, LocalSession(), run_storage(f"file://{tmp_path}", "one"))   # resumes at 1: loads only
    got = get_model_state_dict(loaded)
    for k, v in ref.state_dict().items():
        w = got[k].full_tensor() if hasattr(got[k], "full_tensor") else got[k]
        torch.testing.assert_close(w, v, rtol=1e-6, atol=1e-7)


def test_defaults_are_torchtitans_and_decay_skips_norms_biases_and_embeddings():
    cfg = TrainConfig()
    assert cfg.optimizer == OptimizerConfig(name="adamw", lr=None, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8,
                                            fused=None)
    model = Llama(LlamaConfig(flavor="debug"))
    opt = AdamWFactory(config=cfg.optimizer, lr=cfg.learning_rate).for_model(model)
    decayed, plain = opt.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert decayed["betas"] == (0.9, 0.95) and decayed["eps"] == 1e-8 and decayed["lr"] == 3e-4
    no_decay = {names[id(p)] for p in plain["params"]}
    assert no_decay == {"tok_embeddings.weight", "norm.weight"} | {
        f"blocks.{i}.{n}.weight" for i in range(2) for n in ("attention_norm", "ffn_norm")}
    assert "output.weight" in {names[id(p)] for p in decayed["params"]}
    # a bias is not decayed either
    lin = nn.Sequential(nn.Linear(4, 4))
    g0, g1 = AdamWFactory(config=cfg.optimizer, lr=1e-3).for_model(lin).param_groups
    assert [p.shape for p in g1["params"]] == [torch.Size([4])]


def test_optimizer_lr_is_the_learning_rate_and_the_spec_carries_the_knobs():
    cfg = TrainConfig(entrypoint="llama", model={"flavor": "debug"}, steps=10,
                      optimizer={"lr": 1e-3, "betas": [0.8, 0.9], "weight_decay": 0.0, "eps": 1e-6})
    spec = llama_spec(cfg)
    assert spec.lr_fn is not None and spec.lr_fn(10) == pytest.approx(1e-4)    # cosine to 0.1 x 1e-3
    assert isinstance(spec.optimizer_fn, AdamWFactory) and spec.optimizer_fn.lr == 1e-3
    assert spec.optimizer_fn.config.betas == (0.8, 0.9)
    assert spec.max_nonfinite_steps == 5


@pytest.mark.parametrize("training,field,says", [
    ({"optimizer": {"name": "sgd"}}, "training.optimizer.name", "adamw"),
    ({"optimizer": {"betas": [0.9, 1.0]}}, "training.optimizer.betas", "[0, 1)"),
    ({"optimizer": {"betas": [0.9]}}, "training.optimizer.betas", ""),
    ({"optimizer": {"lr": 0}}, "training.optimizer.lr", "greater than 0"),
    ({"optimizer": {"weight_decay": -0.1}}, "training.optimizer.weight_decay", "greater than or equal to 0"),
    ({"optimizer": {"eps": 0}}, "training.optimizer.eps", "greater than 0"),
    ({"optimizer": {"fused": "often"}}, "training.optimizer.fused", "bool"),
    ({"optimizer": {"momentum": 0.9}}, "training.optimizer.momentum", ""),
    ({"lr": 1e-3, "optimizer": {"lr": 1e-3}}, "training", "both set"),
    ({"max_nonfinite_steps": 0}, "training.max_nonfinite_steps", "greater than or equal to 1"),
])
def test_bad_optimizer_values_are_input_errors_naming_the_field(training, field, says):
    with pytest.raises(InputError) as ei:
        parse_taskspec({"name": "x", "training": training})
    msg = str(ei.value)
    assert field in msg and says in msg


def test_a_user_entrypoint_cannot_set_the_builtin_optimizer():
    with pytest.raises(InputError) as ei:
        parse_taskspec({"name": "x", "training": {"entrypoint": "pkg.mod:make", "optimizer": {"lr": 1e-3}}})
    assert "optimizer" in str(ei.value)


# --- the non-finite guard ---------------------------------------------------------------

def _nan_spec(bad_steps: set[int], model_fn=_net, **kw) -> TrainSpec:
    """A tiny fp32 model whose batch at each step in ``bad_steps`` holds a NaN (so its loss does)."""
    def batch(step, rank, world):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        if step in bad_steps:
            x[0, 0] = float("nan")
        return x

    return TrainSpec(model_fn=model_fn, batch_fn=batch, loss_fn=lambda m, b: m(b).pow(2).mean(),
                     optimizer_fn=lambda ps: torch.optim.AdamW(ps, lr=1e-2), precision="fp32", async_save=False,
                     **kw)


def test_a_non_finite_step_is_skipped_and_counted(pg1, tmp_path):
    """Failed before the guard: the NaN step's update made every weight NaN."""
    res = run_loop(_nan_spec({2}, steps=5, max_nonfinite_steps=3), LocalSession(),
                   run_storage(f"file://{tmp_path}", "skip"))
    assert res.skipped_steps == 1 and res.diverged is None and res.steps_completed == 5
    assert math.isnan(res.losses[2]) and all(math.isfinite(v) for i, v in enumerate(res.losses) if i != 2)
    # the skip changed nothing but that step: the weights are those of a run whose step 2 did nothing
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    m = _net()
    o = torch.optim.AdamW(m.parameters(), lr=1e-2)
    spec = _nan_spec(set(), steps=5)
    for step in range(5):
        if step != 2:
            spec.loss_fn(m, spec.batch_fn(step, 0, 1)).backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            o.step()
        o.zero_grad()
    other = _net(seed=7)
    run_loop(_nan_spec({2}, steps=5, model_fn=lambda: other), LocalSession(),
             run_storage(f"file://{tmp_path}", "skip"))          # loads the final checkpoint
    got = get_model_state_dict(other)
    for k, v in m.state_dict().items():
        w = got[k].full_tensor() if hasattr(got[k], "full_tensor") else got[k]
        torch.testing.assert_close(w, v, rtol=1e-6, atol=1e-7)


def test_n_non_finite_steps_in_a_row_stop_the_run_and_keep_its_checkpoints(pg1, tmp_path):
    """Failed before the guard: the run went on, checkpointing NaN weights over the good ones."""
    st = run_storage(f"file://{tmp_path}", "div")
    res = run_loop(_nan_spec(set(range(5, 100)), steps=20, max_nonfinite_steps=3, checkpoint_interval=2),
                   LocalSession(), st)
    assert res.diverged is not None and "3 steps in a row" in res.diverged
    assert "training.max_nonfinite_steps" in res.diverged
    assert res.steps_completed == 7 and res.skipped_steps == 3 and res.model_sha256 is None
    # steps 2 and 4 were committed; no save after the first skipped step (at 6) nor at the end
    assert committed_steps(st) == [2, 4]


def test_the_guard_counts_a_streak_and_resets_it():
    g = NonFiniteGuard(limit=2)
    one, nan = torch.tensor(1.0), torch.tensor(float("nan"))
    assert g.apply(0, one, one)
    assert not g.apply(1, nan, one) and g.streak == 1
    assert g.apply(2, one, one) and g.streak == 0 and g.skipped == 1
    assert not g.apply(3, one, torch.tensor(float("inf")))
    with pytest.raises(Diverged, match="2 steps in a row"):
        g.apply(4, nan, nan)
    assert g.skipped == 3


_TWO_RANKS = """
import json, os, torch, torch.distributed as dist
from spotwise.runtime.training.optim import NonFiniteGuard
from spotwise.runtime.training.standalone import end_process
dist.init_process_group("gloo")
rank = dist.get_rank()
g = NonFiniteGuard(limit=5)
applied = [g.apply(0, torch.tensor(1.0 + 2 * rank), torch.tensor(1.0))]
mean = [g.mean_loss]
applied.append(g.apply(1, torch.tensor(float("nan") if rank == 1 else 1.0), torch.tensor(1.0)))
dist.destroy_process_group()
# one file per rank: two ranks printing to one stdout can interleave their lines
with open(os.path.join(os.environ["OUT_DIR"], f"{rank}.json"), "w") as f:
    json.dump({"rank": rank, "applied": applied, "mean": mean}, f)
end_process(0)
"""


def test_the_guard_agrees_across_ranks_and_carries_the_loss_averaged_over_them(tmp_path):
    """Two gloo ranks with losses 1 and 3: both see 2.0 as the step's loss (what the curves show,
    not rank 0's own 1.0); a NaN on rank 1 alone skips the step on both."""
    import json
    import os
    import subprocess
    import sys

    from spotwise.utils.net import free_port

    script = tmp_path / "two.py"
    script.write_text(_TWO_RANKS)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT")}
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env["OUT_DIR"] = str(tmp_path)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                        "127.0.0.1", "--master-port", str(free_port()), str(script)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    assert [r["mean"] for r in got] == [[2.0], [2.0]]
    assert [r["applied"] for r in got] == [[True, False], [True, False]]


def test_the_loop_reports_tokens_per_second_model_flops_and_peak_memory_each_step(pg1, tmp_path):
    """The built-in Llama's spec carries its global tokens a step and FLOPs a token; the loop's
    meter turns the steps' wall time into tokens/s and model FLOPs/s (their ratio is the FLOPs
    definition's), with this process's peak memory, on every report after the first."""
    from spotwise.utils.flops import train_flops_per_token

    cfg = TrainConfig.model_validate({"entrypoint": "llama", "model": {"flavor": "debug", "seq_len": 16}, "steps": 4,
                                      "batch_size": 2, "precision": "fp32"})
    spec = llama_spec(cfg)
    lc = cfg.llama
    assert spec.tokens_per_step == 32
    assert spec.flops_per_token == train_flops_per_token(params=lc.n_params(), embedding_params=(
        0 if lc.tie_embeddings else lc.vocab_size * lc.dim), n_layers=lc.n_layers, dim=lc.dim, seq_len=16)
    seen = []

    class Session(LocalSession):
        def report_progress(self, step, loss, perf=None):
            seen.append(perf)

    run_loop(spec, Session(), run_storage(f"file://{tmp_path}", "speed"))
    assert len(seen) == 4 and "tokens_per_s" not in seen[0]
    for perf in seen[1:]:
        assert perf["tokens_per_s"] > 0 and perf["world"] == 1 and perf["memory_kind"] == "cpu_rss"
        assert math.isclose(perf["model_flops_per_s"] / perf["tokens_per_s"], spec.flops_per_token)
        assert perf["peak_memory_bytes"] > 50 * 2**20          # an interpreter with torch: tens of MB at least

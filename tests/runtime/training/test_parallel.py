"""Precision: what ``auto`` resolves to, and that the resolved precision is what the forward runs."""

import pytest
import torch
from torch import nn

from spotwise.runtime.training import parallel
from spotwise.runtime.api import ModelConfig, TrainConfig
from spotwise.runtime.training.builtin import gpt_spec
from spotwise.runtime.training.loop import TrainSpec
from spotwise.runtime.training.parallel import parallelize, resolve_precision


def test_auto_is_bf16_on_cuda_and_on_cpus_with_native_bf16(monkeypatch):
    assert resolve_precision("auto", torch.device("cuda", 0)) == "bf16"
    monkeypatch.setattr(parallel, "cpu_has_native_bf16", lambda: True)
    assert resolve_precision("auto", torch.device("cpu")) == "bf16"
    monkeypatch.setattr(parallel, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"      # forcing wins
    assert resolve_precision("fp32", torch.device("cuda", 0)) == "fp32"


def test_cpu_probe_answers_a_bool():
    assert parallel.cpu_has_native_bf16() in (True, False)


@pytest.mark.parametrize("bad", ["fp16", "BF16", ""])
def test_unknown_precision_is_refused_naming_the_allowed_values(bad):
    with pytest.raises(ValueError, match="precision must be one of auto, bf16, fp32"):
        resolve_precision(bad, torch.device("cpu"))
    with pytest.raises(ValueError, match="precision must be one of auto, bf16, fp32"):
        gpt_spec(TrainConfig.model_construct(precision=bad))   # past the config's own check


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_forward_computes_in_the_resolved_dtype(pg1, precision, dtype):
    spec: TrainSpec = gpt_spec(TrainConfig(model=ModelConfig(seq_len=8, d_model=32, n_layers=2, n_heads=2)))
    model = parallelize(spec.model_fn(), device=torch.device("cpu"), precision=precision)
    # master weights (what the optimizer updates and checkpoints hold) stay fp32 either way
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    seen = set()
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.register_forward_hook(lambda mod, inp, out: seen.add(mod.weight.dtype))
    model(torch.zeros(2, 8, dtype=torch.long))
    assert seen == {dtype}


# -- which modules become FSDP units: the spec's hook, the model's declaration, the default rule ----
class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

    def forward(self, x):
        return x + self.mlp(x)


class Declared(nn.Module):
    """Like a transformers model: its layers under another name, and the class that must stay whole."""

    _no_split_modules = ["Layer"]

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Module()
        self.inner.layers = nn.ModuleList(Layer() for _ in range(3))
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        for layer in self.inner.layers:
            x = layer(x)
        return self.head(x)


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Layer() for _ in range(2))
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _units(model: nn.Module) -> list[str]:
    """The submodules FSDP2 sharded on their own (the root aside)."""
    from torch.distributed.fsdp import FSDPModule

    return [name for name, m in model.named_modules() if name and isinstance(m, FSDPModule)]


def test_the_specs_hook_chooses_the_units(pg1):
    model = parallelize(Declared(), device=torch.device("cpu"), precision="fp32",
                        shard_blocks=lambda m: [m.inner.layers[0].mlp, m.head])
    assert _units(model) == ["inner.layers.0.mlp", "head"]
    model(torch.zeros(2, 4)).sum().backward()


def test_without_a_hook_the_models_no_split_modules_choose_them(pg1):
    model = parallelize(Declared(), device=torch.device("cpu"), precision="fp32")
    assert _units(model) == ["inner.layers.0", "inner.layers.1", "inner.layers.2"]
    model(torch.zeros(2, 4)).sum().backward()


def test_else_the_blocks_as_before_and_a_declaration_that_matches_nothing_falls_through(pg1):
    assert _units(parallelize(Blocks(), device=torch.device("cpu"), precision="fp32")) == ["blocks.0", "blocks.1"]
    model = Blocks()
    model._no_split_modules = ["LlamaDecoderLayer"]
    assert parallel.shard_units(model) == list(model.blocks)


@pytest.mark.parametrize("returns, says", [
    (lambda m: m.blocks[0], "returned Layer: allowed is a list of submodules"),
    (lambda m: [m], "item 0 is the model itself"),
    (lambda m: [nn.Linear(2, 2)], "item 0 (Linear) is not a submodule of the model"),
    (lambda m: [m.head, m.head], "lists a module twice"),
])
def test_a_bad_hook_is_the_users_error_naming_the_hook(returns, says):
    from spotwise.runtime.training.usercode import UserCodeError, guarded

    spec = guarded(TrainSpec(model_fn=Blocks, batch_fn=lambda s, r, w: None, loss_fn=lambda m, b: None,
                             optimizer_fn=lambda p: None, steps=1, shard_blocks=returns))
    with pytest.raises(UserCodeError) as e:
        parallel.shard_units(Blocks(), spec.shard_blocks)
    assert e.value.where == "TrainSpec.shard_blocks" and says in str(e.value)

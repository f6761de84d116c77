"""Precision: what ``auto`` resolves to, and that the resolved precision is what the forward runs."""

import pytest
import torch
from torch import nn

from spotwise.runtime import parallel
from spotwise.runtime.api import ModelConfig, TrainConfig
from spotwise.runtime.builtin import gpt_spec
from spotwise.runtime.loop import TrainSpec
from spotwise.runtime.parallel import parallelize, resolve_precision


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

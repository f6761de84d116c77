"""``training.deterministic`` (issue 49, item 4): what it sets, where it is on by default, the line
the runtime logs, and the CUDA RNG state in the checkpoint."""

import logging
import os

import pytest
import torch
from torch import nn

from spotwise.errors import InputError
from spotwise.runtime.checkpoint.checkpointer import rng_from_json, rng_state, rng_to_json, run_storage, set_rng_state
from spotwise.runtime.config import TrainConfig
from spotwise.runtime.training.builtin import gpt_spec
from spotwise.runtime.training.determinism import deterministic_mode, resolve_deterministic
from spotwise.runtime.training.loop import LocalSession, TrainSpec, run_loop
from spotwise.taskspec import parse_taskspec


def _spec(seen: list, **kw) -> TrainSpec:
    def loss_fn(model, batch):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return model(batch).pow(2).mean()

    return TrainSpec(model_fn=lambda: nn.Linear(4, 4), batch_fn=lambda s, r, w: torch.ones(2, 4), loss_fn=loss_fn,
                     optimizer_fn=lambda ps: torch.optim.AdamW(ps, lr=1e-3), steps=2, precision="fp32",
                     async_save=False, **kw)


def test_on_by_default_on_cpu_logged_at_start_and_undone_after(pg1, tmp_path, caplog):
    """Failed before: nothing set deterministic algorithms, and nothing said so."""
    seen: list[bool] = []
    with caplog.at_level(logging.INFO, logger="spotwise.runtime.training.loop"):
        run_loop(_spec(seen), LocalSession(), run_storage(f"file://{tmp_path}", "d"))
    assert seen == [True, True]
    assert not torch.are_deterministic_algorithms_enabled()
    assert any(r.getMessage().startswith("deterministic: on (torch deterministic algorithms")
               for r in caplog.records)


def test_off_when_asked_and_the_log_says_what_is_not_bitwise(pg1, tmp_path, caplog):
    seen: list[bool] = []
    with caplog.at_level(logging.INFO, logger="spotwise.runtime.training.loop"):
        run_loop(_spec(seen, deterministic=False), LocalSession(), run_storage(f"file://{tmp_path}", "d"))
    assert seen == [False, False]
    assert any("deterministic: off" in r.getMessage() and "not bitwise equal" in r.getMessage()
               for r in caplog.records)


def test_default_is_on_for_cpu_and_off_for_cuda():
    assert resolve_deterministic(None, torch.device("cpu")) is True
    assert resolve_deterministic(None, torch.device("cuda", 0)) is False
    assert resolve_deterministic(True, torch.device("cuda", 0)) is True
    assert resolve_deterministic(False, torch.device("cpu")) is False


def test_on_cuda_it_sets_cublas_cudnn_and_turns_off_flash_attention(monkeypatch):
    """The CUDA switches are process-wide flags and an environment variable: set and put back on
    any build of torch (no GPU needed to check them)."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert torch.backends.cuda.flash_sdp_enabled()
    with deterministic_mode(True, torch.device("cuda", 0)):
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert not torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cudnn.deterministic
    assert not torch.are_deterministic_algorithms_enabled()


def test_the_cuda_rng_state_is_saved_and_restored(monkeypatch):
    """Failed before: rng_state() held torch's CPU generator, numpy's and python's only, so a GPU
    run's CUDA generator restarted from its seed on resume. (torch.cuda stands in for a GPU here.)"""
    state = torch.arange(16, dtype=torch.uint8)
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: state.clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", restored.append)
    s = rng_state()
    assert torch.equal(s["cuda"], state)
    back = rng_from_json(rng_to_json(s))
    assert torch.equal(back["cuda"], state)
    set_rng_state(back)
    assert len(restored) == 1 and torch.equal(restored[0], state)


def test_a_cpu_checkpoint_has_no_cuda_state_and_loads_as_before():
    s = rng_from_json(rng_to_json(rng_state()))
    assert "cuda" not in s


def test_the_key_reaches_the_spec_and_bad_values_name_the_field():
    assert gpt_spec(TrainConfig(deterministic=True)).deterministic is True
    assert gpt_spec(TrainConfig()).deterministic is None
    with pytest.raises(InputError) as ei:
        parse_taskspec({"name": "x", "training": {"deterministic": "sometimes"}})
    assert "training.deterministic" in str(ei.value)
    with pytest.raises(InputError) as ei:
        parse_taskspec({"name": "x", "training": {"train_func": "pkg.mod:train", "deterministic": True}})
    assert "deterministic" in str(ei.value)

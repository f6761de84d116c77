"""Async checkpoints in-process (one gloo rank): staging isolates the copy from training, async
and sync runs give bitwise-identical checkpoints and weights, JIT saves wait for the in-flight one."""

import json

import torch

from spotwise.runtime.api import CheckpointConfig, ModelConfig, TrainConfig
from spotwise.runtime.checkpoint.async_save import AsyncCheckpointer
from spotwise.runtime.training.builtin import gpt_spec
from spotwise.runtime.checkpoint.checkpointer import COMMIT_MARKER, Checkpointer, committed_steps, run_storage, step_dir
from spotwise.runtime.training.loop import LocalSession, run_loop, train_state
from spotwise.runtime.training.parallel import parallelize
from spotwise.runtime.checkpoint.staging import HostStager

TINY = ModelConfig(seq_len=16, d_model=32, n_layers=2, n_heads=2)


def cfg(steps=6, interval=2):
    return TrainConfig(model=TINY, steps=steps, batch_size=4, checkpoint=CheckpointConfig(interval_steps=interval, keep_last=2))


def test_staged_copy_is_independent_of_live_dtensors(pg1):
    from torch.distributed.tensor import DTensor

    spec = gpt_spec(cfg())
    model = parallelize(spec.model_fn(), device=torch.device("cpu"))
    optim = spec.optimizer_fn(model.parameters())
    state = train_state(model, optim)
    stager = HostStager()
    staged = stager.stage(state)
    name = next(iter(staged["model"]))
    assert isinstance(staged["model"][name], DTensor)
    assert staged["model"][name].shape == state["model"][name].shape
    before = staged["model"][name].to_local().clone()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert torch.equal(staged["model"][name].to_local(), before)
    assert stager.bytes_staged >= sum(p.to_local().numel() * 4 for p in model.parameters())
    bufs = dict(stager._buffers)
    stager.stage(train_state(model, optim))
    assert all(stager._buffers[k] is v for k, v in bufs.items())   # buffers reused, not reallocated


def test_async_and_sync_runs_write_identical_checkpoints(pg1, tmp_path):
    a, s = LocalSession(), LocalSession()
    ra = run_loop(gpt_spec(cfg(steps=7), async_save=True), a, run_storage(f"file://{tmp_path}", "a"))
    rs = run_loop(gpt_spec(cfg(steps=7), async_save=False), s, run_storage(f"file://{tmp_path}", "s"))
    assert ra.model_sha256 == rs.model_sha256
    assert [(c.step, c.kind) for c in a.checkpoints] == [(2, "periodic"), (4, "periodic"), (6, "periodic"), (7, "final")]
    assert [(c.step, c.kind) for c in a.checkpoints] == [(c.step, c.kind) for c in s.checkpoints]
    assert len(ra.save_stalls) == 3
    for step in (6, 7):
        da = tmp_path / "a" / step_dir(step)
        ds = tmp_path / "s" / step_dir(step)
        assert (da / "__0_0.distcp").read_bytes() == (ds / "__0_0.distcp").read_bytes()
        assert json.loads((da / COMMIT_MARKER).read_text())["step"] == step


def test_resume_from_async_checkpoint_is_exact(pg1, tmp_path):
    st = run_storage(f"file://{tmp_path}", "r")
    run_loop(gpt_spec(cfg(steps=5, interval=2)), LocalSession(), st)     # async 2, 4 then final 5
    sess = LocalSession()
    done = run_loop(gpt_spec(cfg(steps=9, interval=2)), sess, st)
    ref = run_loop(gpt_spec(cfg(steps=9, interval=2), async_save=False), LocalSession(),
                   run_storage(f"file://{tmp_path}", "ref"))
    assert sess.resumes == [(5, 1)] and done.model_sha256 == ref.model_sha256


def test_sync_save_waits_for_in_flight_async_and_commits_in_order(pg1, tmp_path):
    st = run_storage(f"file://{tmp_path}", "o")
    order = []
    saver = AsyncCheckpointer(st, keep_last=3, on_commit=lambda i: order.append((i.step, i.kind)))
    try:
        saver.save_async(lambda: {"model": {"w": torch.ones(1 << 20)}}, step=1)
        info = saver.save_sync({"model": {"w": torch.zeros(1 << 20)}}, step=2, kind="preemption")
        assert not saver.in_flight()
    finally:
        saver.close()
    assert order == [(1, "periodic"), (2, "preemption")] and info.step == 2
    assert committed_steps(st) == [1, 2]
    out = {"model": {"w": torch.full((1 << 20,), 7.0)}}
    assert Checkpointer(st).load_latest(out).kind == "preemption" and float(out["model"]["w"].sum()) == 0.0

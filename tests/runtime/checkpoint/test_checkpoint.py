"""Checkpoint protocol and exact resume, in-process (one gloo rank): fast."""

import json

import pytest
import torch

from spotwise.runtime.api import CheckpointConfig, ModelConfig, TrainConfig
from spotwise.runtime.training.builtin import gpt_spec
from spotwise.runtime.checkpoint.checkpointer import (COMMIT_MARKER, Checkpointer, committed_steps, latest_committed,
                                         run_storage, step_dir)
from spotwise.runtime.training.loop import LocalSession, run_loop
from spotwise.runtime.storage.base import open_storage

TINY = ModelConfig(seq_len=16, d_model=32, n_layers=2, n_heads=2)


def cfg(steps=6, interval=2, keep=2, precision="auto"):
    return TrainConfig(model=TINY, steps=steps, batch_size=4, checkpoint=CheckpointConfig(interval_steps=interval, keep_last=keep),
                       precision=precision)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_uninterrupted_equals_resumed(pg1, tmp_path, precision):
    ref = run_loop(gpt_spec(cfg(steps=7, precision=precision)), LocalSession(), run_storage(f"file://{tmp_path}", "ref"))
    part = run_loop(gpt_spec(cfg(steps=4, precision=precision)), LocalSession(), run_storage(f"file://{tmp_path}", "run"))
    s = LocalSession()
    full = run_loop(gpt_spec(cfg(steps=7, precision=precision)), s, run_storage(f"file://{tmp_path}", "run"))
    assert ref.precision == part.precision == full.precision == precision
    assert s.resumes == [(4, 1)]
    assert part.model_sha256 != ref.model_sha256
    assert full.model_sha256 == ref.model_sha256
    assert full.losses == ref.losses[4:]


def test_keep_last_k_and_marker_written_last(pg1, tmp_path):
    st = run_storage(f"file://{tmp_path}", "k")
    s = LocalSession()
    run_loop(gpt_spec(cfg(steps=9, interval=2, keep=3)), s, st)
    assert [c.step for c in s.checkpoints] == [2, 4, 6, 8, 9]
    assert committed_steps(st) == [6, 8, 9]
    for step in (6, 8, 9):
        marker = st.local_path(f"{step_dir(step)}/{COMMIT_MARKER}")
        files = [p for p in marker.parent.rglob("*") if p.is_file()]
        assert len(files) >= 4   # .metadata, shard, rng, train_state, marker
        assert max(p.stat().st_mtime_ns for p in files) == marker.stat().st_mtime_ns
        assert json.loads(marker.read_text())["step"] == step


def test_torn_checkpoint_is_ignored_and_removed(pg1, tmp_path):
    st = run_storage(f"file://{tmp_path}", "torn")
    run_loop(gpt_spec(cfg(steps=4, interval=2)), LocalSession(), st)
    # a save of step 6 died before its marker: shard files but no COMMITTED
    torn = st.local_path(step_dir(6))
    torn.mkdir(parents=True)
    (torn / "__0_0.distcp").write_bytes(b"garbage")
    (torn / ".metadata").write_bytes(b"garbage")
    assert latest_committed(st).step == 4
    s = LocalSession()
    res = run_loop(gpt_spec(cfg(steps=6, interval=2)), s, st)
    assert s.resumes == [(4, 1)] and res.steps_completed == 6
    ref = run_loop(gpt_spec(cfg(steps=6, interval=2)), LocalSession(), run_storage(f"file://{tmp_path}", "ref"))
    assert res.model_sha256 == ref.model_sha256


def test_stop_request_saves_stop_checkpoint(pg1, tmp_path):
    class StopAt3(LocalSession):
        def report_progress(self, step, loss, perf=None):
            if step == 3:
                self.stop_reason = "budget"

    s = StopAt3()
    res = run_loop(gpt_spec(cfg(steps=10, interval=5), agree_interval_s=0), s,
                   run_storage(f"file://{tmp_path}", "stop"))
    assert res.stopped == "budget" and res.steps_completed == 3
    assert [(c.step, c.kind) for c in s.checkpoints] == [(3, "stop")]


def test_preemption_flag_saves_jit_checkpoint_then_resume_is_exact(pg1, tmp_path):
    class PreemptAt5(LocalSession):
        def report_progress(self, step, loss, perf=None):
            self.preempted = step == 5

    st = run_storage(f"file://{tmp_path}", "pre")
    s = PreemptAt5()
    res = run_loop(gpt_spec(cfg(steps=8, interval=100), agree_interval_s=0), s, st)
    assert res.preempted and res.steps_completed == 5
    assert [(c.step, c.kind) for c in s.checkpoints] == [(5, "preemption")]
    done = run_loop(gpt_spec(cfg(steps=8, interval=100)), LocalSession(), st)
    ref = run_loop(gpt_spec(cfg(steps=8, interval=100)), LocalSession(), run_storage(f"file://{tmp_path}", "ref"))
    assert done.resumed_from == 5 and done.model_sha256 == ref.model_sha256


def test_keep_last_must_be_at_least_two():
    with pytest.raises(ValueError, match="keep_last"):
        gpt_spec(cfg(keep=1))


def test_checkpointer_roundtrip_plain_tensors(pg1, tmp_path):
    st = open_storage(str(tmp_path))
    ck = Checkpointer(st, keep_last=2)
    ck.save({"w": torch.arange(4.0)}, step=1, kind="periodic")
    out = {"w": torch.zeros(4)}
    info = ck.load_latest(out)
    assert info.step == 1 and info.kind == "periodic" and torch.equal(out["w"], torch.arange(4.0))


def test_agreement_schedule_is_set_by_rank0_step_time(pg1, tmp_path):
    """With agree_interval_s > 0 the stop is seen at an agreement step, at most ~interval later."""
    class StopAt2(LocalSession):
        def report_progress(self, step, loss, perf=None):
            if step == 2:
                self.stop_reason = "cancel"

    s = StopAt2()
    res = run_loop(gpt_spec(cfg(steps=400, interval=1000), agree_interval_s=1e-9), s,
                   run_storage(f"file://{tmp_path}", "a"))
    assert res.stopped == "cancel" and res.steps_completed == 2      # tiny interval: every step
    s = StopAt2()
    res = run_loop(gpt_spec(cfg(steps=40, interval=1000), agree_interval_s=3600), s,
                   run_storage(f"file://{tmp_path}", "b"))
    assert res.stopped is None and res.steps_completed == 40         # next agreement after 1000 steps


def test_steps_run_on_a_frozen_heap_and_the_freeze_is_undone(pg1, tmp_path):
    """The loop keeps full collections off the pre-training heap (gc.freeze) while it steps, and
    hands the process back as it found it; a caller's own freeze is left in place."""
    import gc

    spec = gpt_spec(cfg(steps=3))
    seen = []
    batch_fn = spec.batch_fn
    spec.batch_fn = lambda step, rank, world: (seen.append(gc.get_freeze_count()), batch_fn(step, rank, world))[1]
    assert gc.get_freeze_count() == 0
    res = run_loop(spec, LocalSession(), run_storage(f"file://{tmp_path}", "gc"))
    assert res.steps_completed == 3 and len(seen) == 3 and min(seen) > 0
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        run_loop(gpt_spec(cfg(steps=2)), LocalSession(), run_storage(f"file://{tmp_path}", "gc2"))
        assert gc.get_freeze_count() >= before
    finally:
        gc.unfreeze()


class _Boom:
    """A pickle that would run code when unpickled (writes a file): what a hostile store holds."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_rng_state_round_trips_through_json_exactly():
    import random

    import numpy as np

    from spotwise.runtime.checkpoint.checkpointer import rng_from_json, rng_state, rng_to_json, set_rng_state

    random.gauss(0, 1)          # a cached gauss value in python's state
    np.random.standard_normal() # and numpy's
    saved = rng_state()
    expect = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(rng_from_json(rng_to_json(saved)))
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expect[0], got[0]) and (expect[1] == got[1]).all() and expect[2] == got[2]


def test_checkpoint_files_hold_no_pickle_spotwise_would_unpickle(pg1, tmp_path):
    st = open_storage(str(tmp_path))
    Checkpointer(st, keep_last=2).save({"w": torch.arange(4.0), "lr": 0.5}, step=1, kind="periodic")
    rng = st.local_path(f"{step_dir(1)}/rng/rank_0.json")
    assert json.loads(rng.read_text())["format"] == 1
    assert not list(st.local_path(step_dir(1)).rglob("*.pt"))
    out = {"w": torch.zeros(4), "lr": 0.0}
    Checkpointer(st, keep_last=2).load_latest(out)
    assert out["lr"] == 0.5 and torch.equal(out["w"], torch.arange(4.0))


def test_crafted_metadata_is_refused_and_never_runs(pg1, tmp_path):
    import pickle

    from spotwise.runtime.checkpoint.checkpointer import UnsafeCheckpoint

    st = open_storage(str(tmp_path / "store"))
    Checkpointer(st, keep_last=2).save({"w": torch.arange(4.0)}, step=1, kind="periodic")
    pwned = tmp_path / "pwned"
    st.local_path(f"{step_dir(1)}/.metadata").write_bytes(pickle.dumps(_Boom(str(pwned))))
    with pytest.raises(UnsafeCheckpoint, match="io.open"):
        Checkpointer(st, keep_last=2).load_latest({"w": torch.zeros(4)})
    assert not pwned.exists()


def test_crafted_non_tensor_item_is_refused_and_never_runs(tmp_path):
    """DCP stores non-tensor values (an optimizer's lr) as torch.save'd bytes and loads them with
    the planner's ``load_bytes``; spotwise's planner refuses a hostile one instead of running it."""
    import io as _io
    import pickle

    from spotwise.runtime.checkpoint.checkpointer import _safe_planner

    pwned = tmp_path / "pwned"
    bad = _io.BytesIO()
    torch.save(_Boom(str(pwned)), bad)
    bad.seek(0)
    with pytest.raises(pickle.UnpicklingError):
        _safe_planner().load_bytes(None, bad)
    assert not pwned.exists()

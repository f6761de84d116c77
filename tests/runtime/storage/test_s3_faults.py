"""Object-store faults between the checkpointer and a real emulator (S3 on moto_server, GCS on
gcp-storage-emulator, Azure Blob on Azurite; each test once per store): a fault-injecting proxy on loopback returns 500s,
503s, 429s, resets connections and slows responses. Saves and loads retry with backoff and
succeed; a save that finally fails is never committed, never loaded, and never destroys the
previous good checkpoint."""

import pytest
import torch

from spotwise.runtime.api import CheckpointConfig, ModelConfig, TrainConfig
from spotwise.runtime.checkpoint.async_save import AsyncCheckpointer
from spotwise.runtime.training.builtin import gpt_spec
from spotwise.runtime.checkpoint.checkpointer import (COMMIT_MARKER, Checkpointer, SaveFailed, committed_steps,
                                         latest_committed, run_storage, step_dir)
from spotwise.runtime.training.loop import LocalSession, run_loop
from spotwise.runtime.storage.base import RetryPolicy

from ..fakes import EnvPatch, FaultProxy
from ..stores import open_store

TINY = ModelConfig(seq_len=16, d_model=32, n_layers=2, n_heads=2)
FAST_RETRY = RetryPolicy(attempts=3, base_s=0.01, cap_s=0.05)


def cfg(steps):
    return TrainConfig(model=TINY, steps=steps, batch_size=4, checkpoint=CheckpointConfig(interval_steps=2, keep_last=2))


@pytest.fixture
def proxy(objstore):
    p = FaultProxy(objstore.endpoint)
    yield p
    p.close()


@pytest.fixture
def bucket(objstore, request):
    return objstore.make_bucket(f"faults-{request.node.originalname.replace('_', '-')[:40].lower()}-{objstore.scheme}")


def test_training_saves_and_resumes_through_faults_exactly(pg1, objstore, proxy, bucket, tmp_path):
    proxy.fault(objstore, "503", op="upload", every=3, times=None)       # throttled: every 3rd upload
    proxy.fault(objstore, "reset", op="upload", key="rng", times=2)      # connection reset mid-save
    proxy.fault(objstore, "reset_after", op="upload", key="COMMITTED", times=1)   # stored, answer lost
    proxy.fault(objstore, "500", op="read", times=3)                     # loads and listings
    proxy.fault(objstore, "429", op="list", times=2)
    proxy.fault(objstore, "slow", op="upload", key=".metadata", times=2, delay_s=0.3)
    with EnvPatch(objstore.env_via(proxy.endpoint)):
        st = run_storage(f"{objstore.scheme}://{bucket}/runs", "faulty")
        first = run_loop(gpt_spec(cfg(4)), LocalSession(), st)
        s = LocalSession()
        done = run_loop(gpt_spec(cfg(7)), s, st)
        assert committed_steps(st) == [6, 7]
    ref = run_loop(gpt_spec(cfg(7)), LocalSession(), run_storage(f"file://{tmp_path}", "ref"))
    assert first.steps_completed == 4 and s.resumes == [(4, 1)]
    assert done.model_sha256 == ref.model_sha256
    for fault in ("503", "reset", "reset_after", "500", "429", "slow"):
        assert proxy.injected.get(fault, 0) >= 1, (fault, proxy.injected)


def _state(v: float):
    return {"model": {"w": torch.full((64,), v)}, "optim": {"step": torch.tensor(v)}}


def test_failed_save_keeps_previous_checkpoint_and_is_never_loaded(pg1, objstore, proxy, bucket):
    with EnvPatch(objstore.env_via(proxy.endpoint)):
        st = open_store(objstore, bucket, "run", FAST_RETRY)
        ck = Checkpointer(st, keep_last=2)
        ck.save(_state(1.0), step=2, kind="periodic")
        ck.save(_state(2.0), step=4, kind="periodic")
        # step 6: every upload of its files fails, forever
        proxy.fault(objstore, "500", op="upload", key=step_dir(6), times=None)
        with pytest.raises(SaveFailed, match="step 6"):
            ck.save(_state(3.0), step=6, kind="periodic")
        proxy.clear()
        # step 8: the shards land, but the commit marker never does
        proxy.fault(objstore, "503", op="upload", key=f"{step_dir(8)}/{COMMIT_MARKER}", times=None)
        with pytest.raises(SaveFailed, match="marker"):
            ck.save(_state(4.0), step=8, kind="periodic")
        proxy.clear()
        assert committed_steps(st) == [2, 4]          # nothing pruned by the failed saves
        assert latest_committed(st).step == 4
        assert any(k.startswith(step_dir(8)) for k in st.list("checkpoints/"))   # torn: no marker
        out = _state(0.0)
        info = Checkpointer(st).load_latest(out)
        assert info.step == 4 and torch.equal(out["model"]["w"], torch.full((64,), 2.0))
        assert not any(k.startswith(step_dir(8)) for k in st.list("checkpoints/"))   # torn one removed
        assert all(k.startswith((step_dir(2), step_dir(4))) for k in st.list("checkpoints/"))


def test_async_save_failure_is_reported_and_previous_stays(pg1, objstore, proxy, bucket):
    with EnvPatch(objstore.env_via(proxy.endpoint)):
        st = open_store(objstore, bucket, "run", FAST_RETRY)
        committed = []
        saver = AsyncCheckpointer(st, keep_last=2, on_commit=committed.append)
        try:
            saver.save_async(lambda: _state(1.0), step=2)
            assert saver.wait().step == 2
            proxy.fault(objstore, "reset", op="upload", key=step_dir(4), times=None)
            saver.save_async(lambda: _state(2.0), step=4)
            assert saver.wait().step == 2 and len(saver.failures) == 1
            proxy.clear()
            saver.save_async(lambda: _state(3.0), step=6)
            assert saver.wait().step == 6
        finally:
            saver.close()
        assert [c.step for c in committed] == [2, 6]
        assert committed_steps(st) == [2, 6]
    assert proxy.injected["reset"] >= 3


def test_load_retries_transient_errors(pg1, objstore, proxy, bucket):
    with EnvPatch(objstore.env_via(proxy.endpoint)):
        st = open_store(objstore, bucket, "run", RetryPolicy(attempts=6, base_s=0.01, cap_s=0.05))
        Checkpointer(st).save(_state(5.0), step=3, kind="final")
        proxy.fault(objstore, "500", op="read", times=4)
        proxy.fault(objstore, "reset", op="download", key="distcp", times=3)
        out = _state(0.0)
        assert Checkpointer(st).load_latest(out).step == 3
        assert torch.equal(out["model"]["w"], torch.full((64,), 5.0))
    assert proxy.injected["500"] == 4 and proxy.injected["reset"] == 3

"""Checkpoints to object storage through the real client libraries against loopback emulators:
``s3://`` (boto3, moto_server), ``gs://`` (google-cloud-storage, gcp-storage-emulator) and ``az://``
(azure-storage-blob, Azurite), each test once per store (the ``objstore`` fixture)."""

import pytest

from spotwise.runtime.api import CheckpointConfig, ModelConfig, TrainConfig
from spotwise.runtime.training.builtin import gpt_spec
from spotwise.runtime.checkpoint.checkpointer import committed_steps, run_storage
from spotwise.runtime.training.loop import LocalSession, run_loop

from ..fakes import EnvPatch

TINY = ModelConfig(seq_len=16, d_model=32, n_layers=2, n_heads=2)


def cfg(steps):
    return TrainConfig(model=TINY, steps=steps, batch_size=4, checkpoint=CheckpointConfig(interval_steps=2, keep_last=2))


@pytest.fixture
def bucket(objstore, request):
    return objstore.make_bucket("ckpt-" + request.node.callspec.id)


def test_checkpoint_resume_is_exact(pg1, objstore, bucket, tmp_path):
    scheme = objstore.scheme
    with EnvPatch(objstore.env()):
        st = run_storage(f"{scheme}://{bucket}/runs", "objrun")
        first = run_loop(gpt_spec(cfg(4)), LocalSession(), st)
        assert first.final_checkpoint == f"{scheme}://{bucket}/runs/objrun/checkpoints/step_000000004"
        s = LocalSession()
        done = run_loop(gpt_spec(cfg(7)), s, st)
    keys = objstore.keys(bucket)
    ref = run_loop(gpt_spec(cfg(7)), LocalSession(), run_storage(f"file://{tmp_path}", "ref"))
    assert s.resumes == [(4, 1)]
    assert done.model_sha256 == ref.model_sha256
    assert any(k.endswith("step_000000007/COMMITTED") for k in keys)
    assert any(k.endswith("step_000000007/__0_0.distcp") for k in keys)
    assert not any("step_000000002/" in k or "step_000000004/" in k for k in keys)   # pruned in the store
    with EnvPatch(objstore.env()):
        assert committed_steps(st) == [6, 7]    # keep_last=2 pruned 2 and 4

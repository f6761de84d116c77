"""Checkpoints to S3 through boto3 against a real moto_server subprocess on loopback."""

import boto3
import pytest

from spotwise.runtime.api import CheckpointConfig, ModelConfig, TrainConfig
from spotwise.runtime.builtin import gpt_spec
from spotwise.runtime.checkpoint import committed_steps, run_storage
from spotwise.runtime.loop import LocalSession, run_loop

from .fakes import EnvPatch

TINY = ModelConfig(seq_len=16, d_model=32, n_layers=2, n_heads=2)


def cfg(steps):
    return TrainConfig(model=TINY, steps=steps, batch_size=4, checkpoint=CheckpointConfig(interval_steps=2, keep_last=2))


@pytest.fixture
def bucket(moto):
    with EnvPatch(moto.env()):
        boto3.client("s3").create_bucket(Bucket="ckpt")
        yield "ckpt"


def test_s3_checkpoint_resume_is_exact(pg1, bucket, moto, tmp_path):
    with EnvPatch(moto.env()):
        st = run_storage(f"s3://{bucket}/runs", "s3run")
        first = run_loop(gpt_spec(cfg(4)), LocalSession(), st)
        assert first.final_checkpoint == f"s3://{bucket}/runs/s3run/checkpoints/step_000000004"
        s = LocalSession()
        done = run_loop(gpt_spec(cfg(7)), s, st)
        keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]]
    ref = run_loop(gpt_spec(cfg(7)), LocalSession(), run_storage(f"file://{tmp_path}", "ref"))
    assert s.resumes == [(4, 1)]
    assert done.model_sha256 == ref.model_sha256
    assert any(k.endswith("step_000000007/COMMITTED") for k in keys)
    assert any(k.endswith("step_000000007/__0_0.distcp") for k in keys)
    with EnvPatch(moto.env()):
        assert committed_steps(st) == [6, 7]    # keep_last=2 pruned 2 and 4

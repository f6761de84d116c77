"""The training config is owned once (runtime.config) and is the task file's section."""

import pytest
from pydantic import ValidationError

from spotwise.runtime.api import CheckpointConfig, ModelConfig, TrainConfig, TrainJob
from spotwise.runtime.node.job import decode_job, encode_job
from spotwise.taskspec import parse_taskspec


def test_the_task_files_training_section_is_the_runtimes_config():
    spec = parse_taskspec({"name": "x", "training": {"steps": 7, "model": {"d_model": 64, "n_heads": 2},
                                                     "checkpoint": {"interval_steps": 3}}})
    assert type(spec.training) is TrainConfig
    assert spec.training.model == ModelConfig(d_model=64, n_heads=2)
    assert spec.training.checkpoint.interval_steps == 3 and spec.training.checkpoint.keep_last == 2


def test_a_job_round_trips_through_the_wire_format():
    cfg = TrainConfig(model=ModelConfig(seq_len=16, d_model=32, n_layers=2, n_heads=2), steps=5, lr=1e-3,
                      precision="fp32", checkpoint=CheckpointConfig(storage="s3://my-bucket/ck", interval_steps=2,
                                                                    keep_last=3))
    job = TrainJob(run_name="r", storage_uri="file:///tmp/r", config=cfg, env={"A": "1"}, notice_window_s=30.0)
    back, port, host, gpu = decode_job(encode_job(job, control_port=8123, control_host="10.0.0.2", use_gpu=False))
    assert back == job and (port, host, gpu) == (8123, "10.0.0.2", False)


@pytest.mark.parametrize("key", ["vocab_size", "mlp_ratio"])
def test_fixed_model_constants_are_not_keys(key):
    assert ModelConfig().model_dump().keys() == {"d_model", "n_layers", "n_heads", "seq_len"}
    with pytest.raises(ValidationError, match=key):
        ModelConfig(**{key: 8})


def test_the_config_is_validated_where_it_is_built_not_only_in_a_task_file():
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(d_model=64, n_heads=3)
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointConfig(keep_last=1)
    with pytest.raises(ValueError, match="lr"):
        TrainConfig(lr=float("nan"))

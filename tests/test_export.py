"""``spotwise export JOB DIR``: a finished llama run's weights in the Hugging Face layout through the
CLI, and a clear exit 2 for what has no such format (the tiny GPT) or does not exist."""

import json
import os
import subprocess
import sys

import pytest
import torch

from spotwise.engine.state import db

transformers = pytest.importorskip("transformers")


def add_job(job_id, training, ckpt):
    spec = {"name": job_id, "training": {**training, "checkpoint": {"storage": f"file://{ckpt}"}}}
    with db.session() as s:
        s.add(db.Job(id=job_id, name=job_id, status="succeeded", cloud="local", cluster_id="swx", spec=spec,
                     budget_usd=1.0, created_at=1.0, started_at=2.0))
        s.commit()


def cli(*args, home, url):
    env = dict(os.environ, SPOTWISE_HOME=str(home), SPOTWISE_DATABASE_URL=url)
    return subprocess.run([sys.executable, "-m", "spotwise.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_export_a_llama_run_and_refuse_a_tiny_gpt_one(sqlite_db, home, tmp_path, monkeypatch):
    from spotwise.runtime.checkpoint.checkpointer import run_storage
    from spotwise.runtime.config import TrainConfig
    from spotwise.runtime.training.builtin import llama_spec
    from spotwise.runtime.training.loop import LocalSession, run_loop

    import socket

    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    ckpt = tmp_path / "ckpt"
    training = {"entrypoint": "llama", "model": {"flavor": "debug", "seq_len": 16, "tie_embeddings": True},
                "steps": 2, "batch_size": 1, "precision": "fp32"}
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        run_loop(llama_spec(TrainConfig.model_validate(training)), LocalSession(), run_storage(f"file://{ckpt}", "ll"))
    finally:
        dist.destroy_process_group()
    add_job("ll", training, ckpt)
    add_job("gpt", {"steps": 2}, ckpt)

    out = cli("export", "ll", str(tmp_path / "hf"), "--dtype", "fp32", "--format", "json", home=home, url=sqlite_db)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["step"] == 2 and got["files"] == ["config.json", "model.safetensors", "sha256.json"]
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert model.config.hidden_size == 128 and model.config.tie_word_embeddings

    r = cli("export", "gpt", str(tmp_path / "x"), home=home, url=sqlite_db)
    assert r.returncode == 2 and "has no standard format" in r.stdout + r.stderr, (r.stdout, r.stderr[-1500:])
    assert "Traceback" not in r.stderr

    from spotwise.commands.export import run_export
    from spotwise.errors import InputError

    for job, kw, field, needle in (("nope", {}, "JOB_ID", "the id of a job"), ("ll", {"dtype": "int8"}, "--dtype", "bf16"),
                                   ("ll", {"step": 5}, "--step", "step 5 has no committed checkpoint; committed: 2")):
        with pytest.raises(InputError) as e:
            run_export(job, str(tmp_path / "x"), **kw)
        assert e.value.exit_code == 2 and e.value.problems[0].field == field and needle in str(e.value.problems[0])

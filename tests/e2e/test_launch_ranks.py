"""Eight GPUs a node on CPU, end to end (issue 49, item 1): ``local.emulated_gpus`` 4 makes each of
the local cloud's two worker nodes declare 4 GPUs to Ray, so the plan sees 8 ranks and the run
trains the built-in Llama (``debug``) on 2 nodes x 4 CPU ranks over gloo; preempted by the local
market's notice, it resumes on 8 ranks and ends bitwise in the weights of the same 8-rank training
run uninterrupted without Ray (torchrun). Slow: a whole local launch."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from e2e.conftest import Launch
from spotwise.utils.net import free_port

pytestmark = pytest.mark.slow

STEPS = 30
TRAINING = {"entrypoint": "llama", "model": {"flavor": "debug", "seq_len": 32}, "steps": STEPS, "batch_size": 8,
            "precision": "fp32", "checkpoint": {"interval_steps": 10, "keep_last": 2}}

# the same training without Ray: 8 torchrun ranks on this machine
_REFERENCE = """
import json, os, sys
import torch.distributed as dist
from spotwise.runtime.training.builtin import llama_spec
from spotwise.runtime.checkpoint.checkpointer import run_storage
from spotwise.runtime.config import TrainConfig
from spotwise.runtime.training.loop import LocalSession, run_loop

dist.init_process_group("gloo")
res = run_loop(llama_spec(TrainConfig.model_validate_json(sys.argv[2])), LocalSession(), run_storage(sys.argv[1], "ref"))
dist.destroy_process_group()
if os.environ["RANK"] == "0":
    print(json.dumps({"steps": res.steps_completed, "sha": res.model_sha256, "world": int(os.environ["WORLD_SIZE"])}))
"""


def reference(tmp_path: Path) -> dict:
    from spotwise.runtime.config import TrainConfig

    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "reference.py").write_text(_REFERENCE)
    cfg = TrainConfig.model_validate({**TRAINING, "checkpoint": {**TRAINING["checkpoint"],
                                                                  "storage": f"file://{tmp_path}"}})
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT")}
    env["GLOO_SOCKET_IFNAME"] = "lo"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "8", "--master-addr",
                        "127.0.0.1", "--master-port", str(free_port()), str(tmp_path / "reference.py"),
                        f"file://{tmp_path}", cfg.model_dump_json()], capture_output=True, text=True, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("{")][-1])


def test_two_nodes_of_four_emulated_gpus_preempted_resume_bitwise_on_eight_ranks(tmp_path):
    ref = reference(tmp_path / "ref")
    assert ref["steps"] == STEPS and ref["world"] == 8
    task = tmp_path / "task.yaml"
    task.write_text(yaml.safe_dump({"name": "ranks", "training": TRAINING, "budget_usd": 1.0,
                                    "resources": {"accelerators": "cpu:1", "nodes": 2, "clouds": ["local"],
                                                  "market": "spot"}}))
    env = dict(os.environ, SPOTWISE_LOCAL_EMULATED_GPUS="4")
    run = Launch(tmp_path / "run", task, "--preempt-at", "3", "--notice-seconds", "5",
                 "--storage", f"file://{tmp_path}/ckpt", env=env)
    rep = run.report(timeout=1200)
    assert rep["status"] == "succeeded", rep
    assert rep["steps_completed"] == rep["steps_total"] == STEPS
    assert rep["preemptions"] == 1 and rep["resumes"] == 1 and rep["lost_steps"] == 0
    assert [r["world_size"] for r in rep["resume_points"]] == [8]            # resumed on 8 ranks again
    # the first group's 8 ranks, 4 on each worker node, each wrote its share of the notice's checkpoint
    with sqlite3.connect(tmp_path / "run" / "spotwise.db") as db:
        jit = db.execute("SELECT rank, node FROM job_logs WHERE line LIKE '%preemption checkpoint committed%'").fetchall()
    assert sorted(int(r) for r, _ in jit) == list(range(8)), jit
    assert sorted(Counter(node for _, node in jit).values()) == [4, 4], jit
    assert rep["model_sha256"] == ref["sha"], "weights differ from the uninterrupted 8-rank run"

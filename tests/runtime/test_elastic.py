"""Elastic fit(min_workers=1) under Ray: 2 ranks -> a node is lost -> continues on 1 rank (resharded
from the checkpoint) -> a node comes back -> Ray Train grows the group to 2 ranks again."""

import math
import threading
import uuid

import pytest

from spotwise.runtime.api import CheckpointConfig, ModelConfig, TrainConfig, TrainJob
from spotwise.runtime.checkpoint import latest_committed, run_storage
from spotwise.runtime.trainer import fit

from .test_ray import WORKER, _control_on_head, _wait

pytestmark = pytest.mark.slow

TINY = ModelConfig(seq_len=32, d_model=64, n_layers=2, n_heads=2)


def test_elastic_2_to_1_to_2(ray_cluster, tmp_path):
    import ray

    name = f"elastic-{uuid.uuid4().hex[:8]}"
    actor = _control_on_head(name)
    snap = lambda: ray.get(actor.snapshot.remote())
    job = TrainJob(run_name=name, storage_uri=f"file://{tmp_path}",
                   config=TrainConfig(model=TINY, steps=100_000, batch_size=4, checkpoint=CheckpointConfig(interval_steps=3)),
                   num_workers=2, resources_per_worker=WORKER, max_failures=3, control_run_name=name)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fit(job, min_workers=1, resize_monitor_s=2.0)),
                         daemon=True)
    t.start()
    _wait(lambda: len([e for e in snap()["events"] if e["event"] == "worker_started"]) == 2, 120, "2 workers")
    # wait on committed checkpoints, not on the step: the actor's step is the maximum ever heard,
    # so it says nothing about what the group that runs *now* has saved
    _wait(lambda: snap()["checkpoints"], 120, "a checkpoint on 2 ranks")
    by_rank = {e["rank"]: e["node_id"] for e in snap()["events"] if e["event"] == "worker_started"}
    victim = next(i for i in ray_cluster.nodes if ray_cluster.node_of(i) == by_rank[1])
    ray_cluster.remove_worker(victim)
    one = _wait(lambda: [r for r in snap()["resumes"] if r["world_size"] == 1], 180, "resume on 1 rank")[0]
    _wait(lambda: [c for c in snap()["checkpoints"] if c["t"] > one["t"]], 120, "a checkpoint on 1 rank")
    ray_cluster.add_worker()
    two = _wait(lambda: [r for r in snap()["resumes"] if r["world_size"] == 2 and r["t"] > one["t"]], 180,
                "resume on 2 ranks")[0]
    _wait(lambda: snap()["step"] >= two["from_step"] + 2, 120, "progress on 2 ranks again")
    ray.get(actor.request_stop.remote("test done"))
    t.join(180)
    r = out["r"]
    s = snap()
    ray.kill(actor)
    assert r.error is None, r.error
    assert r.stopped == "test done"
    assert one["from_step"] >= 3 and two["from_step"] > one["from_step"]
    last = latest_committed(run_storage(job.storage_uri, name))
    assert last.kind == "stop" and last.world_size == 2 and last.step == r.steps_completed
    assert [c["kind"] for c in s["checkpoints"]][-1] == "stop"
    assert math.isfinite(s["step"])

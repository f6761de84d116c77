"""``local.emulated_gpus`` (issue 49, item 1): a switch for tests and benchmarks that makes each local
worker node declare N GPUs to Ray and train N CPU ranks over gloo, so an 8-GPU node's per-rank
arithmetic (world = nodes x GPUs) runs on a CPU. Fast: no node starts here (the 2 x 4-rank run
end to end is runtime/training/test_ray.py's)."""

from __future__ import annotations

import pytest

from spotwise.engine.plan.planner import make_plan
from spotwise.errors import InputError
from spotwise.provisioner.clouds.local.cloud import LocalCloud, emulated_gpus, worker_ray_args
from spotwise.runtime.training.trainer import scaling
from spotwise.taskspec import parse_taskspec


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))


def local_task(**training):
    return parse_taskspec({"name": "t", "resources": {"accelerators": "cpu:1", "nodes": 2, "clouds": ["local"]},
                           "training": training})


def test_off_by_default_one_rank_a_node(monkeypatch):
    monkeypatch.delenv("SPOTWISE_LOCAL_EMULATED_GPUS", raising=False)
    assert emulated_gpus() == 0 and worker_ray_args(0) == ["--num-cpus=1"]
    assert {o.accelerator_count for o in LocalCloud().offers()} == {1}


def test_n_gpus_a_node_are_sold_declared_and_trained_on_the_cpu_over_gloo(monkeypatch):
    monkeypatch.setenv("SPOTWISE_LOCAL_EMULATED_GPUS", "4")
    assert {o.accelerator_count for o in LocalCloud().offers()} == {4}
    assert worker_ray_args(4) == ["--num-cpus=4", "--num-gpus=4"]
    assert scaling(4, True, {"CPU": 1}) == ({"GPU": 1.0, "CPU": 1.0}, "gloo")
    assert scaling(8, False, {"CPU": 1}) == ({"GPU": 1.0}, "nccl")          # real GPUs: NCCL
    assert scaling(0, False, {"CPU": 1}) == ({"CPU": 1}, "gloo")


def test_the_plan_sees_the_world_size_the_switch_gives(monkeypatch):
    """2 nodes x 4 emulated GPUs: 8 ranks; a batch of 4 cannot feed them."""
    monkeypatch.setenv("SPOTWISE_LOCAL_EMULATED_GPUS", "4")
    assert make_plan(local_task(batch_size=8), ["local"]).ranked
    with pytest.raises(InputError) as ei:
        make_plan(local_task(batch_size=4), ["local"])
    assert ei.value.problems[0].field == "training.batch_size"
    assert "world sizes 8 (2 node(s) x 4)" in ei.value.problems[0].allowed


@pytest.mark.parametrize("bad", ["x", "17", "-1", "2.5"])
def test_a_bad_value_is_refused_naming_the_setting(monkeypatch, bad):
    monkeypatch.setenv("SPOTWISE_LOCAL_EMULATED_GPUS", bad)
    with pytest.raises(InputError) as ei:
        emulated_gpus()
    p = ei.value.problems[0]
    assert p.field == "SPOTWISE_LOCAL_EMULATED_GPUS" and "0..16" in p.allowed and p.given == bad

"""The task at the world size each offer gives (issue 49, item 2 and finding 1): a batch the ranks
x grad_accum do not divide, or a rank its GPU cannot hold, is not planned, and with no offer left
the task is refused before launch (exit 2) naming the field and the world sizes."""

from __future__ import annotations

import json

import pytest

from spotwise.cli import main
from spotwise.engine.plan.planner import make_plan
from spotwise.engine.plan.ranks import memory_problem, world_size
from spotwise.errors import InputError
from spotwise.pricing.offer import Market, Offer
from spotwise.runtime.memory import GIB, rank_memory
from spotwise.taskspec import parse_taskspec


def task(accelerators, nodes=1, **training):
    return parse_taskspec({"name": "t", "resources": {"accelerators": accelerators, "nodes": nodes, "clouds": ["aws"]},
                           "training": training})


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("SPOTWISE_AWS_INSTANCE_PROFILE", "spotwise-node")   # AWS nodes' identity for s3://


def test_h100x8_on_two_nodes_with_batch_8_is_refused_naming_the_world_size():
    """16 ranks cannot share 8 sequences: before issue 49 the task check counted 2 nodes (and only
    with grad_accum > 1), so this planned and failed on the nodes."""
    with pytest.raises(InputError) as ei:
        make_plan(task({"H100": 8}, nodes=2, batch_size=8), ["aws"])
    (p,) = ei.value.problems
    assert p.field == "training.batch_size" and p.given == 8
    assert "world sizes 16 (2 node(s) x 8)" in p.allowed and "multiple of 16" in p.allowed


def test_the_cli_refuses_it_before_launch_with_exit_2(tmp_path, capsys):
    path = tmp_path / "t.yaml"
    path.write_text("name: t\nresources: {accelerators: 'H100:8', nodes: 2, clouds: [aws]}\n"
                    "training: {batch_size: 8}\n")
    assert main(["launch", str(path), "--storage", "s3://my-bucket/p", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "training.batch_size" in err and "16" in err


def test_grad_accum_counts_too_and_a_dividing_batch_plans():
    with pytest.raises(InputError) as ei:
        make_plan(task({"H100": 8}, batch_size=8, grad_accum=2), ["aws"])
    assert "multiple of 16" in ei.value.problems[0].allowed
    plan = make_plan(task({"H100": 8}, nodes=2, batch_size=32, grad_accum=2), ["aws"])
    assert plan.ranked and not plan.not_planned


def test_offers_whose_world_size_does_not_divide_are_left_out_and_dry_run_says_so(tmp_path, capsys):
    """A100 x 8 on 2 nodes is 16 ranks, L4 x 1 is 2: batch 8 plans only the L4 offers."""
    spec = task({"A100": 8, "L4": 1}, nodes=2, batch_size=8)
    plan = make_plan(spec, ["aws"])
    assert {p.offer.accelerator for p in plan.ranked} == {"L4"}
    assert plan.not_planned and all("16 ranks" in why for why in plan.not_planned.values())
    path = tmp_path / "t.yaml"
    path.write_text("name: t\nresources: {accelerators: {A100: 8, L4: 1}, nodes: 2, clouds: [aws]}\n"
                    "training: {batch_size: 8}\n")
    assert main(["launch", str(path), "--storage", "s3://my-bucket/p", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "not planned," in out and "is not divisible by 16 ranks" in out.replace("\n  ", " ").replace("\n", " ")
    assert main(["launch", str(path), "--storage", "s3://my-bucket/p", "--dry-run", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["offers_not_planned"] and doc["chosen"]["accelerator"] == "L4"


def test_8b_on_eight_40gb_gpus_without_activation_checkpointing_is_refused_with_the_numbers():
    llama8b = {"entrypoint": "llama", "model": {"flavor": "8b"}}
    with pytest.raises(InputError) as ei:
        make_plan(task({"A100": 8}, **llama8b), ["aws"])
    (p,) = ei.value.problems
    assert p.field == "training.model"
    assert "a rank needs about" in p.allowed and "GiB" in p.allowed and "40 GiB" in p.allowed
    assert "activation_checkpointing: true" in p.allowed
    plan = make_plan(task({"A100": 8}, **llama8b, activation_checkpointing=True), ["aws"])
    assert plan.ranked and plan.chosen.offer.accelerator == "A100"


def test_the_memory_estimate_by_its_parts():
    """8b at 8 ranks: 16 bytes a parameter sharded 8 ways (15 GiB); one micro-batch of one 8192-token
    sequence: 17 x dim bf16 values a token per layer without checkpointing, the input per layer with it,
    plus fp32 logits and their gradient (128256 x 8 bytes a token)."""
    spec = task({"A100": 8}, entrypoint="llama", model={"flavor": "8b"})
    m = rank_memory(spec.training, 8)
    assert m is not None
    assert m.state / GIB == pytest.approx(16 * 8.03e9 / 8 / GIB, rel=1e-2)
    tokens = 8192
    assert m.activations == pytest.approx(tokens * (2 * 17 * 4096 * 32 + 8 * 128256))
    ac = task({"A100": 8}, entrypoint="llama", model={"flavor": "8b"}, activation_checkpointing=True)
    m_ac = rank_memory(ac.training, 8)
    assert m_ac is not None and m_ac.activations == pytest.approx(tokens * (2 * (32 + 17) * 4096 + 8 * 128256))
    assert m.total / GIB > 40 > m_ac.total / GIB
    # the same task on 80 GB GPUs fits
    h100 = Offer(cloud="aws", instance_type="p5.48xlarge", accelerator="H100", accelerator_count=8, region="r",
                 zone="z", market=Market.SPOT, usd_per_hour=1.0, source="s", as_of="2026-01-01")
    assert world_size(h100, 1) == 8 and memory_problem(spec, h100, 8) is None
    assert memory_problem(ac, h100, 8) is None

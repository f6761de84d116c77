"""Reading a Slurm cluster: ``scontrol show partition/node -o`` as recorded from the tests' cluster
(Debian's Slurm 22.05.8), the time and gres forms Slurm prints, node states."""

from __future__ import annotations

import pytest

from slurm_helpers import recorded
from spotwise.provisioner.clouds.slurm.discovery import (
    SlurmNode,
    parse_cluster,
    parse_duration,
    parse_gres,
    parse_records,
)


def test_recorded_cluster_parses_to_its_partitions_nodes_and_gpus():
    info = parse_cluster(recorded("scontrol_show_partition.txt"), recorded("scontrol_show_node.txt"))
    assert set(info.partitions) == {"preemptible", "priority"}
    low, high = info.partitions["preemptible"], info.partitions["priority"]
    assert (low.priority_tier, low.preempt_mode, low.grace_s) == (1, "REQUEUE", 20.0)
    assert (low.max_time_s, low.default_time_s) == (2 * 3600.0, 30 * 60.0)
    assert low.preemptible and low.up
    assert (high.priority_tier, high.preempt_mode, high.grace_s) == (10, "OFF", 0.0)
    assert (high.max_time_s, high.default_time_s) == (86400.0, None) and not high.preemptible
    assert [n.name for n in low.nodes] == ["n1", "n2"] == [n.name for n in high.nodes]
    n1 = info.nodes["n1"]
    assert (n1.gpus, n1.cpus, n1.memory_mb, n1.state, n1.usable) == ({"h100": 8}, 2, 2000, "IDLE", True)
    assert low.gpu_shapes() == {("h100", 8): 2}


def test_a_value_with_spaces_continues_and_a_value_with_equals_is_kept():
    [rec] = parse_records("NodeName=n1 OS=Linux 6.1.0 #1 SMP  RealMemory=2000 Comment=spotwise-cluster=abc")
    assert rec == {"NodeName": "n1", "OS": "Linux 6.1.0 #1 SMP", "RealMemory": "2000",
                   "Comment": "spotwise-cluster=abc"}


@pytest.mark.parametrize("text,seconds", [
    ("01:00:00", 3600.0), ("1-00:00:00", 86400.0), ("2-12", 2 * 86400 + 12 * 3600.0), ("1-01:30", 91800.0),
    ("30", 1800.0), ("05:30", 330.0), ("UNLIMITED", None), ("NONE", None), ("INFINITE", None), (None, None),
])
def test_slurm_times(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text,gpus", [
    ("gpu:h100:8", {"h100": 8}),
    ("gpu:h100:8(S:0-1)", {"h100": 8}),            # the socket affinity Slurm appends on real hardware
    ("gpu:a100:4,gpu:v100:2", {"a100": 4, "v100": 2}),
    ("gpu:4", {"": 4}),
    ("gpu:a100:2(S:0),mps:200,shard:8", {"a100": 2}),
    ("(null)", {}), (None, {}),
])
def test_gres(text, gpus):
    assert parse_gres(text) == gpus


@pytest.mark.parametrize("state,usable", [
    ("IDLE", True), ("MIXED", True), ("ALLOCATED", True), ("IDLE+DRAIN", False), ("DOWN*", False),
    ("DRAINED", False), ("IDLE*", True), ("MIXED+DRAIN", False), ("INVAL", False), ("IDLE+NOT_RESPONDING", False),
])
def test_node_states(state, usable):
    assert SlurmNode(name="n", state=state, cpus=1, memory_mb=1, gpus={}, partitions=()).usable is usable

"""A Slurm cluster's offers: partition × GPU shape, priced from the config file, and the errors a
config that does not match the cluster gets."""

from __future__ import annotations

import datetime as dt
import os

import pytest

from slurm_helpers import recorded
from spotwise.config import SlurmClusterConfig
from spotwise.errors import InputError
from spotwise.pricing.offer import Market
from spotwise.provisioner.clouds.slurm.discovery import parse_cluster
from spotwise.provisioner.clouds.slurm.offers import cluster_offers, gres_of, instance_type


def _cluster(**partitions) -> SlurmClusterConfig:
    return SlurmClusterConfig.model_validate(
        {"name": "lab", "partitions": {k: {"price_per_gpu_hour": v} for k, v in partitions.items()}})


def _info(nodes_text: str | None = None):
    return parse_cluster(recorded("scontrol_show_partition.txt"), nodes_text or recorded("scontrol_show_node.txt"))


def test_each_configured_partition_is_an_offer_priced_per_node_from_the_config(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("# prices\n")
    stamp = dt.datetime(2026, 10, 3, 12, tzinfo=dt.timezone.utc).timestamp()
    os.utime(cfg, (stamp, stamp))
    got = cluster_offers(2, _cluster(preemptible=0.4, priority=1.6), _info(), config_path=cfg)
    by_zone = {o.zone: o for o in got.offers}
    low, high = by_zone["preemptible"], by_zone["priority"]
    assert (low.cloud, low.region, low.instance_type, low.accelerator, low.accelerator_count) == \
        ("slurm", "lab", "gpu:h100:8", "H100", 8)
    assert low.market is Market.SPOT and high.market is Market.ON_DEMAND   # REQUEUE vs OFF
    assert (low.usd_per_hour, high.usd_per_hour) == (pytest.approx(3.2), pytest.approx(12.8))
    assert low.usd_per_gpu_hour == pytest.approx(0.4)
    assert low.source == f"config {cfg}: slurm.clusters.2.partitions.preemptible.price_per_gpu_hour"
    assert low.as_of == "2026-10-03"
    assert (low.vcpus, low.memory_gib) == (2.0, pytest.approx(2000 / 1024, abs=1e-3))
    assert got.partitions["preemptible"].grace_s == 20.0 and got.notes == []


def test_only_the_partitions_the_config_prices_are_offered(tmp_path):
    got = cluster_offers(0, _cluster(priority=0), _info(), config_path=tmp_path / "c.yaml")
    assert [(o.zone, o.usd_per_hour) for o in got.offers] == [("priority", 0.0)]    # a free partition is allowed


def test_a_partition_the_cluster_lacks_is_an_error_naming_its_field(tmp_path):
    with pytest.raises(InputError) as e:
        cluster_offers(1, _cluster(preemptible=0.4, **{"gpu-typo": 1.0}), _info(), config_path=tmp_path / "c.yaml")
    [p] = e.value.problems
    assert p.field == "slurm.clusters.1.partitions.gpu-typo"
    assert "preemptible, priority" in p.allowed


def test_a_gpu_type_spotwise_cannot_price_the_speed_of_is_left_out_with_a_note(tmp_path):
    nodes = recorded("scontrol_show_node.txt").replace("Gres=gpu:h100:8", "Gres=gpu:mi300x:8", 1)
    got = cluster_offers(0, _cluster(preemptible=0.4), _info(nodes), config_path=tmp_path / "c.yaml")
    assert [(o.zone, o.instance_type) for o in got.offers] == [("preemptible", "gpu:h100:8")]   # n2 still
    assert any("'mi300x'" in n for n in got.notes)


def test_drained_nodes_offer_nothing(tmp_path):
    nodes = recorded("scontrol_show_node.txt").replace("State=IDLE", "State=IDLE+DRAIN")
    got = cluster_offers(0, _cluster(preemptible=0.4), _info(nodes), config_path=tmp_path / "c.yaml")
    assert got.offers == [] and got.notes == ["slurm/lab/preemptible: no usable node with GPU gres"]


@pytest.mark.parametrize("gpu,count", [("h100", 8), ("", 4), ("a100-80gb", 2)])
def test_instance_type_is_the_gres_spelling_and_back(gpu, count):
    assert gres_of(instance_type(gpu, count)) == (gpu, count)

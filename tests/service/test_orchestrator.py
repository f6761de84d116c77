"""Orchestrator decisions that need no Ray cluster: planning, the budget pre-check, and where a
replacement node goes when spot capacity is gone."""

import pytest

from spotwise.errors import InputError, SpotwiseError
from spotwise.provisioner.local import LocalCloud, marked_pids
from spotwise.service.ledger import Ledger
from spotwise.service.orchestrator import LaunchOptions, Orchestrator
from spotwise.taskspec import parse_taskspec


def spec(**over):
    data = {"name": "t", "resources": {"nodes": 2, "market": "auto"}, "training": {"steps": 10}}
    data.update(over)
    return parse_taskspec(data)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    monkeypatch.delenv("SPOTWISE_DATABASE_URL", raising=False)
    yield tmp_path
    c = LocalCloud()
    c.terminate(c.list_nodes())
    assert marked_pids(home_prefix=str(tmp_path)) == []


def test_plan_orders_spot_before_on_demand_and_respects_market():
    o = Orchestrator(spec(), LaunchOptions())
    head, spot, od = o._plan(LocalCloud())
    assert head.instance_type == "local.head"
    assert spot and od and spot[0].usd_per_hour <= spot[-1].usd_per_hour < od[0].usd_per_hour
    _, spot, od = Orchestrator(spec(resources={"nodes": 1, "market": "on-demand"}), LaunchOptions())._plan(LocalCloud())
    assert spot == [] and od
    _, spot, od = Orchestrator(spec(resources={"nodes": 1, "market": "spot"}), LaunchOptions())._plan(LocalCloud())
    assert od == [] and spot


def test_max_price_below_every_offer_is_an_input_error():
    o = Orchestrator(spec(resources={"nodes": 1, "max_price_per_hour": 0.01}), LaunchOptions())
    with pytest.raises(InputError) as e:
        o._plan(LocalCloud())
    assert e.value.problems[0].field == "resources.max_price_per_hour"


def test_budget_that_cannot_pay_a_billing_minute_is_refused_before_launch():
    o = Orchestrator(spec(), LaunchOptions(budget_usd=0.001))
    with pytest.raises(SpotwiseError, match="nothing was launched"):
        o._plan(LocalCloud())
    assert LocalCloud().list_nodes() == []


def test_non_local_cloud_is_a_clear_input_error():
    with pytest.raises(InputError) as e:
        Orchestrator(spec(), LaunchOptions(cloud="gcp"))
    assert e.value.problems[0].field == "--cloud"


@pytest.fixture
def cluster():
    """An orchestrator with its job recorded and its Ray head up, as in a real run."""
    o = Orchestrator(spec(), LaunchOptions())
    o._record_job(status="running")
    cloud = LocalCloud()
    head, spot, od = o._plan(cloud)
    ledger = Ledger(o.job_id)
    h = o._launch(cloud, ledger, head, role="head")
    yield o, cloud, ledger, spot, od
    cloud.terminate([h])
    ledger.close_all()


def test_replacement_falls_back_to_on_demand_when_spot_has_no_capacity(cluster):
    o, cloud, ledger, spot, od = cluster
    cloud.spot_unavailable.update(x.zone for x in spot)       # every spot zone is out of capacity
    node = o._launch_worker(cloud, ledger, spot, od, elapsed_h=0.0)
    assert node.market == "on-demand"
    assert [e["event"] for e in o.state.events].count("capacity_error") == len(spot)
    head_rate = next(n for n in o._nodes.values() if n.role == "head").usd_per_hour
    assert ledger.rate_usd_per_hour() == pytest.approx(node.usd_per_hour + head_rate)
    cloud.terminate([node])
    ledger.close(node.instance_id)


def test_policy_moves_replacements_to_on_demand_after_repeated_preemptions(cluster):
    o, cloud, ledger, spot, od = cluster
    o.state.preemptions = 3                                   # spot-fallback: 3 within the hour
    node = o._launch_worker(cloud, ledger, spot, od, elapsed_h=0.1)
    assert node.market == "on-demand"
    cloud.terminate([node])
    ledger.close(node.instance_id)


def test_default_checkpoint_storage_follows_spotwise_home(home):
    from spotwise.service.orchestrator import _storage_uri

    assert _storage_uri(spec(), LaunchOptions()) == f"file://{home}/checkpoints"
    assert (home / "checkpoints").is_dir()
    assert _storage_uri(spec(), LaunchOptions(storage="s3://b/p")) == "s3://b/p"
    with pytest.raises(InputError, match="--storage"):
        _storage_uri(spec(), LaunchOptions(storage="s3://"))

"""Bill what the cloud bills (issue 30, item 3): a node's boot disk and public IPv4 address enter the
ledger at their published prices, each with its source and date, next to the instance; the budget
cap and the plan's expected cost include them (:mod:`spotwise.pricing.attached`)."""

from __future__ import annotations

import csv
import re
import time
from importlib import resources
from types import SimpleNamespace

import pytest
from orchestrator_fakes import Control, FakeCloud, Jobs, Lease

from spotwise.engine.state import db
from spotwise.engine.state.ledger import Ledger, cost_report
from spotwise.engine.run.orchestrator import Factories, LaunchOptions, Orchestrator
from spotwise.engine.run.purse import Money, Purse, StopLatch
from spotwise.errors import InputError
from spotwise.pricing import attached
from spotwise.provisioner.base import Node
from spotwise.taskspec import parse_taskspec

GP3_200 = 0.08 * 200 / 720          # $/h of AWS's 200 GiB gp3 root volume (a 30-day month, as AWS's example)
IPV4 = 0.005                        # $/h of an AWS public IPv4 address since 2024-02-01
AWS_LIKE = SimpleNamespace(name="aws", root_volume_gib=200)


class AwsLikeCloud(FakeCloud):
    """The orchestrator fakes' cloud, carrying what an AWS node carries (a gp3 root volume, a public
    IPv4 address), priced as the AWS provisioner's nodes are."""

    def node_charges(self, region, market, *, public_ip=None, instance_type=None):
        return attached.node_charges(AWS_LIKE, region, market, public_ip=public_ip)


@pytest.mark.usefixtures("local_home")
def test_a_runs_ledger_bills_each_nodes_disk_and_address_at_their_published_prices():
    log: list = []
    cloud, jobs = AwsLikeCloud("local", log), Jobs(log)
    holder: dict = {}
    make = Factories(cloud=lambda name: cloud, lease=lambda job_id, budget: Lease(log, holder["o"].job_id),
                     jobs_client=lambda url, headers: jobs, control=lambda url, token: Control(log, jobs, url))
    spec = parse_taskspec({"name": "r", "resources": {"nodes": 2, "market": "spot"}, "training": {"steps": 10}})
    o = holder["o"] = Orchestrator(spec, LaunchOptions(tick_s=0.01, policy_interval_s=0.05), factories=make)
    rep = o.run()
    assert rep["status"] == "succeeded" and o.purse.ledger.open_ids() == []
    rows = cost_report(o.job_id)["rows"]
    disks = [r for r in rows if r["market"] == "disk"]
    ips = [r for r in rows if r["market"] == "ipv4"]
    assert len(disks) == 1 and disks[0]["usd_per_hour"] == pytest.approx(GP3_200)
    assert "aws.amazon.com/ebs/pricing" in disks[0]["price_source"] and disks[0]["price_as_of"]
    assert len(ips) == 1 and ips[0]["usd_per_hour"] == IPV4 and ips[0]["price_as_of"] == "2024-02-01"
    assert "ipv4" in ips[0]["price_source"]
    # one disk and one address per node (head + 2 workers), billed as long as the node, closed with it
    with db.session() as s:
        recs = s.query(db.NodeRecord).filter_by(job_id=o.job_id).all()
    nodes = [r for r in recs if r.market in ("spot", "on-demand")]
    carried = [r for r in recs if r.market in ("disk", "ipv4")]
    assert len(nodes) == 3 and len(carried) == 6 and all(r.terminated_at is not None for r in recs)
    by_id = {r.instance_id: r for r in recs}
    for r in carried:
        node = by_id[r.instance_id.rsplit("/", 1)[0]]
        assert (r.launched_at, r.billed_until) == (node.launched_at, node.billed_until)
    assert rep["cost_by_item"]["disks"] == pytest.approx(disks[0]["cost_usd"], abs=1e-6)
    assert rep["cost_by_item"]["ipv4"] == pytest.approx(ips[0]["cost_usd"], abs=1e-6)
    assert rep["cost_usd"] == pytest.approx(sum(rep["cost_by_item"].values()), abs=1e-5)
    assert rep["hours_by_market"]["spot"] > 0           # instance-hours: disks and addresses are not in them
    launched = [e for e in rep["events"] if e["event"] == "launched"]
    assert all({c["kind"] for c in e["carries"]} == {"disk", "ipv4"} for e in launched)


def test_the_budget_cap_counts_what_nodes_carry(sqlite_db):
    with db.session() as s:
        s.add(db.Job(id="j", name="t", status="running", cloud="aws", cluster_id="c", spec={}))
        s.commit()
    ledger = Ledger("j")
    t0 = time.time() - 3600
    node = Node(cloud="aws", instance_id="i-1", instance_type="p4d.24xlarge", region="us-east-1", zone="us-east-1a",
                market="spot", usd_per_hour=1.0, cluster_id="c", job_id="j", launched_at=t0,
                extra={"price_source": "catalog", "price_as_of": "2026-11-01"})
    ledger.open(node, attached.node_charges(AWS_LIKE, "us-east-1", "spot", public_ip=True))
    assert ledger.rate_usd_per_hour() == pytest.approx(1.0 + GP3_200 + IPV4)
    ledger.bill(t0 + 3600)
    assert ledger.spend(t0 + 3600) == pytest.approx(1.0 + GP3_200 + IPV4)
    # a budget the instance alone would not reach within the next billing minute: the carried charges do
    budget = 1.0 + 61 / 3600 + 0.001
    events: list = []
    purse = Purse(ledger, budget, lease=lambda: None, event=lambda kind, **kw: events.append(kind))
    assert purse.check(t0 + 3600, StopLatch(), lambda reason: None) is Money.HARD_STOP
    ledger.close("i-1", at=t0 + 3600)
    assert ledger.open_ids() == []


def test_the_plan_adds_disks_and_addresses_to_every_offers_expected_cost(tmp_path, monkeypatch):
    from spotwise.engine.plan.planner import make_plan

    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    monkeypatch.delenv("SPOTWISE_GCP_EXTERNAL_IP", raising=False)
    spec = parse_taskspec({"name": "p", "resources": {"accelerators": {"A100": 8}, "nodes": 2,
                                                      "clouds": ["aws", "gcp", "azure"]},
                           "training": {"steps": 1000, "batch_size": 16}})
    plan = make_plan(spec, ["aws", "gcp", "azure"], storage="s3://b/p")
    best = {c: next(p for p in plan.ranked if p.offer.cloud == c) for c in ("aws", "gcp", "azure")}
    # a cluster is the head and 2 workers, each with its disk (and, on AWS, its public address)
    assert best["aws"].carried_usd_per_hour == pytest.approx(3 * (GP3_200 + IPV4))
    # pd-balanced; the workers have no external IP, the head one: the launcher reaches it over ssh
    assert best["gcp"].carried_usd_per_hour == pytest.approx(3 * 0.10 * 200 / 730 + IPV4)
    assert best["azure"].carried_usd_per_hour == pytest.approx(3 * 38.01 / 730 + IPV4)  # Premium SSD P15 (256 GiB)
    # from inside the clouds' networks the heads have none on GCP and Azure (AWS maps one anyway)
    monkeypatch.setenv("SPOTWISE_HEAD_PATH", "private")
    private = make_plan(spec, ["gcp", "azure"], storage="s3://b/p")
    inside = {c: next(p for p in private.ranked if p.offer.cloud == c) for c in ("gcp", "azure")}
    assert inside["gcp"].carried_usd_per_hour == pytest.approx(3 * 0.10 * 200 / 730)
    assert inside["azure"].carried_usd_per_hour == pytest.approx(3 * 38.01 / 730)
    for p in best.values():
        assert p.carried_usd == pytest.approx(p.carried_usd_per_hour * p.expected_hours)
        d = p.to_dict()
        assert d["carried_usd_per_hour"] > 0 and d["carried_per_worker"][0]["source"]
    text = "\n".join(plan.lines(title="plan"))
    assert "disks and addresses" in text and "aws.amazon.com/ebs/pricing" in text
    assert max(len(line) for line in plan.lines(title="plan")) <= 80
    monkeypatch.setenv("SPOTWISE_GCP_EXTERNAL_IP", "1")
    plan = make_plan(spec, ["gcp"], storage="s3://b/p")
    spot = next(p for p in plan.ranked if p.offer.market.value == "spot")
    # spot workers' addresses at GCP's Spot rate, the on-demand head's at the standard one
    assert spot.carried_usd_per_hour == pytest.approx(3 * 0.10 * 200 / 730 + 2 * 0.0025 + 0.005)


def test_a_node_without_a_public_address_carries_only_its_disk():
    assert [c.kind for c in attached.node_charges(AWS_LIKE, "us-east-1", "spot", public_ip=False)] == ["disk"]
    assert attached.node_charges(SimpleNamespace(name="local"), "local", "spot") == []
    azure = SimpleNamespace(name="azure", os_disk_gib=200)
    assert [c.kind for c in attached.node_charges(azure, "eastus", "spot", public_ip=None)] == ["disk"]


def test_aws_nodes_say_whether_ec2_gave_them_a_public_address():
    from spotwise.provisioner.clouds.aws.cloud import AwsCloud

    cloud = AwsCloud(image_id="ami-1")
    inst = {"InstanceId": "i-1", "InstanceType": "p4d.24xlarge", "Tags": [], "State": {"Name": "running"}}
    assert cloud._node("us-east-1", {**inst, "PublicIpAddress": "3.3.3.3"}).extra["public_ip"] is True
    assert cloud._node("us-east-1", inst).extra["public_ip"] is False


@pytest.mark.parametrize("args, field", [(("aws", "io9", 100), "disk_type"), (("aws", "gp3", 0), "disk_gib"),
                                         (("azure", "Premium_LRS", 5000), "disk_gib")])
def test_a_disk_without_a_published_price_is_an_error_naming_the_field(args, field):
    with pytest.raises(InputError) as e:
        attached.disk(*args)
    assert field in str(e.value)


def test_every_price_carries_its_source_and_date():
    text = resources.files("spotwise.pricing").joinpath("data/attached.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    assert {(r["cloud"], r["kind"]) for r in rows} >= {("aws", "disk"), ("aws", "ipv4"), ("gcp", "disk"),
                                                       ("gcp", "ipv4"), ("azure", "disk")}
    for r in rows:
        assert r["source"].startswith("https://") and re.fullmatch(r"\d{4}-\d{2}-\d{2}", r["as_of"]), r
        assert r["verified"] in ("yes", "secondary", "no") and float(r["usd"]) > 0


def test_a_gcp_node_is_billed_for_the_boot_disk_type_its_series_gets():
    """The disk GCE creates is the one billed: pd-balanced on A2/A3/G2 and the n2 head (GCE's
    default pd-standard, $0.04/GB-month, was billed before while A3 and G2 refuse it), and on the
    Hyperdisk-only A3 Ultra a hyperdisk-balanced disk whose stand-in price says so. Failed before
    the fix: every GCP node carried 'pd-standard 200 GiB'."""
    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    cloud = GcpCloud.__new__(GcpCloud)          # no project or credentials needed to price a disk
    cloud.boot_disk_gb = 200
    cloud.external_ip = False
    for machine in ("a3-edgegpu-8g", "a2-highgpu-1g", "g2-standard-4", "n2-standard-4"):
        [d] = cloud.node_charges("us-central1", "spot", instance_type=machine)
        assert d.what == "pd-balanced 200 GiB" and d.usd_per_hour == pytest.approx(0.10 * 200 / 730)
    [d] = cloud.node_charges("us-central1", "spot", instance_type="a3-ultragpu-8g")
    assert d.what.startswith("hyperdisk-balanced 200 GiB (priced as pd-balanced")

"""The main job on an emulated Azure, end to end and offline.

Azure is the wire-level ARM fake on loopback; every VM it holds becomes a local node that executes
the exact custom data spotwise gave ARM, against its own IMDS with Scheduled Events
(``tests/emulator/azure.py``). The orchestrator is the unchanged ``spotwise launch`` process: it
plans from the catalog (refreshed from the emulated Retail Prices API, as a user would), provisions
Spot VMs through azure-mgmt-compute (failing over a ``SkuNotAvailable``), reaches the head's Jobs API
as from a laptop (ssh port forwards to the head's Standard public IP, a real sshd per emulated head
that admits only what the cluster's NSG opens port 22 to; the private addresses are still loopback,
reachable here, so this does not prove they could not be reached directly), bills per second at the
catalog's launch prices, replaces a VM evicted through a ``Preempt`` scheduled event and tears
everything down.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from e2e import helpers
from e2e.helpers import assert_every_node_installed_the_launchers_build, cloud_task, plan, run
from emulator.azure import EmulatedAzure
from spotwise.provisioner.clouds.local.cloud import marked_pids

# the session reference run (set up by the first test using it) plus this run overrun 600 s on a busy
# 2-core machine; the launch itself is bounded at 900 s below
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
NOTHING = {"vms": [], "network_interfaces": [], "public_ips": [], "disks": [], "network_security_groups": []}


@pytest.fixture
def emu(tmp_path):
    with EmulatedAzure(tmp_path / "azure") as e:
        e.refresh_prices(tmp_path / "home")
        yield e
    assert marked_pids(home_prefix=str(tmp_path)) == [], "an emulated node outlived its VM"


def azure_task(tmp_path: Path, **over) -> Path:
    return cloud_task(tmp_path, ["azure"], ["eastus", "westus2"], **over)


def ledger(report: dict) -> tuple[list[tuple], list[tuple]]:
    return helpers.ledger(report, place="region")


class PreemptAfterFirstCheckpoint:
    """Evict one Spot worker the Azure way once a checkpoint is committed: a ``Preempt`` scheduled
    event with ``NotBefore`` 30 s ahead; the VM goes when the event is acknowledged."""

    def __init__(self) -> None:
        self.victim: str | None = None
        self.event_id: str | None = None

    def __call__(self, emu: EmulatedAzure) -> None:
        if self.victim is not None:
            return
        if not emu.committed():
            return
        workers = emu.vms(role="worker", priority="Spot")
        if workers and workers[0]["name"] in emu.nodes:
            self.victim = workers[0]["name"]
            self.event_id = emu.preempt(self.victim)


def test_azure_preemption_and_capacity_error_end_to_end(emu, tmp_path, reference):
    task = azure_task(tmp_path, budget_usd=5.0)
    p = plan(emu, tmp_path, task, emu.storage)
    chosen = p["chosen"]
    assert chosen["cloud"] == "azure" and chosen["market"] == "spot" and p["fallbacks"] and p["reason"]
    assert chosen["source"] == "azure:retail-prices-api"
    fallback = next(f for f in p["fallbacks"] if f["market"] == "spot" and f["region"] != chosen["region"])
    # the plan's first region has no Spot capacity for the size: ARM answers SkuNotAvailable
    emu.set_no_capacity([f"{chosen['instance_type']}:{chosen['region']}:spot"], kind="sku")
    preempt = PreemptAfterFirstCheckpoint()
    rep = run(emu, tmp_path, task, "--storage", emu.storage, during=preempt)

    assert rep["status"] == "succeeded", (rep["message"], (tmp_path / "launch.err").read_text()[-3000:])
    assert rep["cloud"] == "azure" and rep["region"] == fallback["region"]
    assert rep["steps_completed"] == rep["steps_total"] == reference["steps_total"]
    assert rep["model_sha256"] == reference["model_sha256"], "weights differ from the uninterrupted local run"
    assert preempt.victim is not None
    assert rep["preemptions"] == 1 and rep["resumes"] >= 1
    assert rep["lost_steps"] <= rep["checkpoint_interval"]
    key = f"azure/{chosen['region']}/{chosen['zone'] or '-'}/{chosen['instance_type']}/spot"
    assert any(a["outcome"] == "capacity" and a["offer"] == key and "SkuNotAvailable" in a["message"]
               for a in rep["attempts"]), rep["attempts"]
    events = [e["event"] for e in rep["events"]]
    assert "preempted" in events and "replaced" in events

    # the eviction went the Azure way: the watcher acknowledged the Preempt event (after the
    # just-in-time checkpoint), which let the eviction proceed before NotBefore
    assert (preempt.victim, preempt.event_id) in emu.imds.acks
    assert (preempt.victim, "acknowledged") in emu.evicted
    # the checkpoint the acknowledgement waited for is the run's newest one newer than the notice
    # (runtime/node/watch.py): the ranks' just-in-time one, or, when the notice came as a periodic
    # checkpoint was committing, that one; the node may then go before the just-in-time one, and
    # training resumes from the periodic one, at most a step behind (seen once in CI: notice at
    # step 40's commit, resumed from 40, the ranks had reached 41)
    if not any(c["kind"] == "preemption" for c in rep["checkpoints"]):
        [rp] = rep["resume_points"]
        assert rp["from_step"] % rep["checkpoint_interval"] == 0 and rp["max_step_before"] - rp["from_step"] <= 1, (
            rep["checkpoints"], rep["resume_points"])
    assert emu.imds.rejected == 0

    # money: every node billed per second at the catalog's price of its offer at launch
    nodes, entries = ledger(rep)
    for iid, role, market, region, usd, source in nodes:
        assert region == fallback["region"]
        if role == "worker":
            assert market == "spot" and usd == pytest.approx(fallback["usd_per_hour"])
            assert source == fallback["source"]
        else:
            assert market == "on-demand" and usd == pytest.approx(chosen["head_usd_per_hour"]) and "Standard_D2s_v5" in source
    by_node = {n[0]: n[4] for n in nodes}
    assert all(e[2] == by_node[e[0]] for e in entries if e[0] in by_node)
    assert {e[0] for e in entries if e[0] not in by_node} <= {f"{i}/{k}" for i in by_node for k in ("disk", "ipv4")}
    assert {f"{i}/disk" for i in by_node} <= {e[0] for e in entries}     # every node's disk billed too
    total = sum(e[1] * e[2] / 3600 for e in entries)
    assert rep["cost_usd"] == pytest.approx(total, abs=1e-6)
    assert rep["cost_usd"] <= rep["budget_usd"]

    # the boot script each node ran is byte for byte the custom data spotwise gave ARM
    puts = {r["path"].rsplit("/", 1)[-1]: r["body"] for r in emu.fake.requests
            if r["method"] == "PUT" and "/virtualMachines/" in r["path"]}
    # (a VM released before the emulator booted it never ran; every billed node did)
    assert {n[0] for n in nodes} <= set(emu.scripts)
    for name, script in emu.scripts.items():
        props = puts[name]["properties"]
        assert script == base64.b64decode(props["osProfile"]["customData"])
        assert props["priority"] in ("Spot", "Regular")
        if props["priority"] == "Spot":
            assert props["evictionPolicy"] == "Delete" and props["billingProfile"]["maxPrice"] == -1
        ran = (emu.workdir / "vms" / name / "custom-data").read_bytes()
        assert ran == script and rep["cluster_id"].encode() in ran
        boot = (emu.workdir / "vms" / name / "state" / "bootstrap.log").read_text()
        assert "spotwise bootstrap start" in boot
        if puts[name]["location"] == rep["region"]:      # the cluster's; a head released in the refused
            assert "spotwise bootstrap done" in boot      # region may be ended before it finished booting
    cluster = {n for n in emu.scripts if puts[n]["location"] == rep["region"]}
    assert_every_node_installed_the_launchers_build(emu, cluster)
    # storage as the VM's managed identity: every node of the cluster asked its own IMDS for a
    # storage token (no key was in its environment), and the checkpoints are in the az:// container
    assert cluster <= {vm for vm, resource in emu.imds.tokens if "storage.azure.com" in resource}, emu.imds.tokens
    assert emu.committed(f"runs/{rep['job_id']}/")
    # only a head's NIC asked for a public IP, and every NIC carried the cluster's NSG
    nic_puts = {r["path"].rsplit("/", 1)[-1]: r["body"] for r in emu.fake.requests
                if r["method"] == "PUT" and "/networkInterfaces/" in r["path"]}
    with_ip = {n for n, b in nic_puts.items()
               if any("publicIPAddress" in c.get("properties", {}) for c in b["properties"]["ipConfigurations"])}
    heads = {n for n, b in puts.items() if b["tags"]["spotwise-role"] == "head"}
    assert heads and with_ip == {f"{h}-nic" for h in heads}, (with_ip, heads)
    assert all("spotwise-" + rep["cluster_id"] in b["properties"]["networkSecurityGroup"]["id"]
               for b in nic_puts.values())
    # as from a laptop: the launcher reached the cluster's head through its sshd with the cluster's
    # key, from the NSG's port-22 address; a worker had no public IP and no sshd
    for name in emu.scripts:            # (every VM that booted)
        assert (emu.workdir / "vms" / name / "sshd").exists() == (name in heads), name
    [head] = [h for h in heads if puts[h]["location"] == rep["region"]]
    log = (emu.workdir / "vms" / head / "sshd" / "sshd.log").read_text()
    assert "Server listening on 127.22." in log and "Accepted publickey" in log, log[-2000:]
    assert "@127.0.0.1/32" in (emu.workdir / "vms" / head / "sshd" / "sshd_config").read_text()

    # nothing of ours is left in the cloud
    assert emu.leftovers() == NOTHING
    assert not emu.errors

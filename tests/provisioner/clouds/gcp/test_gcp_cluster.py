"""What a run needs of GCP beyond launch/terminate, through the real client against the wire fake:
the head offer, the cluster's firewall rules, the node's network/scopes, the price it is billed,
preemption as GCP records it, and cleanup/gc leaving nothing."""

from __future__ import annotations

import pytest

from helpers import offer
from spotwise.errors import InputError
from spotwise.provisioner.base import CapacityError, LaunchRequest
from spotwise.provisioner.clouds.gcp.cloud import NODE_SCOPES, firewall_names, network_tag
from spotwise.provisioner.clouds.gcp.names import ssh_firewall_name
from spotwise.provisioner.reconcile import down, gc

ZONE = "us-central1-a"
CID = "swc0ffee1234"


def _req(o, count=1, role="worker", **kw) -> LaunchRequest:
    return LaunchRequest(cluster_id=CID, job_id="job-9", offer=o, count=count, role=role, **kw)


def _inserted(fake) -> list[dict]:
    return [r["body"] for r in fake.requests if r["method"] == "POST" and r["path"].endswith("/instances")]


def test_head_offer_is_a_priced_on_demand_cpu_machine(gcp_cloud):
    h = gcp_cloud.head_offer("us-central1", ZONE)
    assert (h.cloud, h.instance_type, h.market.value, h.zone, h.accelerator_count) == \
        ("gcp", "n2-standard-2", "on-demand", ZONE, 0)
    assert h.usd_per_hour == pytest.approx(0.097118) and "n2-standard-2" in h.source and h.as_of
    far = gcp_cloud.head_offer("europe-west4", "europe-west4-a")
    assert far.usd_per_hour == h.usd_per_hour and "us-central1 price assumed for europe-west4" in far.source


def test_unknown_head_type_is_an_input_error(gcp_cloud, monkeypatch):
    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    monkeypatch.setenv("SPOTWISE_GCP_HEAD_TYPE", "e2-nano")
    cloud = GcpCloud(project="proj-1", credentials=gcp_cloud._credentials, endpoint=gcp_cloud.api_endpoint)
    with pytest.raises(InputError) as ei:
        cloud.head_offer("us-central1", ZONE)
    assert "SPOTWISE_GCP_HEAD_TYPE" in str(ei.value) and "n2-standard-2" in str(ei.value)


@pytest.mark.parametrize("var,value", [("SPOTWISE_GCP_CLIENT_CIDRS", "10.0.0.0/33"),
                                       ("SPOTWISE_GCP_EXTERNAL_IP", "yes"), ("SPOTWISE_RAY_PORT", "0")])
def test_bad_environment_names_the_variable(monkeypatch, var, value):
    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    monkeypatch.setenv(var, value)
    with pytest.raises(InputError) as ei:
        GcpCloud(project="p")
    assert var in str(ei.value)


def test_firewall_opens_ports_only_inside_the_cluster_and_to_the_vpc(gcp_cloud, gcp_fake):
    gcp_cloud.prepare_cluster(CID, "job-9", "us-central1")
    gcp_cloud.prepare_cluster(CID, "job-9", "us-central1")      # idempotent
    internal, clients = firewall_names(CID)
    rules = {name: r for (_, name), r in gcp_fake.firewalls.items()}
    assert set(rules) == {internal, clients, ssh_firewall_name(CID)}       # ssh: the default head path
    tag = network_tag(CID)
    assert rules[internal]["sourceTags"] == [tag] and rules[internal]["targetTags"] == [tag]
    assert "sourceRanges" not in rules[internal]
    assert rules[clients]["sourceRanges"] == [str(gcp_fake.ip_range)]          # the subnetwork's range
    assert rules[clients]["targetTags"] == [tag]
    assert rules[clients]["allowed"] == [{"IPProtocol": "tcp", "ports": [str(gcp_cloud.dashboard_port),
                                                                         str(gcp_cloud.control_port)]}]
    assert all("0.0.0.0/0" not in r.get("sourceRanges", []) for r in rules.values())
    assert all(f"spotwise-cluster={CID}" in r["description"] for r in rules.values())


def test_client_cidrs_replace_the_vpc_range(gcp_fake, monkeypatch):
    from google.auth.credentials import AnonymousCredentials

    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    monkeypatch.setenv("SPOTWISE_GCP_CLIENT_CIDRS", "192.168.7.0/24, 10.9.0.0/16")
    cloud = GcpCloud(project="proj-1", credentials=AnonymousCredentials(), endpoint=gcp_fake.endpoint)
    cloud.prepare_cluster(CID, "job-9", "us-central1")
    _, clients = firewall_names(CID)
    assert gcp_fake.firewalls[("proj-1", clients)]["sourceRanges"] == ["192.168.7.0/24", "10.9.0.0/16"]


def test_node_has_no_external_ip_storage_scope_only_and_the_cluster_tag(gcp_cloud, gcp_fake):
    o = offer("gcp", "a2-highgpu-8g", "us-central1", ZONE, usd=16.96648)
    [n] = gcp_cloud.launch(_req(o))
    body = _inserted(gcp_fake)[0]
    nic = body["networkInterfaces"][0]
    assert not nic.get("accessConfigs")
    assert body["serviceAccounts"][0]["scopes"] == list(NODE_SCOPES)
    assert body["tags"]["items"] == [network_tag(CID)]
    assert n.address and n.address.startswith("10.128.")
    from datetime import datetime

    created = next(iter(gcp_fake.instances.values()))["creationTimestamp"]
    assert n.launched_at == datetime.fromisoformat(created).timestamp()   # billing starts at creation
    # billed at the offer's price, with the offer's source and date — read back from the instance
    again = gcp_cloud.list_nodes(CID)[0]
    for node in (n, again):
        assert node.usd_per_hour == pytest.approx(16.96648)
        assert node.extra["price_source"] == o.source and node.extra["price_as_of"] == o.as_of


def test_external_ip_only_when_asked(gcp_fake, monkeypatch):
    from google.auth.credentials import AnonymousCredentials

    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    monkeypatch.setenv("SPOTWISE_GCP_EXTERNAL_IP", "1")
    cloud = GcpCloud(project="proj-1", credentials=AnonymousCredentials(), endpoint=gcp_fake.endpoint)
    cloud.launch(_req(offer("gcp", "a2-highgpu-8g", "us-central1", ZONE)))
    assert _inserted(gcp_fake)[0]["networkInterfaces"][0]["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"


def test_exhausted_zone_is_a_capacity_error_and_the_next_zone_serves(gcp_cloud, gcp_fake):
    gcp_fake.set_no_capacity([f"{ZONE}:SPOT"])
    with pytest.raises(CapacityError) as ei:
        gcp_cloud.launch(_req(offer("gcp", "a2-highgpu-8g", "us-central1", ZONE)))
    assert ei.value.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    [n] = gcp_cloud.launch(_req(offer("gcp", "a2-highgpu-8g", "us-central1", "us-central1-b")))
    assert n.zone == "us-central1-b"
    # on-demand in the exhausted zone is not affected
    [od] = gcp_cloud.launch(_req(offer("gcp", "a2-highgpu-8g", "us-central1", ZONE, market="on-demand")))
    assert od.zone == ZONE and od.market == "on-demand"


def test_preemption_deletes_the_spot_vm_and_is_told_from_a_loss(gcp_cloud, gcp_fake):
    spot = gcp_cloud.launch(_req(offer("gcp", "a2-highgpu-8g", "us-central1", ZONE), count=2))
    gcp_fake.preempt(ZONE, spot[0].instance_id)
    gcp_fake.reclaim(ZONE, spot[0].instance_id)
    live = {n.instance_id for n in gcp_cloud.list_nodes(CID)}
    assert spot[0].instance_id not in live and spot[1].instance_id in live
    assert not any(d["name"] == spot[0].instance_id for d in gcp_fake.disks.values())   # auto-deleted
    assert gcp_cloud.was_preempted(spot[0]) is True
    gcp_cloud.terminate([spot[1]])                      # ended by us: no preemption recorded
    assert gcp_cloud.was_preempted(spot[1]) is False


def test_cleanup_and_gc_leave_nothing(gcp_cloud, gcp_fake, home):
    gcp_cloud.prepare_cluster(CID, "job-9", "us-central1")
    gcp_cloud.prepare_cluster("swother00001", "job-x", "us-central1")
    nodes = gcp_cloud.launch(_req(offer("gcp", "a2-highgpu-8g", "us-central1", ZONE)))
    # what a crashed insert can leave: a detached labelled disk, and a labelled address
    gcp_fake.disks[("proj-1", ZONE, "orphan")] = {"name": "orphan", "zone": f"zones/{ZONE}", "users": [],
                                                  "labels": {"spotwise-cluster": CID}}
    gcp_fake.addresses[("proj-1", "us-central1", "addr")] = {"name": "addr", "labels": {"spotwise-cluster": CID}}
    gcp_cloud.terminate(nodes)
    deleted = gcp_cloud.cleanup_cluster(CID)
    assert sorted(d.split()[1] for d in deleted) == ["address", "disk", "firewall", "firewall", "firewall"]
    assert not gcp_fake.disks and not gcp_fake.addresses
    assert {name for (_, name) in gcp_fake.firewalls} == {*firewall_names("swother00001"),
                                                          ssh_firewall_name("swother00001")}

    # gc: the other cluster's rules go unless its cluster is live
    kept = gc(live={"swother00001"}, clouds=["gcp"], cloud_factory=lambda _: gcp_cloud)
    assert kept.extra_deleted == [] and gcp_fake.firewalls
    dry = gc(everything=True, dry_run=True, clouds=["gcp"], cloud_factory=lambda _: gcp_cloud)
    assert len(dry.extra_deleted) == 3 and gcp_fake.firewalls
    swept = gc(everything=True, clouds=["gcp"], cloud_factory=lambda _: gcp_cloud)
    assert len(swept.extra_deleted) == 3 and not gcp_fake.firewalls and not swept.skipped


def test_down_ends_nodes_and_rules_of_one_cluster(gcp_cloud, gcp_fake, home):
    gcp_cloud.prepare_cluster(CID, "job-9", "us-central1")
    gcp_cloud.launch(_req(offer("gcp", "a2-highgpu-8g", "us-central1", ZONE), count=2))
    sweep = down(CID, clouds=["gcp"], cloud_factory=lambda _: gcp_cloud)
    assert len(sweep.ended) == 2 and len(sweep.extra_deleted) == 3 and not sweep.skipped
    assert gcp_fake.instances == {} and gcp_fake.disks == {} and gcp_fake.firewalls == {}


# -- the controller's custom role (infra/gcp) covers every call, and nothing unused --------------
ROUTES = [  # (method, path pattern under projects/P) -> IAM permission
    ("POST", r"/zones/[^/]+/instances", "compute.instances.create"),
    ("GET", r"/zones/[^/]+/instances/[^/]+", "compute.instances.get"),
    ("DELETE", r"/zones/[^/]+/instances/[^/]+", "compute.instances.delete"),
    ("GET", r"/aggregated/instances", "compute.instances.list"),
    ("GET", r"/aggregated/disks", "compute.disks.list"),
    ("DELETE", r"/zones/[^/]+/disks/[^/]+", "compute.disks.delete"),
    ("GET", r"/aggregated/addresses", "compute.addresses.list"),
    ("GET", r"/aggregated/routers", "compute.routers.list"),          # the plan: which regions have Cloud NAT
    ("DELETE", r"/regions/[^/]+/addresses/[^/]+", "compute.addresses.delete"),
    ("POST", r"/global/firewalls", "compute.firewalls.create"),
    ("GET", r"/global/firewalls", "compute.firewalls.list"),
    ("DELETE", r"/global/firewalls/[^/]+", "compute.firewalls.delete"),
    ("GET", r"/regions/[^/]+/subnetworks", "compute.subnetworks.list"),
    ("GET", r"/zones/[^/]+/operations", "compute.zoneOperations.list"),
    ("(GET|POST)", r"/zones/[^/]+/operations/[^/]+(/wait)?", "compute.zoneOperations.get"),
    ("(GET|POST)", r"/global/operations/[^/]+(/wait)?", "compute.globalOperations.get"),
    ("(GET|POST)", r"/regions/[^/]+/operations/[^/]+(/wait)?", "compute.regionOperations.get"),
]
IMPLIED = {  # what Compute Engine checks besides the call's own permission, and why
    "compute.instances.setLabels": "insert with labels",
    "compute.instances.setMetadata": "insert with metadata (startup-script)",
    "compute.instances.setServiceAccount": "insert with the node service account",
    "compute.instances.setTags": "insert with the cluster's network tag",
    "compute.disks.create": "insert creates the boot disk",
    "compute.disks.setLabels": "the boot disk's labels",
    "compute.subnetworks.use": "insert attaches a NIC to the subnetwork",
    "compute.images.useReadOnly": "the boot disk's source image",
    "compute.machineTypes.get": "insert resolves the machine type",
    "compute.networks.updatePolicy": "creating or deleting a firewall rule on the network",
    "compute.networks.get": "the network named in a firewall rule",
    "compute.firewalls.get": "re-reading a rule that already exists (prepare_cluster is idempotent)",
    "compute.subnetworks.useExternalIp": "insert of a head with an external address (the ssh head path)",
    "compute.networks.useExternalIp": "insert of a head with an external address (the ssh head path)",
}


def _role_permissions() -> set[str]:
    import re
    from pathlib import Path

    tf = (Path(__file__).resolve().parents[4] / "infra" / "gcp" / "main.tf").read_text()
    block = tf[tf.index('resource "google_project_iam_custom_role"'):]
    block = block[:block.index("\n}\n")]
    return set(re.findall(r'"(compute\.[A-Za-z.]+)"', block))


def test_controller_role_covers_every_call_and_nothing_else(gcp_cloud, gcp_fake):
    import re

    gcp_fake.add_router("proj-1", "us-central1")
    assert gcp_cloud.outbound_problem("us-central1") is None          # what the plan asks first
    gcp_cloud.prepare_cluster(CID, "job-9", "us-central1")
    spot = gcp_cloud.launch(_req(offer("gcp", "a2-highgpu-8g", "us-central1", ZONE), count=2))
    gcp_fake.preempt(ZONE, spot[0].instance_id)
    gcp_fake.reclaim(ZONE, spot[0].instance_id)
    assert gcp_cloud.was_preempted(spot[0])
    gcp_fake.disks[("proj-1", ZONE, "orphan")] = {"name": "orphan", "users": [], "labels": {"spotwise-cluster": CID}}
    gcp_fake.addresses[("proj-1", "us-central1", "a")] = {"name": "a", "labels": {"spotwise-cluster": CID}}
    down(CID, clouds=["gcp"], cloud_factory=lambda _: gcp_cloud)
    gc(everything=True, clouds=["gcp"], cloud_factory=lambda _: gcp_cloud)

    used = set()
    for r in gcp_fake.requests:
        path = r["path"].split("/projects/proj-1", 1)[1]
        hits = [perm for method, pat, perm in ROUTES if re.fullmatch(method, r["method"]) and re.fullmatch(pat, path)]
        assert hits, f"no permission mapped for {r['method']} {path}"
        used.add(hits[0])
    role = _role_permissions()
    assert used <= role, sorted(used - role)
    assert role - used <= set(IMPLIED), sorted(role - used - set(IMPLIED))


def test_dead_mans_switch_deletes_its_own_instance_through_the_compute_api(gcp_cloud, gcp_fake):
    """On GCP a guest shutdown leaves the VM TERMINATED with its boot disk billed, so a node whose
    runner died deletes its own instance: its service account's token, project, zone and name from
    the metadata server, DELETE at the Compute API. A token without the compute scope is refused."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from emulator.gcp_metadata import GcpMetadataServer
    from spotwise.runtime.node.deadman import gcp_delete_self

    [node] = gcp_cloud.launch(_req(offer("gcp", "a2-highgpu-1g", "us-central1", "us-central1-a", usd=1.0)))
    [body] = _inserted(gcp_fake)
    script = next(i["value"] for i in body["metadata"]["items"] if i["key"] == "startup-script")
    assert "--self-end gcp" in script
    assert {"key": "install-nvidia-driver", "value": "True"} in body["metadata"]["items"]   # a GPU machine
    md = GcpMetadataServer().start()
    try:
        md.set_instance(node.instance_id, instance_id="1", zone="us-central1-a", ip="127.0.0.9", attributes={},
                        project="proj-1", scopes=["https://www.googleapis.com/auth/devstorage.read_write"])
        with pytest.raises(OSError, match="could not delete this instance"):
            gcp_delete_self(md.base_url(node.instance_id), compute_url=gcp_fake.endpoint)
        assert gcp_cloud.list_nodes(node.cluster_id)
        md.set_instance(node.instance_id, instance_id="1", zone="us-central1-a", ip="127.0.0.9", attributes={},
                        project="proj-1", scopes=body["serviceAccounts"][0]["scopes"])
        assert gcp_delete_self(md.base_url(node.instance_id), compute_url=gcp_fake.endpoint) == \
            f"proj-1/us-central1-a/{node.instance_id}"
    finally:
        md.stop()
    assert gcp_cloud.list_nodes(node.cluster_id) == []
    deletes = [r for r in gcp_fake.requests if r["method"] == "DELETE" and "/instances/" in r["path"]]
    assert deletes[-1]["auth"] == f"Bearer emu-{node.instance_id}-compute"


def test_a_head_over_ssh_gets_an_external_address_port_22_from_the_launcher_only_and_the_clusters_key(
        gcp_cloud, gcp_fake, monkeypatch, tmp_path):
    """The default head path (ssh): a third rule opens port 22 to the launcher's address only, the
    head (not a worker) gets an external address and authorizes the cluster's key in its
    startup-script, the node carries the address GCE gave it; the cluster's end deletes the rule and
    the key. ``SPOTWISE_HEAD_PATH=private``: none of it."""
    from spotwise.provisioner import head_path as hp

    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    monkeypatch.setenv("SPOTWISE_LAUNCHER_CIDR", "198.51.100.4/32")
    gcp_cloud.prepare_cluster(CID, "job-9", "us-central1")
    rule = gcp_fake.firewalls[("proj-1", ssh_firewall_name(CID))]
    assert rule["sourceRanges"] == ["198.51.100.4/32"] and rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert rule["targetTags"] == [network_tag(CID)]
    o = offer("gcp", "n2-standard-2", "us-central1", ZONE, market="on-demand")
    [head] = gcp_cloud.launch(_req(o, role="head"))
    [worker] = gcp_cloud.launch(_req(o, head_address=f"{head.address}:6379"))
    head_body, worker_body = _inserted(gcp_fake)
    assert head_body["networkInterfaces"][0]["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"
    assert not worker_body["networkInterfaces"][0].get("accessConfigs")
    script = {i["key"]: i["value"] for i in head_body["metadata"]["items"]}["startup-script"]
    assert hp.authorized_key_line(CID) in script
    assert head.extra["public_address"] and "public_address" not in worker.extra
    # the head's address is billed, the worker has none to bill
    assert [c.kind for c in gcp_cloud.node_charges("us-central1", "on-demand", public_ip=head.extra["public_ip"])
            ].count("ipv4") == 1 and worker.extra["public_ip"] is False
    gcp_cloud.terminate([head, worker])
    gcp_cloud.cleanup_cluster(CID)
    assert gcp_fake.firewalls == {} and not hp.key_path(CID).exists()

    monkeypatch.setenv("SPOTWISE_HEAD_PATH", "private")
    gcp_fake.requests.clear()
    gcp_cloud.prepare_cluster("swprivate001", "job-9", "us-central1")
    assert len(gcp_fake.firewalls) == 2
    gcp_cloud.launch(LaunchRequest(cluster_id="swprivate001", job_id="job-9", offer=o, role="head"))
    assert not _inserted(gcp_fake)[0]["networkInterfaces"][0].get("accessConfigs")

"""GCP provisioner through the real google-cloud-compute REST client against a local fake."""

from __future__ import annotations

import pytest

from helpers import offer
from spotwise.errors import InputError
from spotwise.provisioner.base import (TAG_CLUSTER, TAG_JOB, AuthError, CapacityError, LaunchRequest,
                                       QuotaError)

ZONE = "us-central1-a"


def _req(o, count=2, role="head", **kw) -> LaunchRequest:
    return LaunchRequest(cluster_id="c-gcp1", job_id="job-2", offer=o, count=count, role=role, **kw)


def test_spot_launch_list_terminate(gcp_cloud, gcp_fake):
    o = offer("gcp", "a3-highgpu-8g", "us-central1", ZONE, usd=31.25)
    nodes = gcp_cloud.launch(_req(o, count=2, role="worker", head_address="10.0.0.9:6379"))
    assert len(nodes) == 2 and all(n.state == "running" and n.address for n in nodes)
    assert all(n.usd_per_hour == 31.25 and n.market == "spot" and n.zone == ZONE for n in nodes)

    inserts = [r for r in gcp_fake.requests if r["method"] == "POST" and r["path"].endswith("/instances")]
    assert len(inserts) == 2
    body = inserts[0]["body"]
    assert inserts[0]["path"] == f"/compute/v1/projects/proj-1/zones/{ZONE}/instances"
    assert body["scheduling"]["provisioningModel"] == "SPOT"
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/a3-highgpu-8g"
    assert body["labels"][TAG_CLUSTER] == "c-gcp1" and body["labels"][TAG_JOB] == "job-2"
    meta = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert 'ray.scripts.scripts start --address="$HEAD"' in meta["startup-script"] and meta["spotwise-head"] == "10.0.0.9:6379"
    assert "--cloud gcp" in meta["startup-script"]
    assert body["disks"][0]["initializeParams"]["labels"][TAG_CLUSTER] == "c-gcp1"
    # operations were polled through our own ZoneOperationsClient on the fake endpoint
    assert any(r["path"].endswith("/wait") for r in gcp_fake.requests)

    assert sorted(n.instance_id for n in gcp_cloud.list_nodes("c-gcp1")) == sorted(n.instance_id for n in nodes)
    assert gcp_cloud.list_nodes("other") == []
    gcp_cloud.terminate(nodes)
    gcp_cloud.terminate(nodes)  # idempotent: 404s are fine
    assert gcp_fake.running() == []


def test_on_demand_is_standard(gcp_cloud, gcp_fake):
    nodes = gcp_cloud.launch(_req(offer("gcp", "a2-highgpu-1g", "us-central1", ZONE, market="on-demand"), count=1))
    body = next(r["body"] for r in gcp_fake.requests if r["method"] == "POST" and r["body"])
    assert body["scheduling"]["provisioningModel"] == "STANDARD"
    assert "instanceTerminationAction" not in body["scheduling"]
    gcp_cloud.terminate(nodes)
    assert gcp_fake.running() == []


@pytest.mark.parametrize("kind,exc,code", [
    ("capacity", CapacityError, "ZONE_RESOURCE_POOL_EXHAUSTED"),
    ("capacity-details", CapacityError, "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"),
    ("quota", QuotaError, "QUOTA_EXCEEDED"),
    ("quota-http", QuotaError, "quotaExceeded"),
    ("auth", AuthError, "authError"),
    ("forbidden", AuthError, "forbidden"),
])
def test_errors_map_by_code(gcp_cloud, gcp_fake, kind, exc, code):
    gcp_fake.queue_error("insert", kind)
    with pytest.raises(exc) as ei:
        gcp_cloud.launch(_req(offer("gcp", "a3-highgpu-8g", "us-central1", ZONE), count=1))
    assert ei.value.code == code and ei.value.cloud == "gcp"
    assert gcp_fake.running() == []


def test_partial_then_capacity_returns_what_came_up(gcp_cloud, gcp_fake):
    o = offer("gcp", "a3-highgpu-8g", "us-central1", ZONE)
    orig = gcp_fake._route
    calls = {"n": 0}

    def second_insert_fails(method, path, query, body):
        if method == "POST" and path.endswith("/instances"):
            calls["n"] += 1
            if calls["n"] == 2:
                gcp_fake.queue_error("insert", "capacity")
        return orig(method, path, query, body)

    gcp_fake._route = second_insert_fails
    nodes = gcp_cloud.launch(_req(o, count=3, role="worker"))
    assert len(nodes) == 1
    gcp_cloud.terminate(nodes)
    assert gcp_fake.running() == []


def test_throttling_retried(gcp_cloud, gcp_fake):
    gcp_fake.queue_error("insert", "throttle", times=2)
    nodes = gcp_cloud.launch(_req(offer("gcp", "a3-highgpu-8g", "us-central1", ZONE), count=1))
    assert len(nodes) == 1 and len(gcp_cloud.slept) == 2
    gcp_cloud.terminate(nodes)


def test_bad_input_before_any_call(gcp_cloud, gcp_fake):
    with pytest.raises(InputError) as ei:
        gcp_cloud.launch(_req(offer("gcp", "p4d.24xlarge", "us-central1", ZONE)))
    assert "a3-highgpu-8g" in str(ei.value)
    with pytest.raises(InputError) as ei:   # a3-ultragpu (H200) is not sold in every region
        gcp_cloud.launch(_req(offer("gcp", "a2-megagpu-16g", "southamerica-east1", "southamerica-east1-a")))
    assert "region" in str(ei.value)
    with pytest.raises(InputError):
        gcp_cloud.launch(_req(offer("gcp", "a3-highgpu-8g", "us-central1", "")))
    assert gcp_fake.requests == []


def test_missing_credentials(monkeypatch, tmp_path):
    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    monkeypatch.delenv("SPOTWISE_GCP_ANONYMOUS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    cloud = GcpCloud(project="p", endpoint="http://127.0.0.1:9")
    with pytest.raises(AuthError) as ei:
        cloud.launch(_req(offer("gcp", "a3-highgpu-8g", "us-central1", ZONE)))
    assert "credentials" in str(ei.value)


@pytest.mark.parametrize("machine,disk,nic", [
    ("a3-highgpu-8g", "pd-balanced", "GVNIC"),
    ("a3-megagpu-8g", "pd-balanced", "GVNIC"),
    ("a3-edgegpu-8g", "pd-balanced", "GVNIC"),
    ("a3-ultragpu-8g", "hyperdisk-balanced", "GVNIC"),
    ("a2-highgpu-1g", "pd-balanced", None),
    ("g2-standard-4", "pd-balanced", None),
    ("n2-standard-2", "pd-balanced", None),
])
def test_each_series_gets_a_boot_disk_and_interface_gce_accepts(gcp_cloud, gcp_fake, machine, disk, nic):
    """Failed before the fix for A3 and G2: the boot disk had no type (pd-standard) and A3's
    interface none (VIRTIO_NET), and the emulated GCE refused the insert as GCE does."""
    [node] = gcp_cloud.launch(_req(offer("gcp", machine, "us-central1", ZONE), count=1, role="worker",
                                   head_address="10.0.0.9:6379"))
    body = next(r["body"] for r in gcp_fake.requests if r["method"] == "POST" and r["path"].endswith("/instances"))
    assert body["disks"][0]["initializeParams"]["diskType"] == f"zones/{ZONE}/diskTypes/{disk}"
    assert body["networkInterfaces"][0].get("nicType") == nic
    gcp_cloud.terminate([node])


@pytest.mark.parametrize("machine,disk,nic,refused", [
    ("a3-highgpu-8g", None, "GVNIC", "[pd-standard, a3-highgpu-8g]"),
    ("g2-standard-4", "pd-standard", None, "[pd-standard, g2-standard-4]"),
    ("a3-ultragpu-8g", "pd-balanced", "GVNIC", "[pd-balanced, a3-ultragpu-8g]"),
    ("a3-highgpu-8g", "pd-balanced", None, "[VIRTIO_NET, a3-highgpu-8g]"),
    ("a2-highgpu-1g", "pd-standard", None, None),
    ("n1-standard-4", None, None, None),
])
def test_the_emulated_gce_refuses_what_gce_refuses(gcp_fake, machine, disk, nic, refused):
    """The fake's own rule, over the wire: a 400 with GCE's message, nothing created."""
    import json
    import urllib.error
    import urllib.request

    params: dict = {"sourceImage": "projects/x/global/images/y"}
    if disk:
        params["diskType"] = f"zones/{ZONE}/diskTypes/{disk}"
    iface: dict = {"network": "global/networks/default"}
    if nic:
        iface["nicType"] = nic
    body = {"name": f"t-{machine}", "machineType": f"zones/{ZONE}/machineTypes/{machine}",
            "disks": [{"boot": True, "autoDelete": True, "initializeParams": params}], "networkInterfaces": [iface]}
    req = urllib.request.Request(f"{gcp_fake.endpoint}/compute/v1/projects/proj-1/zones/{ZONE}/instances",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status, answer = r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        status, answer = e.code, json.loads(e.read())
    if refused is None:
        assert status == 200 and len(gcp_fake.instances) == 1
    else:
        assert status == 400 and answer["error"]["message"] == \
            f"{refused} features are not compatible for creating instance."
        assert gcp_fake.instances == {} and gcp_fake.disks == {}

"""What a training run needs of Azure beyond launch/terminate, through the real azure-mgmt clients
against the ARM fake: the head offer, the cluster's NSG, launch prices, eviction, cleanup and gc."""

from __future__ import annotations

import base64

import pytest

from helpers import offer
from spotwise.errors import InputError
from spotwise.provisioner import reconcile
from spotwise.provisioner.base import CapacityError, LaunchRequest

SIZE = "Standard_ND96asr_v4"


def _req(o, *, count=1, role="worker", cluster="c-az2", head=None) -> LaunchRequest:
    return LaunchRequest(cluster_id=cluster, job_id="job-7", offer=o, count=count, role=role, head_address=head)


def test_head_offer_is_a_priced_on_demand_cpu_vm(azure_cloud):
    o = azure_cloud.head_offer("westus2", "")
    assert (o.cloud, o.instance_type, o.market.value, o.accelerator_count) == ("azure", "Standard_D2s_v5", "on-demand", 0)
    assert o.usd_per_hour > 0 and "Standard_D2s_v5" in o.source and o.as_of
    far = azure_cloud.head_offer("westus3", "")          # no row: eastus's price, and the source says so
    assert far.usd_per_hour == azure_cloud.head_offer("eastus", "").usd_per_hour
    assert "eastus price assumed for westus3" in far.source


def test_head_type_without_a_price_is_an_input_error(azure_fake, monkeypatch):
    from spotwise.provisioner.clouds.azure.cloud import AzureCloud

    monkeypatch.setenv("SPOTWISE_AZURE_HEAD_TYPE", "Standard_B1s")
    with pytest.raises(InputError) as ei:
        AzureCloud(subscription_id="s", endpoint=azure_fake.endpoint).head_offer("eastus", "")
    assert "SPOTWISE_AZURE_HEAD_TYPE" in str(ei.value) and "Standard_D2s_v5" in str(ei.value)


@pytest.mark.parametrize("var,value", [("SPOTWISE_AZURE_CLIENT_CIDRS", "10.0.0.0/33"),
                                       ("SPOTWISE_AZURE_VNET_CIDR", "not-a-cidr"),
                                       ("SPOTWISE_RAY_DASHBOARD_PORT", "70000")])
def test_bad_network_settings_name_the_variable(var, value, monkeypatch):
    from spotwise.provisioner.clouds.azure.cloud import AzureCloud

    monkeypatch.setenv(var, value)
    with pytest.raises(InputError) as ei:
        AzureCloud(subscription_id="s")
    assert var in str(ei.value)


def _cloud(azure_cloud, azure_fake, **kw):
    """A second AzureCloud on the same fake, built after the test set its environment."""
    from spotwise.provisioner.clouds.azure.cloud import AzureCloud

    return AzureCloud(subscription_id="sub-1", resource_group="rg-1", credential=azure_cloud._credential,
                      endpoint=azure_fake.endpoint, sleep=lambda s: None, **kw)


def test_cluster_nsg_opens_ports_only_to_the_subnet_and_clients(azure_cloud, azure_fake, monkeypatch):
    monkeypatch.setenv("SPOTWISE_AZURE_CLIENT_CIDRS", "192.168.7.0/24")
    monkeypatch.setenv("SPOTWISE_AZURE_VNET_CIDR", "127.18.0.0/16")
    monkeypatch.setenv("SPOTWISE_RAY_DASHBOARD_PORT", "18265")
    monkeypatch.setenv("SPOTWISE_CONTROL_PORT", "18266")
    monkeypatch.setenv("SPOTWISE_HEAD_PATH", "private")         # a launcher inside the VNet (ssh: below)
    cloud = _cloud(azure_cloud, azure_fake)
    cloud.prepare_cluster("c-az2", "job-7", "eastus")
    cloud.prepare_cluster("c-az2", "job-7", "eastus")          # idempotent: one PUT
    nsg_puts = [r for r in azure_fake.requests if r["method"] == "PUT" and "networkSecurityGroups" in r["path"]]
    assert len(nsg_puts) == 1 and nsg_puts[0]["path"].endswith("/spotwise-c-az2-eastus")
    rules = {r["name"]: r["properties"] for r in nsg_puts[0]["body"]["properties"]["securityRules"]}
    assert rules["spotwise-cluster"]["sourceAddressPrefixes"] == ["127.18.0.0/20"]
    assert rules["spotwise-cluster"]["access"] == "Allow"
    orch = rules["spotwise-orchestrator"]
    assert orch["sourceAddressPrefixes"] == ["192.168.7.0/24"]
    assert sorted(orch["destinationPortRanges"]) == ["18265", "18266"]
    deny = rules["spotwise-deny-rest"]
    assert deny["access"] == "Deny" and deny["priority"] > max(orch["priority"], rules["spotwise-cluster"]["priority"])
    assert deny["priority"] < 65000            # before Azure's default AllowVnetInBound

    [node] = cloud.launch(_req(offer("azure", SIZE, "eastus", usd=3.5), role="head"))
    assert node.address == "127.18.0.4"         # the subnet's first usable address (Azure keeps .0-.3)
    nic = next(r["body"] for r in azure_fake.requests if r["method"] == "PUT" and "networkInterfaces" in r["path"])
    assert nic["properties"]["networkSecurityGroup"]["id"].endswith("/spotwise-c-az2-eastus")
    assert all("publicIPAddress" not in c["properties"] for c in nic["properties"]["ipConfigurations"])
    vm = next(r["body"] for r in azure_fake.requests if r["method"] == "PUT" and "virtualMachines" in r["path"])
    script = base64.b64decode(vm["properties"]["osProfile"]["customData"]).decode()
    assert "--dashboard-port=18265" in script
    ep = cloud.endpoint("c-az2", node)          # the head's private address, the configured ports
    assert (ep.dashboard_url, ep.control_url) == ("http://127.18.0.4:18265", "http://127.18.0.4:18266")
    cloud.terminate([node])
    assert cloud.cleanup_cluster("c-az2") == ["azure network security group spotwise-c-az2-eastus"]
    assert azure_fake.nsgs() == [] and azure_fake.vms() == [] and azure_fake.disks() == []


def test_node_price_is_the_offers_with_its_source(azure_cloud, azure_fake):
    o = offer("azure", SIZE, "eastus", usd=5.98334)
    [node] = azure_cloud.launch(_req(o))
    assert node.usd_per_hour == 5.98334 and node.extra == {"price_source": "test", "price_as_of": "2025-01-01", "public_ip": False}
    [listed] = azure_cloud.list_nodes("c-az2")        # read back from the VM's tags
    assert listed.usd_per_hour == 5.98334 and listed.extra["price_source"] == "test"
    azure_cloud.terminate([node])


def test_watcher_acknowledges_after_the_runs_checkpoint(azure_cloud, azure_fake):
    cloud = _cloud(azure_cloud, azure_fake, run_storage="s3://ckpt/runs/")
    [node] = cloud.launch(_req(offer("azure", SIZE, "eastus"), head="127.18.0.4:6379"))
    vm = next(r["body"] for r in azure_fake.requests if r["method"] == "PUT" and "virtualMachines" in r["path"])
    script = base64.b64decode(vm["properties"]["osProfile"]["customData"]).decode()
    assert "--ack-after-checkpoint s3://ckpt/runs/job-7" in script
    cloud.terminate([node])


def test_eviction_deletes_the_vm_with_its_nic_and_disk(azure_cloud, azure_fake):
    [node] = azure_cloud.launch(_req(offer("azure", SIZE, "eastus")))
    assert len(azure_fake.disks()) == 1 and azure_fake.disks()[0]["name"] == f"{node.instance_id}-osdisk"
    assert azure_fake.evict(node.instance_id)
    assert azure_cloud.list_nodes("c-az2") == []
    assert azure_fake.vms() == azure_fake.nics() == azure_fake.disks() == []
    assert azure_cloud.was_preempted(node)


def test_capacity_per_size_region_and_priority(azure_cloud, azure_fake):
    azure_fake.set_no_capacity({(SIZE, "eastus", "Spot"): "sku", (SIZE, "westus2", "Spot"): "allocation"})
    with pytest.raises(CapacityError) as ei:
        azure_cloud.launch(_req(offer("azure", SIZE, "eastus")))
    assert ei.value.code == "SkuNotAvailable"
    with pytest.raises(CapacityError) as ei:
        azure_cloud.launch(_req(offer("azure", SIZE, "westus2")))
    assert ei.value.code == "AllocationFailed"
    [od] = azure_cloud.launch(_req(offer("azure", SIZE, "eastus", market="on-demand")))   # Regular is fine
    azure_cloud.terminate([od])
    assert azure_fake.vms() == azure_fake.nics() == azure_fake.disks() == []


def test_cleanup_and_gc_sweep_what_a_cluster_left(azure_cloud, azure_fake, home):
    """A disk kept by a VM whose delete option was not Delete, a tagged public IP, a stray NIC and
    the NSG: ``cleanup_cluster`` deletes one cluster's, ``gc`` every cluster no live job owns."""
    for cid in ("c-dead", "c-live"):
        azure_cloud.prepare_cluster(cid, "job-7", "eastus")
        [n] = azure_cloud.launch(_req(offer("azure", SIZE, "eastus"), cluster=cid))
        with azure_fake._lock:   # as if the VM had been created with deleteOption=Detach on its disk
            azure_fake.resources[f"virtualmachines/{n.instance_id.lower()}"]["properties"]["storageProfile"][
                "osDisk"]["deleteOption"] = "Detach"
            ip = f"/subscriptions/sub-1/resourceGroups/rg-1/providers/Microsoft.Network/publicIPAddresses/{cid}-ip"
            azure_fake.resources[f"publicipaddresses/{cid}-ip"] = {
                "id": ip, "name": f"{cid}-ip", "location": "eastus", "tags": {"spotwise-cluster": cid},
                "properties": {"provisioningState": "Succeeded"}}
    dead = azure_cloud.list_nodes("c-dead")
    azure_cloud.terminate(dead)
    assert any(d["name"].startswith("sw-c-dead-") for d in azure_fake.disks())   # detached, not deleted
    sweep = reconcile.gc(clouds=("azure",), live={"c-live"}, dry_run=True, cloud_factory=lambda _: azure_cloud)
    assert sorted(x.split()[1] for x in sweep.extra_deleted) == ["disk", "network", "public"]
    assert len(azure_fake.disks()) == 2                                          # dry run: nothing deleted
    sweep = reconcile.gc(clouds=("azure",), live={"c-live"}, cloud_factory=lambda _: azure_cloud)
    assert sweep.skipped == {}
    left = {r["name"] for kind in ("disks", "nsgs", "public_ips") for r in getattr(azure_fake, kind)()}
    assert not any("c-dead" in x for x in left) and any("c-live" in x for x in left)
    # the live cluster ends: down takes its VM, then its disk, IP and NSG
    sweep = reconcile.down("c-live", clouds=("azure",), cloud_factory=lambda _: azure_cloud)
    assert len(sweep.ended) == 1 and sweep.skipped == {}
    assert azure_fake.vms() == azure_fake.nics() == azure_fake.disks() == azure_fake.nsgs() == azure_fake.public_ips() == []


def test_dead_mans_switch_deletes_its_own_vm_through_arm(azure_cloud, azure_fake, monkeypatch):
    """On Azure a guest shutdown leaves the VM allocated (billing), so a node whose runner died
    deletes its own VM: a token from IMDS for the node's managed identity, its resource id from
    IMDS, DELETE on it at ARM. Without an identity IMDS refuses and the switch says so."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from emulator.azure_imds import AzureImds
    from spotwise.runtime.node.deadman import azure_delete_self

    ident = "/subscriptions/sub-1/resourceGroups/rg-1/providers/Microsoft.ManagedIdentity/userAssignedIdentities/sw"
    monkeypatch.setenv("SPOTWISE_AZURE_NODE_IDENTITY", ident)
    cloud = _cloud(azure_cloud, azure_fake)
    [node] = cloud.launch(_req(offer("azure", SIZE, "eastus", usd=3.5)))
    put = next(r["body"] for r in azure_fake.requests if r["method"] == "PUT" and "virtualMachines" in r["path"])
    assert put["identity"] == {"type": "UserAssigned", "userAssignedIdentities": {ident: {}}}
    script = base64.b64decode(put["properties"]["osProfile"]["customData"]).decode()
    assert "--self-end azure" in script
    [vm] = azure_fake.vms()
    imds = AzureImds().start()
    try:
        imds.set_vm(node.instance_id, private_ip="127.0.0.9", tags={}, resource_id=vm["id"], identity=False)
        with pytest.raises(OSError, match="could not delete this VM"):
            azure_delete_self(imds.base_url(node.instance_id), arm_url=azure_fake.endpoint)
        assert len(azure_fake.vms()) == 1
        imds.set_vm(node.instance_id, private_ip="127.0.0.9", tags={}, resource_id=vm["id"], identity=True)
        assert azure_delete_self(imds.base_url(node.instance_id), arm_url=azure_fake.endpoint) == vm["id"]
    finally:
        imds.stop()
    assert azure_fake.vms() == []
    deletes = [r for r in azure_fake.requests if r["method"] == "DELETE" and "virtualMachines" in r["path"]]
    assert deletes and deletes[-1]["path"].lower() == vm["id"].lower()


def test_without_a_node_identity_azure_nodes_shut_down_instead(azure_cloud, azure_fake, monkeypatch):
    monkeypatch.delenv("SPOTWISE_AZURE_NODE_IDENTITY", raising=False)
    cloud = _cloud(azure_cloud, azure_fake)
    cloud.launch(_req(offer("azure", SIZE, "eastus", usd=3.5)))
    put = next(r["body"] for r in azure_fake.requests if r["method"] == "PUT" and "virtualMachines" in r["path"])
    assert "identity" not in put
    assert "--self-end azure" not in base64.b64decode(put["properties"]["osProfile"]["customData"]).decode()


def test_a_subnet_that_is_not_spotwises_survives_a_launch_and_the_teardown(azure_cloud, azure_fake):
    """ARM replaces a VNet's subnet list on PUT: spotwise adds only its own subnet, only if missing."""
    azure_fake.put_vnet("spotwise-eastus", "eastus", "10.42.0.0/16",
                        {"GatewaySubnet": "10.42.255.0/27", "ops": "10.42.128.0/24"})
    azure_cloud.prepare_cluster("c-az2", "job-az", "eastus")
    [node] = azure_cloud.launch(_req(offer("azure", "Standard_NC24ads_A100_v4", "eastus")))
    assert azure_fake.subnets("spotwise-eastus") == {"GatewaySubnet": "10.42.255.0/27", "ops": "10.42.128.0/24",
                                                     "nodes": azure_cloud.subnet_cidr}
    azure_cloud.terminate([node])
    azure_cloud.cleanup_cluster("c-az2")
    assert {"GatewaySubnet", "ops"} <= set(azure_fake.subnets("spotwise-eastus"))
    puts = [r["path"] for r in azure_fake.requests if r["method"] == "PUT" and "/virtualNetworks/" in r["path"]]
    assert puts == [p for p in puts if p.endswith("/subnets/nodes")] and len(puts) == 1   # never the VNet itself


def test_a_vnet_put_that_drops_a_subnet_in_use_fails_as_arm_does(azure_cloud, azure_fake):
    """The fake is as strict as ARM (so the test above would catch a VNet PUT): a PUT replaces the
    subnet list, and dropping a subnet a NIC uses is refused."""
    [node] = azure_cloud.launch(_req(offer("azure", "Standard_NC24ads_A100_v4", "eastus")))   # a new VNet
    err = azure_fake.put_vnet("spotwise-eastus", "eastus", "10.42.0.0/16", {"ops": "10.42.128.0/24"})
    assert err["error"]["code"] == "InUseSubnetCannotBeDeleted" and "nodes" in azure_fake.subnets("spotwise-eastus")
    azure_cloud.terminate([node])
    azure_fake.put_vnet("spotwise-eastus", "eastus", "10.42.0.0/16", {"ops": "10.42.128.0/24"})
    assert azure_fake.subnets("spotwise-eastus") == {"ops": "10.42.128.0/24"}        # replaced: nodes is gone


def test_a_head_over_ssh_gets_a_public_ip_port_22_from_the_launcher_only_and_the_clusters_key(
        azure_cloud, azure_fake, monkeypatch, tmp_path):
    """The default head path (ssh): the NSG allows port 22 from the launcher's address only (before
    its deny-all), the head's NIC gets a Standard static public IP of its own (a worker's none), its
    custom data authorizes the cluster's key, the node carries the address Azure gave it; the
    cluster's end deletes the IP and the key."""
    from spotwise.provisioner import head_path as hp

    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    monkeypatch.setenv("SPOTWISE_LAUNCHER_CIDR", "198.51.100.4")
    cloud = _cloud(azure_cloud, azure_fake)
    cloud.prepare_cluster("c-az2", "job-7", "eastus")
    nsg = next(r["body"] for r in azure_fake.requests if r["method"] == "PUT" and "networkSecurityGroups" in r["path"])
    rules = {r["name"]: r["properties"] for r in nsg["properties"]["securityRules"]}
    ssh = rules["spotwise-launcher-ssh"]
    assert (ssh["access"], ssh["sourceAddressPrefixes"], ssh["destinationPortRanges"]) == ("Allow", ["198.51.100.4/32"], ["22"])
    assert ssh["priority"] < rules["spotwise-deny-rest"]["priority"]
    [head] = cloud.launch(_req(offer("azure", "Standard_D2s_v5", "eastus", market="on-demand"), role="head"))
    [worker] = cloud.launch(_req(offer("azure", SIZE, "eastus", usd=3.5), head=f"{head.address}:6379"))
    ips = [r for r in azure_fake.requests if r["method"] == "PUT" and "publicIPAddresses" in r["path"]]
    assert len(ips) == 1 and ips[0]["body"]["sku"]["name"] == "Standard"
    assert ips[0]["body"]["properties"]["publicIPAllocationMethod"] == "Static"
    nics = [r["body"] for r in azure_fake.requests if r["method"] == "PUT" and "networkInterfaces" in r["path"]]
    assert nics[0]["properties"]["ipConfigurations"][0]["properties"]["publicIPAddress"]["id"].endswith(
        ips[0]["path"].rsplit("/", 1)[-1])
    assert "publicIPAddress" not in nics[1]["properties"]["ipConfigurations"][0]["properties"]
    vm = next(r["body"] for r in azure_fake.requests if r["method"] == "PUT" and "virtualMachines" in r["path"])
    assert hp.authorized_key_line("c-az2") in base64.b64decode(vm["properties"]["osProfile"]["customData"]).decode()
    assert head.extra["public_address"] and "public_address" not in worker.extra
    cloud.terminate([head, worker])
    cloud.cleanup_cluster("c-az2")
    assert azure_fake.public_ips() == [] and azure_fake.nics() == [] and not hp.key_path("c-az2").exists()

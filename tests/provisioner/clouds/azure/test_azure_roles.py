"""The Azure roles in infra/azure/main.tf cover every ARM call the code makes, and nothing unused.

Issue 29 asks for "a test that holds every API call the code makes against the role definitions".
The calls are the ones the real azure-mgmt clients send to the ARM fake while the controller walks
every path it has (a new VNet, a subnet added to an operator's VNet, the cluster's NSG, spot and
on-demand VMs with the node identity, an eviction, leftovers, ``down`` and ``gc``), and the one a
node sends to delete itself. Each request maps to its RBAC action by ARM's rule (GET read, PUT
write, DELETE delete of the resource type in the path); what ARM checks besides (a linked-access
check such as joining a subnet) is listed with its reason.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from helpers import offer
from spotwise.provisioner import reconcile
from spotwise.provisioner.base import LaunchRequest

TF = Path(__file__).resolve().parents[4] / "infra" / "azure" / "main.tf"
SIZE = "Standard_ND96asr_v4"
IDENT = "/subscriptions/sub-1/resourceGroups/rg-1/providers/Microsoft.ManagedIdentity/userAssignedIdentities/sw"
VERB = {"GET": "read", "PUT": "write", "DELETE": "delete"}

IMPLIED = {   # ARM's linked-access checks on a PUT, and why each applies
    "Microsoft.Network/virtualNetworks/subnets/join/action": "a NIC created in the spotwise subnet",
    "Microsoft.Network/networkSecurityGroups/join/action": "a NIC created with the cluster's NSG",
    "Microsoft.Network/networkInterfaces/join/action": "a VM created with its NIC",
    "Microsoft.Compute/disks/write": "a VM created with a managed OS disk creates the disk",
    "Microsoft.ManagedIdentity/userAssignedIdentities/assign/action": "a VM created with the node identity",
    "Microsoft.Network/publicIPAddresses/join/action": "a head's NIC created with its public IP",
}


def action(method: str, path: str) -> str:
    """``GET /subscriptions/S/resourceGroups/R/providers/Microsoft.Compute/virtualMachines/x`` ->
    ``Microsoft.Compute/virtualMachines/read``: the provider, then every resource type in the path
    (names dropped), then the verb."""
    m = re.search(r"/providers/(Microsoft\.[A-Za-z]+)/(.+)$", path.split("?")[0])
    assert m, f"not an ARM resource path: {path}"
    parts = m.group(2).strip("/").split("/")
    types = parts[0::2]     # type, name, subtype, name, ...
    return "/".join([m.group(1), *types, VERB[method]])


def roles() -> dict[str, set[str]]:
    """Each ``azurerm_role_definition`` in main.tf -> its actions."""
    out = {}
    tf = TF.read_text()
    for m in re.finditer(r'resource "azurerm_role_definition" "(\w+)" \{(.*?)\n\}\n', tf, re.S):
        out[m.group(1)] = set(re.findall(r'"(Microsoft\.[A-Za-z./]+)"', m.group(2)))
    return out


def _req(o, *, cluster="c-roles") -> LaunchRequest:
    return LaunchRequest(cluster_id=cluster, job_id="job-r", offer=o, count=1, role="worker", head_address=None)


def test_controller_and_node_roles_cover_every_call_and_nothing_else(azure_cloud, azure_fake, monkeypatch):
    from spotwise.provisioner.clouds.azure.cloud import AzureCloud

    monkeypatch.setenv("SPOTWISE_AZURE_NODE_IDENTITY", IDENT)
    cloud = AzureCloud(subscription_id="sub-1", resource_group="rg-1", credential=azure_cloud._credential,
                       endpoint=azure_fake.endpoint, sleep=lambda s: None)
    # an operator's VNet without spotwise's subnet (a subnet PUT) and a region with none (a VNet PUT)
    azure_fake.put_vnet("spotwise-eastus", "eastus", "10.42.0.0/16", {"ops": "10.42.128.0/24"})
    for region in ("eastus", "westus2"):
        cloud.prepare_cluster("c-roles", "job-r", region)
    [spot] = cloud.launch(_req(offer("azure", SIZE, "eastus")))
    [od] = cloud.launch(_req(offer("azure", SIZE, "westus2", market="on-demand")))
    # a head the launcher reaches over ssh (the default): its own public IP, joined to its NIC
    cloud.launch(LaunchRequest(cluster_id="c-roles", job_id="job-r", role="head",
                               offer=offer("azure", "Standard_D2s_v5", "eastus", market="on-demand")))
    assert azure_fake.evict(spot.instance_id) and cloud.was_preempted(spot)
    with azure_fake._lock:   # leftovers for the sweeps: a detached disk and a tagged public IP
        azure_fake.resources[f"virtualmachines/{od.instance_id.lower()}"]["properties"]["storageProfile"][
            "osDisk"]["deleteOption"] = "Detach"
        azure_fake.resources["publicipaddresses/c-roles-ip"] = {
            "id": "/subscriptions/sub-1/resourceGroups/rg-1/providers/Microsoft.Network/publicIPAddresses/c-roles-ip",
            "name": "c-roles-ip", "location": "eastus", "tags": {"spotwise-cluster": "c-roles"},
            "properties": {"provisioningState": "Succeeded"}}
    reconcile.down("c-roles", clouds=("azure",), cloud_factory=lambda _: cloud)
    reconcile.gc(clouds=("azure",), live=set(), cloud_factory=lambda _: cloud)
    assert azure_fake.vms() == azure_fake.disks() == azure_fake.public_ips() == azure_fake.nsgs() == []
    controller = {action(r["method"], r["path"]) for r in azure_fake.requests}

    # the node: its dead man's switch deletes its own VM with the node identity
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from emulator.azure_imds import AzureImds
    from spotwise.runtime.node.deadman import azure_delete_self

    [node] = cloud.launch(_req(offer("azure", SIZE, "eastus"), cluster="c-node"))
    [vm] = azure_fake.vms()
    before = len(azure_fake.requests)
    imds = AzureImds().start()
    try:
        imds.set_vm(node.instance_id, private_ip="127.0.0.9", tags={}, resource_id=vm["id"], identity=True)
        azure_delete_self(imds.base_url(node.instance_id), arm_url=azure_fake.endpoint)
    finally:
        imds.stop()
    node_calls = {action(r["method"], r["path"]) for r in azure_fake.requests[before:]}
    assert node_calls == {"Microsoft.Compute/virtualMachines/delete"}

    # the paths above reach every kind of call the controller makes (a guard against a thin scenario)
    assert {"Microsoft.Network/virtualNetworks/write", "Microsoft.Network/virtualNetworks/subnets/write",
            "Microsoft.Network/networkSecurityGroups/write", "Microsoft.Compute/virtualMachines/write",
            "Microsoft.Compute/disks/delete", "Microsoft.Network/publicIPAddresses/delete",
            "Microsoft.Network/publicIPAddresses/write"} <= controller
    have = roles()
    assert set(have) == {"spotwise", "node_self_delete"}, sorted(have)
    assert controller <= have["spotwise"], sorted(controller - have["spotwise"])
    assert have["spotwise"] - controller <= set(IMPLIED), sorted(have["spotwise"] - controller - set(IMPLIED))
    assert have["node_self_delete"] == node_calls, sorted(have["node_self_delete"] ^ node_calls)


def test_action_follows_arms_naming():
    base = "/subscriptions/s/resourceGroups/r/providers/"
    assert action("PUT", base + "Microsoft.Network/virtualNetworks/v/subnets/nodes?api-version=1") == \
        "Microsoft.Network/virtualNetworks/subnets/write"
    assert action("GET", base + "Microsoft.Compute/disks") == "Microsoft.Compute/disks/read"
    assert action("DELETE", base + "Microsoft.Compute/virtualMachines/sw-1") == \
        "Microsoft.Compute/virtualMachines/delete"

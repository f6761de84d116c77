"""Azure provisioner through the real azure-mgmt clients against a local ARM fake."""

from __future__ import annotations

import base64

import pytest

from helpers import offer
from spotwise.errors import InputError
from spotwise.provisioner.base import (TAG_CLUSTER, TAG_JOB, AuthError, CapacityError, LaunchRequest,
                                       QuotaError)

SIZE = "Standard_NC24ads_A100_v4"


def _req(o, count=2, role="head", **kw) -> LaunchRequest:
    return LaunchRequest(cluster_id="c-az1", job_id="job-3", offer=o, count=count, role=role, **kw)


def test_spot_vm_launch_list_terminate(azure_cloud, azure_fake):
    nodes = azure_cloud.launch(_req(offer("azure", SIZE, "eastus", usd=1.5), count=2))
    assert len(nodes) == 2 and all(n.address and n.usd_per_hour == 1.5 and n.market == "spot" for n in nodes)
    puts = [r for r in azure_fake.requests if r["method"] == "PUT" and "virtualMachines" in r["path"]]
    body = puts[0]["body"]
    props = body["properties"]
    assert props["priority"] == "Spot" and props["evictionPolicy"] == "Delete"
    assert props["billingProfile"]["maxPrice"] == -1
    assert props["hardwareProfile"]["vmSize"] == SIZE
    assert body["tags"][TAG_CLUSTER] == "c-az1" and body["tags"][TAG_JOB] == "job-3"
    script = base64.b64decode(props["osProfile"]["customData"]).decode()
    assert "--cloud azure" in script and "start --head" in script
    assert props["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"] == "Delete"
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    assert all(r["auth"] == "Bearer fake-token" for r in azure_fake.requests)
    nic_puts = [r for r in azure_fake.requests if r["method"] == "PUT" and "networkInterfaces" in r["path"]]
    assert nic_puts[0]["body"]["tags"][TAG_CLUSTER] == "c-az1"

    assert sorted(n.instance_id for n in azure_cloud.list_nodes("c-az1")) == sorted(n.instance_id for n in nodes)
    azure_cloud.terminate(nodes)
    azure_cloud.terminate(nodes)
    assert azure_fake.vms() == [] and azure_fake.nics() == []


def test_on_demand_is_regular(azure_cloud, azure_fake):
    nodes = azure_cloud.launch(_req(offer("azure", SIZE, "eastus", market="on-demand"), count=1))
    body = next(r["body"] for r in azure_fake.requests if r["method"] == "PUT" and "virtualMachines" in r["path"])
    assert body["properties"]["priority"] == "Regular" and "evictionPolicy" not in body["properties"]
    azure_cloud.terminate(nodes)
    assert azure_fake.vms() == []


@pytest.mark.parametrize("kind,exc,code", [
    ("allocation", CapacityError, "AllocationFailed"),
    ("zonal", CapacityError, "ZonalAllocationFailed"),
    ("sku", CapacityError, "SkuNotAvailable"),
    ("quota", QuotaError, "OperationNotAllowed"),
    ("authz", AuthError, "AuthorizationFailed"),
    ("token", AuthError, "InvalidAuthenticationToken"),
])
def test_errors_map_by_code_and_leave_nothing(azure_cloud, azure_fake, kind, exc, code):
    azure_fake.queue_error("vm", kind)
    with pytest.raises(exc) as ei:
        azure_cloud.launch(_req(offer("azure", SIZE, "eastus"), count=1))
    assert ei.value.code == code and ei.value.cloud == "azure"
    assert azure_fake.vms() == [] and azure_fake.nics() == []   # the NIC made first is removed


def test_partial(azure_cloud, azure_fake):
    orig = azure_fake._route
    n = {"vm": 0}

    def second_vm_fails(method, path, body):
        if method == "PUT" and "virtualMachines" in path:
            n["vm"] += 1
            if n["vm"] == 2:
                azure_fake.queue_error("vm", "allocation")
        return orig(method, path, body)

    azure_fake._route = second_vm_fails
    nodes = azure_cloud.launch(_req(offer("azure", SIZE, "eastus"), count=3))
    assert len(nodes) == 1 and len(azure_fake.nics()) == 1
    azure_cloud.terminate(nodes)
    assert azure_fake.vms() == [] and azure_fake.nics() == []


def test_throttling_is_retried(azure_cloud, azure_fake):
    azure_fake.queue_error("vm", "throttle", times=2)
    nodes = azure_cloud.launch(_req(offer("azure", SIZE, "eastus"), count=1))
    assert len(nodes) == 1
    assert len([r for r in azure_fake.requests if r["method"] == "PUT" and "virtualMachines" in r["path"]]) == 3
    azure_cloud.terminate(nodes)


def test_bad_input_and_missing_subscription(azure_cloud, azure_fake, monkeypatch):
    with pytest.raises(InputError) as ei:
        azure_cloud.launch(_req(offer("azure", "Standard_ND96isr_H200_v9", "eastus")))
    assert "instance_type" in str(ei.value)
    with pytest.raises(InputError) as ei:   # ND H100 v5 is not sold in every region
        azure_cloud.launch(_req(offer("azure", "Standard_ND96isr_H100_v5", "northcentralus")))
    assert "region" in str(ei.value)
    assert azure_fake.requests == []

    from spotwise.provisioner.clouds.azure.cloud import AzureCloud

    for k in ("SPOTWISE_AZURE_SUBSCRIPTION_ID", "AZURE_SUBSCRIPTION_ID"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(AuthError) as ei:
        AzureCloud(endpoint=azure_fake.endpoint).launch(_req(offer("azure", SIZE, "eastus")))
    assert "SPOTWISE_AZURE_SUBSCRIPTION_ID" in str(ei.value)


@pytest.mark.parametrize("size,disk", [
    ("Standard_NC24ads_A100_v4", "Premium_LRS"), ("Standard_ND96isr_H100_v5", "Premium_LRS"),
    ("Standard_NC6s_v3", "Premium_LRS"), ("Standard_D2s_v5", "Premium_LRS"), ("Standard_DS2_v2", "Premium_LRS"),
    ("Standard_D2_v5", "StandardSSD_LRS"), ("Standard_F4", "StandardSSD_LRS"),
])
def test_the_os_disk_type_is_one_the_size_takes(size, disk):
    """Premium SSD only on a Premium Storage capable size ('s' in the name's additive features)."""
    from spotwise.provisioner.clouds.azure.sizes import os_disk_type

    assert os_disk_type(size) == disk


def test_the_emulated_arm_refuses_premium_storage_on_a_size_without_it(azure_fake):
    """The fake's rule, with ARM's code and message: a Premium_LRS OS disk on Standard_D2_v5 is
    refused, StandardSSD_LRS there and Premium_LRS on a GPU size are not."""
    def body(size: str, disk: str) -> dict:
        return {"location": "eastus", "properties": {
            "hardwareProfile": {"vmSize": size},
            "storageProfile": {"osDisk": {"name": "n-osdisk", "managedDisk": {"storageAccountType": disk}}}}}

    path = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/n"
    status, answer, _ = azure_fake._put("virtualmachines", path.lower(), path, "n", body("Standard_D2_v5", "Premium_LRS"))
    assert status == 400 and answer["error"]["code"] == "InvalidParameter"
    assert "VM size Standard_D2_v5 does not support the storage account type Premium_LRS of disk 'n-osdisk'" \
        in answer["error"]["message"]
    for size, disk in (("Standard_D2_v5", "StandardSSD_LRS"), ("Standard_NC24ads_A100_v4", "Premium_LRS")):
        status, _, _ = azure_fake._put("virtualmachines", path.lower(), path, "n", body(size, disk))
        assert status in (200, 201)

"""An emulated Azure for end-to-end runs, offline (test and bench support, never product code).

The fake cloud decides what exists: the wire-level ARM fake of ``tests/provisioner/fakes``
(:class:`~fakes.azure_fake.AzureFake`), served on loopback in this process, which the real
azure-mgmt-compute / azure-mgmt-network clients of ``spotwise launch`` talk to. The *instance
emulator* turns each VM the fake holds (tagged by spotwise, provisioning succeeded) into a local
node that executes **the exact custom data spotwise handed ARM**, with only environment overrides:

* ``SPOTWISE_STATE_DIR`` / ``SPOTWISE_ETC_DIR``: the node's own directories;
* ``SPOTWISE_VENV`` / ``SPOTWISE_PYTHON``: an empty venv path and a stock image's Python (torch and
  Ray, no spotwise): the script installs the wheel the launch shipped, as on the cloud;
* ``SPOTWISE_METADATA_URL``: the VM's own IMDS on loopback (:mod:`emulator.azure_imds`; name,
  private address, tags, Scheduled Events; ``Metadata: true`` required);
* ``SPOTWISE_RAY_START_ARGS``: free ports for the per-node Ray agents and a small object store;
* no storage key: checkpoints go to ``az://devstoreaccount1/<bucket>/…`` on Azurite (Microsoft's
  emulator, HTTPS with ``--oauth basic``: :mod:`emulator.azurite_server`), which the node reaches
  as the managed identity its VM carries — its token comes from the VM's own IMDS
  (``AZURE_POD_IDENTITY_AUTHORITY_HOST``, the override azure-identity honours for IMDS), which
  issues one only for an identity the VM was created with. The node is told only where the blob
  endpoint is (``SPOTWISE_AZURE_BLOB_ENDPOINT``) and to trust Azurite's certificate (CA bundles).
  The launcher writes with Azurite's connection string (:meth:`EmulatedAzure.env`), as an
  operator's own login would.

The emulated VNet is a loopback range (``127.18.0.0/16``): every NIC's private address is a real,
distinct loopback address, Ray on each node binds to it and workers join the head at the address
ARM reported — no translation anywhere.

With ``head_path="ssh"`` (the default, as spotwise's own) the head's NIC carries a Standard public
IP, which the fake gives from ``127.22.0.0/16`` (:data:`PUBLIC_RANGE`); that address runs a real
sshd on port 22 (``tests/sshd.py``, as the test's user) whose authorized keys the head's own boot
script writes, admitting only the source prefixes the cluster's NSG opens port 22 to; the launcher
reaches the head's dashboard and control endpoint through it, as from a laptop. The private
addresses are still loopback, reachable here: this does not prove they could not be reached
directly. ``head_path="private"``: the launcher uses the private addresses, heads get no public IP.

The emulated environment has infra/azure's networks: in each of its locations the VNet
``spotwise-<region>`` whose subnet ``nodes`` has a NAT gateway. A VM whose subnet has none (a
region outside the locations, where the product made the VNet itself) never runs its boot: a VNet
made after 2025-09-30 has no default outbound access, and the boot must fetch the wheel and packages
(issue 48 item 5; its boot log says why, and the launcher's join watchdog ends it).

Deleting a VM in the fake ends its node (every process carrying its marker variable). A
preemption is injected the Azure way (:meth:`EmulatedAzure.preempt`): a ``Preempt`` scheduled
event for the VM appears on its IMDS with ``NotBefore`` ``notice_s`` (>= 30) seconds ahead; the
VM is evicted (deleted with its NIC and OS disk, ``evictionPolicy=Delete``) when the event is
acknowledged (``StartRequests``) or at ``NotBefore``, whichever comes first.
"""

from __future__ import annotations

import base64
import getpass
import ipaddress
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent / "provisioner") not in sys.path:      # the ARM fake lives with the provisioner tests
    sys.path.insert(0, str(HERE.parent / "provisioner"))

from emulator.azure_imds import AzureImds, RetailPrices  # noqa: E402
from emulator.base import EmulatedCloud, orchestrator_ports  # noqa: E402
from fakes.azure_fake import AzureFake  # noqa: E402
from emulator.azurite_server import ACCOUNT  # noqa: E402

VNET_CIDR = "127.18.0.0/16"
#: where the emulated Azure's public IP addresses come from: loopback, no VNet's range, so a
#: connection to one reaches only what listens there (a head's sshd)
PUBLIC_RANGE = "127.22.0.0/16"
#: infra/azure's default ``var.locations`` (tests/provisioner/test_infra_regions.py holds it equal to
#: the plan's default Azure regions)
INFRA_LOCATIONS = ("centralus", "eastus", "eastus2", "northcentralus", "southcentralus", "westus", "westus2", "westus3")
#: the user-assigned identity the launch gives every VM (infra/azure's node_identity_id)
NODE_IDENTITY = ("/subscriptions/00000000-0000-0000-0000-0000000000e5/resourceGroups/spotwise/providers/"
                 "Microsoft.ManagedIdentity/userAssignedIdentities/spotwise-node")
SUBSCRIPTION = "00000000-0000-0000-0000-0000000000e5"
RESOURCE_GROUP = "spotwise"
MIN_NOTICE_S = 30.0    # Azure gives a Spot VM at least 30 s between the Preempt event and eviction
# What the emulated Retail Prices API quotes for the 8 x A100 size (on-demand, spot): eastus as the
# shipped snapshot's current rows, westus2 near its 2024 snapshot row (refreshed, so current), so a
# run has two spot regions to plan and fail over between.
RETAIL_PRICES = {("Standard_ND96asr_v4", "eastus"): (27.197, 5.98334),
                 ("Standard_ND96asr_v4", "westus2"): (27.197, 3.10)}


class EmulatedAzure(EmulatedCloud):
    NODES_DIR = "vms"
    THREAD_NAME = "azure-instance-emulator"

    def __init__(self, workdir: Path, *, region: str = "eastus", bucket: str = "ckpt",
                 locations: tuple[str, ...] | None = None, head_path: str = "ssh") -> None:
        super().__init__(workdir, bucket=bucket)
        if head_path not in ("ssh", "private"):
            raise ValueError(f"head_path: ssh or private, not {head_path!r}")
        self.region = region
        self.head_path = head_path
        # the regions infra/azure gave a VNet with a NAT gateway (its var.locations; default: its
        # default list, which is the plan's default regions)
        self.locations = tuple(locations) if locations is not None else tuple(INFRA_LOCATIONS)
        self.evicted: list[tuple[str, str]] = []   # (VM name, "acknowledged" | "not-before")

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "EmulatedAzure":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.fake = AzureFake(public_range=PUBLIC_RANGE).start()
        self._infra_networks()
        self.imds = AzureImds(on_ack=self._on_ack).start()
        self.retail = RetailPrices(RETAIL_PRICES).start()
        from emulator.azurite_server import Azurite

        self.azurite = Azurite(https=True, log=self.workdir / "azurite.log")   # az:// for checkpoints
        self.azurite.create_container(self.bucket)
        self._start_loop()
        return self

    def _infra_networks(self) -> None:
        """What infra/azure makes in each of its locations: the VNet ``spotwise-<region>`` with its
        subnet ``nodes`` (the first /20 of the VNet's range, as the product would make it) associated
        with the region's NAT gateway. Elsewhere the product makes the VNet itself, without one."""
        net = ipaddress.ip_network(VNET_CIDR)
        nodes = str(next(net.subnets(new_prefix=20)))
        for loc in self.locations:
            nat = (f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Network/"
                   f"natGateways/spotwise-nat-{loc}")
            self.fake.put_vnet(f"spotwise-{loc}", loc, VNET_CIDR, {"nodes": nodes}, resource_group=RESOURCE_GROUP,
                               subscription=SUBSCRIPTION, nat_gateway=nat)

    def _no_way_out(self, vm: dict) -> str | None:
        """Why the VM has no outbound access, or None. A VNet made after 2025-09-30 has no default
        outbound access (learn.microsoft.com/azure/virtual-network/ip-services/default-outbound-access);
        spotwise's VMs have no public address, so only a NAT gateway on their subnet lets them out."""
        vnet, subnet = self.fake.nic_subnet(vm)
        if (subnet.get("properties") or {}).get("natGateway") or self.fake.nic_public_ip(vm):
            return None         # a NAT gateway, or the VM's own Standard public IP, lets it out
        return (f"subnet {subnet.get('id', '').rsplit('/', 1)[-1] or '?'} of VNet {vnet} ({vm.get('location')}) has no "
                "NAT gateway and the VM no public address: Azure VNets made after 2025-09-30 have no default "
                "outbound access")

    def stop(self) -> None:
        self._stop_nodes()
        self.imds.stop()
        self.retail.stop()
        self.fake.stop()
        self.azurite.close()

    @property
    def storage(self) -> str:
        """The run's checkpoint store on this Azure (``--storage``)."""
        return f"az://{ACCOUNT}/{self.bucket}/runs"

    def committed(self, prefix: str = "runs/") -> bool:
        """Whether a checkpoint under ``prefix`` of the container is committed (its marker exists)."""
        blobs = self.azurite.service().get_container_client(self.bucket).list_blobs(name_starts_with=prefix)
        return any(b.name.endswith("/COMMITTED") for b in blobs)

    # -- what the orchestrator's environment needs -----------------------------------------------
    def env(self) -> dict[str, str]:
        return {**self.azurite.env(), "AWS_EC2_METADATA_DISABLED": "true",
                "SPOTWISE_AZURE_NODE_IDENTITY": NODE_IDENTITY,
                "SPOTWISE_AZURE_SUBSCRIPTION_ID": SUBSCRIPTION, "SPOTWISE_AZURE_RESOURCE_GROUP": RESOURCE_GROUP,
                "SPOTWISE_AZURE_ENDPOINT": self.fake.endpoint, "SPOTWISE_AZURE_ANONYMOUS": "1",
                "SPOTWISE_AZURE_VNET_CIDR": VNET_CIDR, "SPOTWISE_AZURE_PRICES_ENDPOINT": self.retail.endpoint,
                "SPOTWISE_AZURE_SSH_PUBLIC_KEY": "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 emulated",
                # ssh (the default, as spotwise's own): through each head's own sshd at its public
                # IP, as the test's user (the emulated head authorizes the key in its sshd's file),
                # port 22 open to the launcher's address only; private: the private addresses
                "SPOTWISE_HEAD_PATH": self.head_path,
                **({"SPOTWISE_HEAD_SSH_USER": getpass.getuser(), "SPOTWISE_LAUNCHER_CIDR": "127.0.0.1/32"}
                   if self.head_path == "ssh" else {}),
                **orchestrator_ports()}

    def refresh_prices(self, home: Path) -> dict:
        """``spotwise catalog refresh --cloud azure`` against the emulated Retail Prices API, as a
        user does before launching: the live cache in ``home`` then holds current prices for
        every region the emulator quotes."""
        regions = ",".join(sorted({r for _, r in RETAIL_PRICES}))
        r = subprocess.run([sys.executable, "-m", "spotwise.cli", "catalog", "refresh", "--cloud", "azure",
                            "--region", regions, "--format", "json"],
                           env=dict(os.environ, **self.env(), SPOTWISE_HOME=str(home)),
                           capture_output=True, text=True, check=True)
        return json.loads(r.stdout)

    def set_no_capacity(self, pairs: list[str], kind: str = "sku") -> None:
        """``["Standard_ND96asr_v4:eastus:spot", "*:*:spot"]``: VM PUTs of that (size, region,
        market) answer ``SkuNotAvailable`` (``kind="sku"``) or a failed ``AllocationFailed``
        operation (``kind="allocation"``). ``[]`` gives capacity back."""
        prio = {"spot": "Spot", "on-demand": "Regular", "*": "*"}
        rules = {}
        for p in pairs:
            size, region, market = p.split(":")
            rules[(size, region, prio[market])] = kind
        self.fake.set_no_capacity(rules)

    # -- the instance emulator ----------------------------------------------------------------
    def vms(self, *, role: str | None = None, priority: str | None = None) -> list[dict]:
        """Spotwise's VMs in the fake whose provisioning succeeded (optionally of a role/priority)."""
        with self.fake._lock:
            vms = [dict(v) for v in self.fake.vms()]
        return [v for v in vms if "spotwise-cluster" in (v.get("tags") or {})
                and v["properties"].get("provisioningState") == "Succeeded"
                and (role is None or v["tags"].get("spotwise-role") == role)
                and (priority is None or v["properties"].get("priority") == priority)]

    def _live(self) -> dict[str, dict]:
        return {v["name"]: v for v in self.vms()}

    def private_ip(self, vm: dict) -> str:
        nic = self.fake.first_nic(vm, required=True)
        return nic["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"]

    def _start_node(self, vm: dict) -> None:
        name = vm["name"]
        script = base64.b64decode(self.fake.custom_data[name.lower()])
        try:
            private_ip = self.private_ip(vm)
            public = self.fake.nic_public_ip(vm)
            no_way_out = self._no_way_out(vm)
        except KeyError:
            # its NIC is gone: the launcher deleted the VM (and then its NIC) since the loop listed it
            # (a head released in a refused region); a VM that was never running boots nothing
            if name not in self._live():
                return
            raise
        self.imds.set_vm(name, private_ip=private_ip, tags=vm.get("tags") or {}, resource_id=vm.get("id", ""),
                         identity=next(iter((vm.get("identity") or {}).get("userAssignedIdentities") or {}),
                                       bool(vm.get("identity"))))
        ca = self.azurite.ca
        assert ca is not None
        keys = self._head_sshd(name, public, self.fake.nic_port_22_sources(vm)) if public else {}
        self._boot(name, script, "custom-data", metadata_url=self.imds.base_url(name), creds={},
                   # the node's dead man's switch deletes its VM on the ARM endpoint; its storage is
                   # Azurite as its VM's managed identity: where the endpoint is, and trust in its
                   # certificate, nothing else (no key, no connection string)
                   extra_env={"SPOTWISE_AZURE_ARM_URL": self.fake.endpoint,
                              "AZURE_POD_IDENTITY_AUTHORITY_HOST": self.imds.base_url(name),
                              "SPOTWISE_AZURE_BLOB_ENDPOINT": f"{self.azurite.endpoint}/{{account}}",
                              "REQUESTS_CA_BUNDLE": ca, "CURL_CA_BUNDLE": ca, **keys},
                   drop_env=("SPOTWISE_AZURE_ENDPOINT", "SPOTWISE_AZURE_ANONYMOUS", "AZURE_STORAGE_CONNECTION_STRING",
                             "SPOTWISE_AZURE_NODE_IDENTITY"),
                   no_way_out=no_way_out)

    def _guest_shutdown(self, name: str) -> None:
        """Azure: a guest shutdown stops the OS but the VM stays allocated, and billed: nothing
        changes in ARM (only a deallocate or a delete ends the bill)."""

    # -- faults, the way Azure delivers them -------------------------------------------------------
    def preempt(self, name: str, notice_s: float = MIN_NOTICE_S) -> str:
        """Spot eviction: a ``Preempt`` scheduled event now, ``NotBefore`` ``notice_s`` ahead; the VM
        is evicted on acknowledgement or at ``NotBefore``. Returns the event id."""
        if notice_s < MIN_NOTICE_S:
            raise ValueError(f"notice_s: got {notice_s}; Azure gives at least {MIN_NOTICE_S:.0f} s")
        eid = self.imds.post_preempt(name, time.time() + notice_s)
        self.preempted.append(name)

        def at_not_before() -> None:
            time.sleep(notice_s)
            self._evict(name, "not-before")

        threading.Thread(target=at_not_before, daemon=True).start()
        return eid

    def _on_ack(self, name: str, event_id: str) -> None:
        self._evict(name, "acknowledged")

    def _evict(self, name: str, why: str) -> None:
        try:
            if self.fake.evict(name):
                self.evicted.append((name, why))
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"evict {name}: {e}")

    # -- what is left -------------------------------------------------------------------------
    def leftovers(self) -> dict[str, list[str]]:
        """Everything of ours still in the fake cloud: VMs, NICs, public IPs, disks, NSGs."""
        with self.fake._lock:
            def ours(rows):
                return sorted(r["name"] for r in rows if "spotwise-cluster" in (r.get("tags") or {})
                              or r["name"].startswith("sw-"))
            return {"vms": ours(self.fake.vms()), "network_interfaces": ours(self.fake.nics()),
                    "public_ips": ours(self.fake.public_ips()), "disks": ours(self.fake.disks()),
                    "network_security_groups": ours(self.fake.nsgs())}

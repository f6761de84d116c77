"""What a GCE machine series needs of its boot disk and network interface.

An instance's boot disk without a type is ``pd-standard``, which most current series refuse, and
GCE then refuses the whole insert ("[pd-standard, a3-highgpu-8g] features are not compatible for
creating instance."). The supported disk types per series are on GCP's machine-family pages
("Supported disk types"; accelerator-optimized: https://cloud.google.com/compute/docs/
accelerator-optimized-machines, sections A3, A2, G2; general-purpose: .../general-purpose-machines):

* A3 Ultra (``a3-ultragpu``, H200), A4 (``a4-highgpu``, B200), A4X: Hyperdisk only
  (``hyperdisk-balanced``, ``hyperdisk-extreme``), so the boot disk is ``hyperdisk-balanced``;
  N4 and C4 (general purpose) likewise.
* A3 Mega, High and Edge (H100): ``pd-ssd``, ``pd-balanced`` and Hyperdisk, no ``pd-standard``;
  G2 (L4): ``pd-ssd``, ``pd-balanced``, Hyperdisk ML/Throughput, no ``pd-standard``; A2 (A100):
  ``pd-standard``, ``pd-ssd``, ``pd-balanced``; N1, N2, E2 (the head): any persistent disk.
  All of these get ``pd-balanced`` (SSD-backed, the cheapest type every one of them takes).

The A3 and A4 series run only with the gVNIC network interface (``nicType: GVNIC``; GCP's A3
page: "gVNIC is required"); everywhere else the interface type is left to GCE's default.
The same tables, as the emulated GCE enforces them, are in ``tests/provisioner/fakes/gcp_fake.py``
and listed in docs/cloud-rules.md.
"""

from __future__ import annotations

#: series whose boot disk must be Hyperdisk (the machine type's name starts with one of these)
HYPERDISK_ONLY = ("a3-ultragpu", "a4-", "a4x-", "n4-", "c4-", "c4a-", "c4d-")
#: series that run only with gVNIC
GVNIC_ONLY = ("a3-", "a4-", "a4x-")


def boot_disk_type(machine_type: str | None) -> str:
    """The boot disk type an instance of ``machine_type`` is created with: ``hyperdisk-balanced``
    on a Hyperdisk-only series, else ``pd-balanced`` (also when the type is not known)."""
    return "hyperdisk-balanced" if (machine_type or "").startswith(HYPERDISK_ONLY) else "pd-balanced"


def nic_type(machine_type: str) -> str | None:
    """``GVNIC`` where the series needs it, else None (GCE's default interface)."""
    return "GVNIC" if machine_type.startswith(GVNIC_ONLY) else None

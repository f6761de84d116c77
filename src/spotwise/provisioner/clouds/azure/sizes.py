"""What an Azure VM size allows its OS disk: Premium SSD only on a size that is "Premium Storage
capable".

Azure's size names say it: ``Standard_<family><vCPUs>[-constrained]<additive features>[_<accelerator>]
_<version>``, and an ``s`` among the lower-case additive features (``D2s_v5``, ``NC24ads_A100_v4``,
``ND96isr_H100_v5``) or a family ending in ``S`` (the older ``DS2_v2``, ``GS``, ``FS``, ``LS``) marks a size
that takes Premium Storage (Azure docs, "Azure virtual machine sizes naming conventions": "s =
Premium Storage capable"). Any other size refuses a ``Premium_LRS`` OS disk (400
``InvalidParameter``: "Requested operation cannot be performed because the VM size Standard_F4
does not support the storage account type Premium_LRS of disk '...'. Consider updating the VM to a
size that supports Premium storage.", quoted from ARM in google/cloud-forensics-utils#488), so it
gets ``StandardSSD_LRS``. The emulated ARM (``tests/provisioner/fakes/azure_fake.py``) refuses
the same; docs/cloud-rules.md lists the rule.
"""

from __future__ import annotations

import re

_NAME = re.compile(r"^Standard_([A-Z]+)(\d+)(?:-\d+)?([a-z]*)")


def premium_capable(size: str) -> bool:
    """Whether VM ``size`` takes Premium Storage (see the module docstring)."""
    m = _NAME.match(size)
    return m is not None and ("s" in m.group(3) or m.group(1).endswith("S"))


def os_disk_type(size: str | None) -> str:
    """The OS disk's storage account type for ``size``: ``Premium_LRS`` where the size takes it
    (every GPU size spotwise's catalog sells, and the default head), else ``StandardSSD_LRS``."""
    return "Premium_LRS" if size is None or premium_capable(size) else "StandardSSD_LRS"

"""Who an Azure node is: the user-assigned managed identity it carries, and whether that identity
can reach the run's storage — checked before anything launches.

An Azure node reaches ``az://ACCOUNT/CONTAINER/PREFIX`` storage (its checkpoints, the shipped
build, the task's token file, the Preempt acknowledgement's checkpoint check) as its managed
identity, with tokens from the VM's Instance Metadata Service: azure-identity's
``ManagedIdentityCredential`` in Python (:mod:`spotwise.runtime.storage.azblob`, told which identity by
:data:`STORAGE_IDENTITY_ENV`, which the boot script exports), the boot script's ``curl`` for the
wheel. No storage key is put on a node or baked into an image, and none is used on a node even
where its environment has one. So one setting must hold, and a launch can read it: a launch on
Azure with ``az://`` storage whose nodes would carry no identity is refused with exit 2 naming it,
instead of booting nodes that could never checkpoint:

* ``SPOTWISE_AZURE_NODE_IDENTITY`` is set to the resource id of a user-assigned identity
  (``/subscriptions/S/resourceGroups/R/providers/Microsoft.ManagedIdentity/userAssignedIdentities/N``;
  ``infra/azure`` creates ``spotwise-node`` and its output ``node_identity_id``), which holds
  **Storage Blob Data Contributor** on the storage account (``infra/azure`` assigns it on the
  account it creates). The same identity deletes the node's own VM (:mod:`spotwise.runtime.node.deadman`).

Whether the identity really holds the data role cannot be read without the account's IAM (the
launcher's own sign-in may not see it); a node without it fails its first storage call with a 403,
which :class:`~spotwise.runtime.storage.azblob.AzureBlobStorage` reports naming the role.

``az://`` is the only storage an Azure node reaches (:data:`NODE_STORAGE_SCHEMES`): it has no
identity for S3 or GCS (that would take keys on its image, which spotwise does not support). A run
planned over Azure and another cloud gives each its own store
(:mod:`spotwise.engine.run.run_stores`).
"""

from __future__ import annotations

import re

from spotwise.config import setting, where
from spotwise.errors import Problem
from spotwise.runtime.storage.azblob import STORAGE_IDENTITY_ENV

NODE_STORAGE_SCHEMES = ("az",)
IDENTITY_SETTING = "SPOTWISE_AZURE_NODE_IDENTITY"
_IDENTITY_ID = re.compile(r"/subscriptions/[^/\s]+/resourceGroups/[^/\s]+/providers/"
                          r"Microsoft\.ManagedIdentity/userAssignedIdentities/[^/\s]+", re.IGNORECASE)


def node_identity() -> str | None:
    """The user-assigned identity nodes carry (``SPOTWISE_AZURE_NODE_IDENTITY``), or None."""
    return setting(IDENTITY_SETTING) or None


def node_extras(storage_uri: str | None) -> str:
    """The wheel's extras a node installs: ``azure`` (azure-storage-blob, azure-identity) for
    ``az://`` storage, ``aws`` (boto3) for ``s3://``."""
    return "azure" if (storage_uri or "").startswith("az://") else "aws"


def node_env(storage_uri: str | None, identity: str | None) -> dict[str, str]:
    """What the boot script exports to every process of a node (Ray, training, the watcher): for
    ``az://`` storage, :data:`STORAGE_IDENTITY_ENV` naming the node's identity, so the store is
    reached as that identity and never with a key."""
    if identity and (storage_uri or "").startswith("az://"):
        return {STORAGE_IDENTITY_ENV: identity}
    return {}


def storage_identity_problem(storage_uri: str) -> Problem | None:
    """What an Azure node lacks to write ``az://`` ``storage_uri`` as itself (None: nothing)."""
    if not storage_uri.startswith("az://"):
        return None
    ident = node_identity()
    if not ident:
        return Problem(where(IDENTITY_SETTING), None,
                       "the resource id of the user-assigned identity Azure nodes carry, with 'Storage Blob "
                       f"Data Contributor' on the storage account of {storage_uri} (infra/azure creates it: "
                       "output node_identity_id); nodes reach storage with their own identity, never keys")
    if not _IDENTITY_ID.fullmatch(ident):
        return Problem(where(IDENTITY_SETTING), ident,
                       "a user-assigned identity's resource id: /subscriptions/SUB/resourceGroups/RG/providers/"
                       "Microsoft.ManagedIdentity/userAssignedIdentities/NAME")
    return None

"""``az://ACCOUNT/CONTAINER/PREFIX`` checkpoint storage through Azure's own client (``azure-storage-blob``).

The same :class:`~spotwise.runtime.storage.base.Storage` contract as S3 and GCS, so the checkpointer's
layout and commit protocol (shards first, the ``COMMITTED`` marker last, keep-last pruning) are
unchanged:

* **URI form.** ``az://ACCOUNT/CONTAINER/PREFIX``: the storage account is part of the URI, in the
  blob endpoint's own order (``https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX``), because a
  node must reach the store from the URI alone. (adlfs's ``az://CONTAINER/PATH`` takes the account
  from its options instead, so a bare container name here would be ambiguous.)
* **Atomic objects.** A block blob is visible only once complete (a single Put Blob, or Put Block
  then Put Block List), so a reader never sees half a shard; a retried upload overwrites.
* **Credentials.** On an Azure node (``SPOTWISE_AZURE_STORAGE_IDENTITY`` set: the resource id of
  the user-assigned managed identity the VM carries, exported by its boot script) only that
  identity, through azure-identity's ``ManagedIdentityCredential`` (IMDS tokens): never a key, even
  where the environment has one. Elsewhere, first match wins: ``AZURE_STORAGE_CONNECTION_STRING`` when it names this account
  (its ``BlobEndpoint`` is also the endpoint override: Azurite's
  ``http://127.0.0.1:10000/devstoreaccount1``); ``AZURE_STORAGE_KEY`` (the az CLI's variable) when
  ``AZURE_STORAGE_ACCOUNT`` is unset or this account; else azure-identity's
  ``DefaultAzureCredential`` (a VM's managed identity, ``AZURE_CLIENT_ID`` choosing a user-assigned
  one; env service principal; ``az login``) against ``https://ACCOUNT.blob.core.windows.net``.
  ``SPOTWISE_AZURE_BLOB_ENDPOINT`` replaces that endpoint (``{account}`` is filled in).
* **Retries** are ours alone (:mod:`spotwise.runtime.storage.retry`, extended to azure-core's
  429/5xx and connection errors); the client's own retry is off (``retry_total=0``).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, TypeVar

from spotwise.config import setting
from spotwise.errors import SpotwiseError
from spotwise.extras import require
from spotwise.runtime.storage.retry import RetryPolicy, with_retries

T = TypeVar("T")
#: seconds to connect, seconds to wait for each read
CONNECT_S, READ_S = 5, 60
MB = 1024 * 1024
#: set on an Azure node (its boot script exports it): the managed identity to reach storage as
#: (:mod:`spotwise.provisioner.clouds.azure.identity`)
STORAGE_IDENTITY_ENV = "SPOTWISE_AZURE_STORAGE_IDENTITY"
#: a SAS may outlive neither 7 days (a user delegation key's limit) nor the caller's wish
MAX_SAS_S = 7 * 24 * 3600


class AzureAuthFailed(SpotwiseError):
    """No usable Azure credentials for the account (exit 1: the input is fine, this machine's
    setup is not)."""


def parse_conn_str(conn: str) -> dict[str, str]:
    """``Key=Value;...`` of an Azure Storage connection string (values may contain ``=``)."""
    return {k.strip(): v.strip() for k, _, v in (p.partition("=") for p in conn.split(";") if "=" in p)}


def blob_endpoint(account: str) -> str:
    """The blob endpoint of ``account``: ``SPOTWISE_AZURE_BLOB_ENDPOINT`` (``{account}`` filled in)
    when set, else the public cloud's ``https://ACCOUNT.blob.core.windows.net``."""
    tmpl = setting("SPOTWISE_AZURE_BLOB_ENDPOINT") or "https://{account}.blob.core.windows.net"
    return tmpl.replace("{account}", account).rstrip("/")


class AzureBlobStorage:
    """``az://account/container/prefix`` through ``azure-storage-blob`` (credentials: module docstring)."""

    def __init__(self, account: str, container: str, prefix: str, *, retry: RetryPolicy | None = None,
                 credential: Any = None, chunk_mb: int = 16, max_concurrency: int = 8) -> None:
        """``credential``: anything ``BlobServiceClient`` accepts; None (the default) picks one as
        the module docstring says."""
        blob = require("azure.storage.blob", "azure", "az:// checkpoint storage")
        self.account, self.container, self.prefix = account, container, prefix.strip("/")
        self.uri = f"az://{account}/{container}" + (f"/{self.prefix}" if self.prefix else "")
        self.retry = retry or RetryPolicy()
        self._concurrency = max_concurrency
        kw: dict[str, Any] = {"retry_total": 0, "connection_timeout": CONNECT_S, "read_timeout": READ_S,
                              "max_single_put_size": chunk_mb * MB, "max_block_size": chunk_mb * MB}
        conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
        node_identity = os.environ.get(STORAGE_IDENTITY_ENV, "").strip()
        if credential is None and node_identity:
            identity = require("azure.identity", "azure", "az:// checkpoint storage")
            credential = identity.ManagedIdentityCredential(identity_config={"resource_id": node_identity})
            self._service = blob.BlobServiceClient(blob_endpoint(account), credential=credential, **kw)
        elif credential is None and parse_conn_str(conn).get("AccountName") == account:
            self._service = blob.BlobServiceClient.from_connection_string(conn, **kw)
        else:
            if credential is None:
                key = os.environ.get("AZURE_STORAGE_KEY")
                if key and os.environ.get("AZURE_STORAGE_ACCOUNT", account) == account:
                    credential = {"account_name": account, "account_key": key}
                else:
                    identity = require("azure.identity", "azure", "az:// checkpoint storage")
                    credential = identity.DefaultAzureCredential()
            self._service = blob.BlobServiceClient(blob_endpoint(account), credential=credential, **kw)
        self._container = self._service.get_container_client(container)

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _blob(self, key: str) -> Any:
        return self._container.get_blob_client(self._k(key))

    def _call(self, fn: Callable[[], T], what: str) -> T:
        """``fn`` under the retry policy; no credentials, or a 401/403 from the account (a wrong key,
        an identity without a data role), becomes :class:`AzureAuthFailed`."""
        from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

        try:
            return with_retries(fn, what=what, policy=self.retry)
        except (ClientAuthenticationError, HttpResponseError) as e:
            if not isinstance(e, ClientAuthenticationError) and e.status_code not in (401, 403):
                raise
            raise AzureAuthFailed(
                f"{self.uri}: Azure refused or found no credentials for storage account {self.account!r} "
                "(on an Azure VM: its managed identity, with a 'Storage Blob Data Contributor' role on the "
                "account; elsewhere `az login`, AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_KEY): "
                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None

    def local_path(self, key: str) -> None:
        return None

    def child_uri(self, key: str) -> str:
        return f"az://{self.account}/{self.container}/{self._k(key)}"

    def put_file(self, local: Path, key: str) -> None:
        def up() -> None:
            with open(local, "rb") as f:
                self._blob(key).upload_blob(f, overwrite=True, max_concurrency=self._concurrency)

        self._call(up, f"upload {key}")

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(lambda: self._blob(key).upload_blob(data, overwrite=True), f"put {key}")

    def get_file(self, key: str, local: Path) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)

        def down() -> None:
            with open(local, "wb") as f:
                self._blob(key).download_blob(max_concurrency=self._concurrency).readinto(f)

        self._call(down, f"download {key}")

    def get_bytes(self, key: str) -> bytes | None:
        from azure.core.exceptions import ResourceNotFoundError

        def get() -> bytes | None:
            try:
                return bytes(self._blob(key).download_blob().readall())
            except ResourceNotFoundError:
                return None

        return self._call(get, f"get {key}")

    def list(self, prefix: str) -> list[str]:
        strip = len(self.prefix) + 1 if self.prefix else 0

        def lst() -> list[str]:
            return sorted(b.name[strip:] for b in self._container.list_blobs(name_starts_with=self._k(prefix)))

        return self._call(lst, f"list {prefix}")

    def delete_prefix(self, prefix: str) -> None:
        """Delete every blob under ``prefix``, one request each (a retried delete of a blob already
        gone is a 404, which counts as done: deleting is idempotent)."""
        from azure.core.exceptions import ResourceNotFoundError

        for key in self.list(prefix):
            def delete(key: str = key) -> None:
                try:
                    self._blob(key).delete_blob()
                except ResourceNotFoundError:
                    pass

            self._call(delete, f"delete {key}")

    def has(self, key: str, *, size: int | None = None) -> bool:
        """Whether ``key`` exists (with ``size`` bytes, when given)."""
        from azure.core.exceptions import ResourceNotFoundError

        def head() -> bool:
            try:
                props = self._blob(key).get_blob_properties()
            except ResourceNotFoundError:
                return False
            return size is None or int(props.size) == size

        return self._call(head, f"head {key}")

    def fetch_url(self, key: str, *, expires_s: int) -> str:
        """A read-only SAS URL of ``key``, valid ``expires_s`` seconds (at most 7 days): what a node
        without spotwise or any Azure library fetches with ``curl``.

        With an account key (a connection string, ``AZURE_STORAGE_KEY``) it is a service SAS signed
        here; with a token credential (managed identity, ``az login``) a user-delegation SAS, whose
        key Azure issues to that identity (it needs a data role on the account, e.g. Storage Blob
        Data Contributor, which checkpointing needs anyway)."""
        from azure.storage.blob import BlobSasPermissions, generate_blob_sas

        now = datetime.now(timezone.utc)
        start, expiry = now - timedelta(minutes=5), now + timedelta(seconds=min(int(expires_s), MAX_SAS_S))
        blob = self._blob(key)
        cred = self._service.credential
        signing: dict[str, Any]
        if getattr(cred, "account_key", None):
            signing = {"account_key": cred.account_key}
        else:
            udk = self._call(lambda: self._service.get_user_delegation_key(start, expiry), f"sign {key}")
            signing = {"user_delegation_key": udk}
        sas = generate_blob_sas(self.account, self.container, self._k(key), permission=BlobSasPermissions(read=True),
                                start=start, expiry=expiry, **signing)
        return f"{blob.url}?{sas}"

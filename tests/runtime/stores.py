"""The object stores the checkpoint tests run against, one interface over the emulators: S3 on
moto_server, GCS on gcp-storage-emulator, Azure Blob on Azurite (loopback subprocesses; product code
sees only the wire, through ``AWS_ENDPOINT_URL``, ``STORAGE_EMULATOR_HOST`` or
``AZURE_STORAGE_CONNECTION_STRING``).

A "bucket" here is what follows ``SCHEME://`` up to the prefix: ``BUCKET`` for S3 and GCS,
``ACCOUNT/CONTAINER`` for Azure (``az://ACCOUNT/CONTAINER/PREFIX``).

A test takes the ``objstore`` fixture (tests/runtime/conftest.py), parametrized over
:data:`SCHEMES`, instead of being copied per backend."""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request

SCHEMES = ("s3", "gs", "az")


class ObjStore:
    """One emulated object store: ``scheme`` (``s3``/``gs``/``az``), its ``endpoint``, and what a process
    needs in its environment to reach it directly (:meth:`env`) or through a proxy (:meth:`env_via`)."""

    def __init__(self, scheme: str, server) -> None:
        self.scheme, self.server = scheme, server
        self.endpoint: str = server.endpoint

    def env(self) -> dict[str, str]:
        return self.server.env()

    def env_via(self, endpoint: str) -> dict[str, str]:
        """The environment that sends this store's traffic to ``endpoint`` (a fault proxy) instead."""
        if self.scheme == "az":
            from emulator.azurite_server import ACCOUNT, conn_str

            return {**self.env(), "AZURE_STORAGE_CONNECTION_STRING": conn_str(f"{endpoint}/{ACCOUNT}")}
        key = "AWS_ENDPOINT_URL" if self.scheme == "s3" else "STORAGE_EMULATOR_HOST"
        return {**self.env(), key: endpoint}

    def make_bucket(self, name: str) -> str:
        if self.scheme == "az":
            from emulator.azurite_server import ACCOUNT

            container = re.sub(r"-+", "-", name).strip("-")   # Azure refuses '--' in a container name
            return f"{ACCOUNT}/{self.server.create_container(container)}"
        if self.scheme == "s3":
            self.server.client("s3").create_bucket(Bucket=name)
        else:
            self.server.create_bucket(name)
        return name

    def keys(self, bucket: str) -> list[str]:
        """Every object key in ``bucket``, read over the wire without spotwise."""
        if self.scheme == "az":
            container = self.server.service().get_container_client(bucket.split("/", 1)[1])
            return [b.name for b in container.list_blobs()]
        if self.scheme == "s3":
            return [o["Key"] for o in self.server.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])]
        url = f"{self.endpoint}/storage/v1/b/{urllib.parse.quote(bucket)}/o"
        with urllib.request.urlopen(url, timeout=10) as r:
            return [o["name"] for o in json.load(r).get("items", [])]


def open_store(store: ObjStore, bucket: str, prefix: str, retry):
    """spotwise's own backend for ``store`` (built in the caller's environment), with ``retry``."""
    if store.scheme == "s3":
        from spotwise.runtime.storage.base import S3Storage

        return S3Storage(bucket, prefix, retry=retry)
    if store.scheme == "az":
        from spotwise.runtime.storage.azblob import AzureBlobStorage

        account, container = bucket.split("/", 1)
        return AzureBlobStorage(account, container, prefix, retry=retry)
    from spotwise.runtime.storage.gcs import GcsStorage

    return GcsStorage(bucket, prefix, retry=retry)

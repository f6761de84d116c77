"""The object stores the checkpoint tests run against, one interface over both emulators: S3 on
moto_server, GCS on gcp-storage-emulator (both loopback subprocesses; product code sees only the
wire, through ``AWS_ENDPOINT_URL`` or ``STORAGE_EMULATOR_HOST``).

A test takes the ``objstore`` fixture (tests/runtime/conftest.py), parametrized over
:data:`SCHEMES`, instead of being copied per backend."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

SCHEMES = ("s3", "gs")


class ObjStore:
    """One emulated object store: ``scheme`` (``s3``/``gs``), its ``endpoint``, and what a process
    needs in its environment to reach it directly (:meth:`env`) or through a proxy (:meth:`env_via`)."""

    def __init__(self, scheme: str, server) -> None:
        self.scheme, self.server = scheme, server
        self.endpoint: str = server.endpoint

    def env(self) -> dict[str, str]:
        return self.server.env()

    def env_via(self, endpoint: str) -> dict[str, str]:
        """The environment that sends this store's traffic to ``endpoint`` (a fault proxy) instead."""
        key = "AWS_ENDPOINT_URL" if self.scheme == "s3" else "STORAGE_EMULATOR_HOST"
        return {**self.env(), key: endpoint}

    def make_bucket(self, name: str) -> str:
        if self.scheme == "s3":
            self.server.client("s3").create_bucket(Bucket=name)
        else:
            self.server.create_bucket(name)
        return name

    def keys(self, bucket: str) -> list[str]:
        """Every object key in ``bucket``, read over the wire without spotwise."""
        if self.scheme == "s3":
            return [o["Key"] for o in self.server.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])]
        url = f"{self.endpoint}/storage/v1/b/{urllib.parse.quote(bucket)}/o"
        with urllib.request.urlopen(url, timeout=10) as r:
            return [o["name"] for o in json.load(r).get("items", [])]


def open_store(store: ObjStore, bucket: str, prefix: str, retry):
    """spotwise's own backend for ``store`` (built in the caller's environment), with ``retry``."""
    if store.scheme == "s3":
        from spotwise.runtime.storage import S3Storage

        return S3Storage(bucket, prefix, retry=retry)
    from spotwise.runtime.gcs import GcsStorage

    return GcsStorage(bucket, prefix, retry=retry)

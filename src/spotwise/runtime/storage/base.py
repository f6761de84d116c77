"""Where checkpoints live: a narrow object-store protocol with a local, an S3, a GCS and an Azure Blob backend.

``open_storage(uri)`` takes ``file:///abs/path``, a plain path, ``s3://bucket/prefix``,
``gs://bucket/prefix`` (:mod:`spotwise.runtime.storage.gcs`) or ``az://account/container/prefix``
(:mod:`spotwise.runtime.storage.azblob`). Keys are
``/``-separated paths relative to the URI. The protocol is deliberately small (put/get a file or
bytes, list, delete a prefix) so the checkpointer's commit protocol is the same on every backend.

S3 goes through boto3 with its standard endpoint resolution, so ``AWS_ENDPOINT_URL`` (or
``AWS_ENDPOINT_URL_S3``) points it at moto, MinIO or any S3-compatible store. Transient failures
(5xx, throttling, connection resets, timeouts) are retried with exponential backoff by
:func:`with_retries` on top of botocore's own retries; an upload is never visible half-written
because S3 PUT/multipart-complete are atomic and local writes go through a temp file + rename.
GCS is the same through google-cloud-storage, Azure Blob through azure-storage-blob (their errors
are classified in :mod:`spotwise.runtime.storage.retry` too).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from spotwise.config import setting
from spotwise.extras import require
from spotwise.runtime.storage.retry import RetryPolicy, is_transient, with_retries

__all__ = ["RetryPolicy", "is_transient", "with_retries"]   # the retry policy lives in storage/retry.py


class Storage(Protocol):
    uri: str

    def put_file(self, local: Path, key: str) -> None: ...
    def put_bytes(self, key: str, data: bytes) -> None: ...
    def get_file(self, key: str, local: Path) -> None: ...
    def get_bytes(self, key: str) -> bytes | None: ...
    def list(self, prefix: str) -> list[str]: ...
    def delete_prefix(self, prefix: str) -> None: ...
    def child_uri(self, key: str) -> str: ...
    def local_path(self, key: str) -> Path | None: ...
    def has(self, key: str, *, size: int | None = None) -> bool: ...
    def fetch_url(self, key: str, *, expires_s: int) -> str: ...


class LocalStorage:
    """A directory on a (possibly shared) file system."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.uri = f"file://{self.root}"

    def _p(self, key: str) -> Path:
        return self.root / key

    def local_path(self, key: str) -> Path:
        return self._p(key)

    def child_uri(self, key: str) -> str:
        return f"file://{self._p(key)}"

    def put_file(self, local: Path, key: str) -> None:
        dst = self._p(key)
        if Path(local).resolve() == dst.resolve():
            return
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
        shutil.copyfile(local, tmp)
        os.replace(tmp, dst)

    def put_bytes(self, key: str, data: bytes) -> None:
        dst = self._p(key)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dst)

    def get_file(self, key: str, local: Path) -> None:
        src = self._p(key)
        if Path(local).resolve() != src.resolve():
            Path(local).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, local)

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return self._p(key).read_bytes()
        except FileNotFoundError:
            return None

    def list(self, prefix: str) -> list[str]:
        base = self._p(prefix)
        if not base.exists():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file())

    def delete_prefix(self, prefix: str) -> None:
        shutil.rmtree(self._p(prefix), ignore_errors=True)

    def has(self, key: str, *, size: int | None = None) -> bool:
        """Whether ``key`` exists (with ``size`` bytes, when given)."""
        p = self._p(key)
        return p.is_file() and (size is None or p.stat().st_size == size)

    def fetch_url(self, key: str, *, expires_s: int) -> str:
        """A URL a process on this machine reads ``key`` from (``curl`` reads ``file://``)."""
        return f"file://{self._p(key).absolute()}"


class S3Storage:
    """``s3://bucket/prefix`` through boto3 (endpoint from ``AWS_ENDPOINT_URL`` when set)."""

    def __init__(self, bucket: str, prefix: str, *, retry: RetryPolicy | None = None,
                 multipart_chunk_mb: int = 16, max_concurrency: int = 8) -> None:
        boto3 = require("boto3", "aws", "s3:// checkpoint storage")
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.retry = retry or RetryPolicy()
        self._client = boto3.client(
            "s3", config=Config(retries={"mode": "standard", "max_attempts": 3},
                                connect_timeout=5, read_timeout=30))
        self._signer: Any = None     # the SigV4 presigning client for the bucket's region (fetch_url)
        mb = 1024 * 1024
        self._transfer = TransferConfig(multipart_threshold=multipart_chunk_mb * mb,
                                        multipart_chunksize=multipart_chunk_mb * mb,
                                        max_concurrency=max_concurrency)

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def local_path(self, key: str) -> None:
        return None

    def child_uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._k(key)}"

    def put_file(self, local: Path, key: str) -> None:
        with_retries(lambda: self._client.upload_file(str(local), self.bucket, self._k(key),
                                                      Config=self._transfer),
                     what=f"upload {key}", policy=self.retry)

    def put_bytes(self, key: str, data: bytes) -> None:
        with_retries(lambda: self._client.put_object(Bucket=self.bucket, Key=self._k(key), Body=data),
                     what=f"put {key}", policy=self.retry)

    def get_file(self, key: str, local: Path) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        with_retries(lambda: self._client.download_file(self.bucket, self._k(key), str(local),
                                                        Config=self._transfer),
                     what=f"download {key}", policy=self.retry)

    def get_bytes(self, key: str) -> bytes | None:
        from botocore.exceptions import ClientError

        def get() -> bytes | None:
            try:
                return self._client.get_object(Bucket=self.bucket, Key=self._k(key))["Body"].read()
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return None
                raise

        return with_retries(get, what=f"get {key}", policy=self.retry)

    def list(self, prefix: str) -> list[str]:
        def lst() -> list[str]:
            out: list[str] = []
            strip = len(self.prefix) + 1 if self.prefix else 0
            for page in self._client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=self._k(prefix)):
                out.extend(o["Key"][strip:] for o in page.get("Contents", []))
            return sorted(out)

        return with_retries(lst, what=f"list {prefix}", policy=self.retry)

    def delete_prefix(self, prefix: str) -> None:
        keys = self.list(prefix)
        for i in range(0, len(keys), 1000):
            batch = [{"Key": self._k(k)} for k in keys[i:i + 1000]]
            with_retries(lambda: self._client.delete_objects(Bucket=self.bucket,
                                                             Delete={"Objects": batch}),
                         what=f"delete {prefix}", policy=self.retry)

    def has(self, key: str, *, size: int | None = None) -> bool:
        """Whether ``key`` exists (with ``size`` bytes, when given)."""
        from botocore.exceptions import ClientError

        def head() -> bool:
            try:
                got = self._client.head_object(Bucket=self.bucket, Key=self._k(key))
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                    return False
                raise
            return size is None or int(got.get("ContentLength", -1)) == size

        return with_retries(head, what=f"head {key}", policy=self.retry)

    def fetch_url(self, key: str, *, expires_s: int) -> str:
        """A presigned GET URL of ``key``, valid ``expires_s`` seconds: what a node without
        spotwise (or any AWS library) installed yet fetches with ``curl``.

        Always SigV4 (``X-Amz-Algorithm=AWS4-HMAC-SHA256``) with the bucket's own region in the
        credential scope, on that region's endpoint (``BUCKET.s3.REGION.amazonaws.com``, path
        style under an endpoint override such as moto or MinIO). boto3's default presign is
        SigV2 on the global endpoint, which S3 refuses on buckets created after June 24, 2020
        and on KMS-encrypted objects (``InvalidRequest``); a SigV4 URL scoped to another region is
        refused too (``AuthorizationQueryParametersError``), and a presigned URL cannot follow
        S3's region redirect. The region is looked up once per bucket (:func:`bucket_region`)."""
        if self._signer is None:
            from botocore.config import Config

            region = bucket_region(self._client, self.bucket)
            endpoint = self._client.meta.endpoint_url or ""
            on_aws = endpoint.endswith(_AWS_HOSTS)
            boto3 = require("boto3", "aws", "s3:// checkpoint storage")
            self._signer = boto3.client("s3", region_name=region, endpoint_url=None if on_aws else endpoint,
                                        config=Config(signature_version="s3v4",
                                                      s3={"addressing_style": "virtual" if on_aws else "path"}))
        return self._signer.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": self._k(key)}, ExpiresIn=int(expires_s))


_AWS_HOSTS = (".amazonaws.com", ".amazonaws.com.cn")
#: each bucket's region, by (endpoint override or "" on AWS, bucket): a bucket never changes region
_BUCKET_REGIONS: dict[tuple[str, str], str] = {}
_BUCKET_REGIONS_LOCK = threading.Lock()


def bucket_region(client, bucket: str) -> str:
    """The region ``bucket`` lives in, looked up once per process (then cached): what a SigV4
    URL's credential scope and endpoint must name. Raises RuntimeError naming the bucket when
    S3 says neither where it is nor that it exists."""
    endpoint = client.meta.endpoint_url or ""
    cache_key = ("" if endpoint.endswith(_AWS_HOSTS) else endpoint, bucket)
    with _BUCKET_REGIONS_LOCK:
        if cache_key in _BUCKET_REGIONS:
            return _BUCKET_REGIONS[cache_key]
    region = _lookup_bucket_region(client, bucket)
    with _BUCKET_REGIONS_LOCK:
        _BUCKET_REGIONS[cache_key] = region
    return region


def _lookup_bucket_region(client, bucket: str) -> str:
    """HeadBucket's ``x-amz-bucket-region`` header (S3 sends it on the 200 and on the 301/403 of a
    bucket in another region or another account's policy), else GetBucketLocation (an empty
    LocationConstraint is us-east-1, the legacy ``EU`` is eu-west-1)."""
    from botocore.exceptions import ClientError

    try:
        meta = client.head_bucket(Bucket=bucket)["ResponseMetadata"]
    except ClientError as e:
        meta = e.response.get("ResponseMetadata", {})
        if e.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket"):
            raise RuntimeError(f"s3://{bucket}: no such bucket (create it, e.g. with infra/aws)") from e
    region = (meta.get("HTTPHeaders") or {}).get("x-amz-bucket-region")
    if region:
        return region
    try:
        where = client.get_bucket_location(Bucket=bucket).get("LocationConstraint")
    except ClientError as e:
        raise RuntimeError(f"s3://{bucket}: cannot tell the bucket's region (HeadBucket sent no "
                           f"x-amz-bucket-region and GetBucketLocation failed: {e}); a presigned URL "
                           "must name it") from e
    return {None: "us-east-1", "": "us-east-1", "EU": "eu-west-1"}.get(where, where)


# Bucket naming rules of the clouds (checked before anything launches: a name the cloud refuses
# would only fail once the cluster is up and billing).
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# GCS: 3-63 characters (up to 222 with dots, each dot-separated part at most 63), lowercase
# letters, digits, '-', '_', '.', starting and ending with a letter or digit; no "goog" prefix
# and no "google" anywhere (GCS refuses both)
_GCS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_IPV4 = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
URI_FORMS = ("file:///ABSOLUTE/PATH, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or "
             "az://ACCOUNT/CONTAINER/PREFIX")
# Azure: a storage account is 3-24 lowercase letters and digits; a container 3-63 lowercase letters,
# digits and '-', starting and ending with a letter or digit, no '--'
_AZ_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")
_AZ_CONTAINER = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?!-)){1,61}[a-z0-9]$")


class BadStorageUri(ValueError):
    """A storage URI no node could use; the message says what is wrong and what is allowed."""


def expand_home(uri: str) -> str:
    """``${SPOTWISE_HOME}`` in a URI replaced by this process's spotwise home."""
    if "${SPOTWISE_HOME}" not in uri:
        return uri
    from spotwise.paths import home

    return uri.replace("${SPOTWISE_HOME}", str(home()))


def file_uri_path(uri: str) -> Path:
    """The absolute path of a ``file://`` URI (``${SPOTWISE_HOME}`` and ``~`` expanded).

    ``file://host/x`` names another machine's disk and ``file://../x`` or ``file://rel`` has no
    absolute path, so both raise :class:`BadStorageUri` rather than being guessed at."""
    raw = expand_home(uri)[len("file://"):]
    if raw.startswith("localhost/"):
        raw = raw[len("localhost"):]
    raw = os.path.expanduser(raw)
    if not raw.startswith("/"):
        raise BadStorageUri(f"{URI_FORMS} (a file URI has no host: three slashes, then an absolute path)")
    return Path(raw)


def check_uri(uri: str) -> str:
    """Refuse a storage URI no node could use; returns it unchanged when it is fine.

    Checked without touching storage (no I/O): the scheme; ``file://`` has an absolute local path
    and no host; ``s3://`` has a bucket name S3 accepts (3-63 lowercase
    letters, digits, ``.``, ``-``, not an IP address, no ``..``), ``gs://`` one GCS accepts (the same,
    plus ``_``; up to 222 with dots; no ``goog`` prefix, no ``google``), and a prefix without
    whitespace or control characters; ``az://`` has an account name (3-24 lowercase letters and
    digits) and a container name Azure accepts (3-63 lowercase letters, digits and ``-``, no
    ``--``, starting and ending with a letter or digit). Raises :class:`BadStorageUri`."""
    if not isinstance(uri, str) or any(ord(c) < 32 or ord(c) == 127 for c in uri):
        raise BadStorageUri(f"{URI_FORMS} (no control characters)")
    if uri.startswith("file://"):
        file_uri_path(uri)
        return uri
    u = urlparse(uri)
    if u.scheme not in ("s3", "gs", "az") or not uri.startswith(f"{u.scheme}://"):
        raise BadStorageUri(URI_FORMS)
    if u.scheme == "az":
        _check_az(uri)
    else:
        _check_bucket(u.scheme, uri[len(u.scheme) + 3:].split("/", 1)[0])
    if any(c.isspace() for c in uri):
        raise BadStorageUri(f"{URI_FORMS} (no whitespace in the prefix)")
    return uri


def _check_bucket(scheme: str, bucket: str) -> None:
    """Refuse an ``s3://`` or ``gs://`` bucket name the cloud would refuse."""
    if not bucket:
        raise BadStorageUri(f"{URI_FORMS} (a URI with a bucket name, e.g. {scheme}://my-bucket/ckpt)")
    if scheme == "s3":
        ok = bool(_S3_BUCKET.match(bucket))
        rule = "3-63 lowercase letters, digits, '.' or '-', starting and ending with a letter or digit"
    else:
        ok = bool(_GCS_BUCKET.match(bucket)) and all(len(part) <= 63 for part in bucket.split(".")) and (
            "." in bucket or len(bucket) <= 63) and not bucket.startswith("goog") and "google" not in bucket
        rule = ("3-63 lowercase letters, digits, '.', '-' or '_' (up to 222 with dots), starting and ending "
                "with a letter or digit, not starting with 'goog' nor containing 'google'")
    if not ok or ".." in bucket or _IPV4.match(bucket):
        raise BadStorageUri(f"{scheme}://BUCKET/PREFIX with a valid bucket name ({rule}); got bucket {bucket!r}")


def _check_az(uri: str) -> None:
    """Refuse an ``az://ACCOUNT/CONTAINER/PREFIX`` whose account or container name Azure would refuse."""
    account, _, rest = uri[len("az://"):].partition("/")
    container = rest.split("/", 1)[0]
    if not _AZ_ACCOUNT.match(account):
        raise BadStorageUri("az://ACCOUNT/CONTAINER/PREFIX with a valid storage account name (3-24 lowercase "
                            f"letters and digits); got account {account!r}")
    if not _AZ_CONTAINER.match(container):
        raise BadStorageUri("az://ACCOUNT/CONTAINER/PREFIX with a valid container name (3-63 lowercase letters, "
                            "digits or '-', starting and ending with a letter or digit, no '--'); "
                            f"got container {container!r}")


def file_storage_root() -> Path:
    """Where ``file://`` storage of API-submitted jobs must live: ``SPOTWISE_FILE_STORAGE_ROOT``,
    else ``$SPOTWISE_HOME/checkpoints``."""
    env = setting("SPOTWISE_FILE_STORAGE_ROOT")
    if env:
        return Path(os.path.expanduser(env)).absolute()
    from spotwise.paths import home

    return home() / "checkpoints"


def confine_file_uri(uri: str, root: Path | None = None) -> str:
    """``uri`` when it is a ``file://`` URI inside ``root`` (default :func:`file_storage_root`);
    other schemes pass through (after :func:`check_uri`).

    Why: a job submitted through the API writes its checkpoints with the server's rights, so an
    API token must not let its holder create directories or files anywhere the server user can.
    ``..`` components are refused outright and symlinks are resolved before comparing, so neither
    can step out of the root. Raises :class:`BadStorageUri`."""
    check_uri(uri)
    if not uri.startswith("file://"):
        return uri
    root = (root or file_storage_root()).resolve()
    path = file_uri_path(uri)
    if ".." in path.parts:
        raise BadStorageUri(f"a file:// URI under {root} without '..' components")
    real = path.resolve()
    if real != root and root not in real.parents:
        raise BadStorageUri(f"a file:// URI under {root} (the server's file storage root, "
                            "SPOTWISE_FILE_STORAGE_ROOT), s3://, gs:// or az://")
    return uri


def open_storage(uri: str) -> Storage:
    """A :class:`Storage` for ``uri`` (``file://``, plain path, ``s3://``, ``gs://`` or ``az://``)."""
    u = urlparse(uri)
    if u.scheme in ("", "file"):
        path = u.path if u.scheme == "file" else uri
        if u.scheme == "file" and u.netloc:
            raise ValueError(f"storage uri {uri!r}: file URIs must be absolute (file:///path)")
        return LocalStorage(Path(path).absolute())
    if u.scheme == "s3":
        if not u.netloc:
            raise ValueError(f"storage uri {uri!r}: missing bucket (s3://bucket/prefix)")
        return S3Storage(u.netloc, u.path)
    if u.scheme == "gs":
        if not u.netloc:
            raise ValueError(f"storage uri {uri!r}: missing bucket (gs://bucket/prefix)")
        from spotwise.runtime.storage.gcs import GcsStorage

        return GcsStorage(u.netloc, u.path)
    if u.scheme == "az":
        container, _, prefix = u.path.lstrip("/").partition("/")
        if not u.netloc or not container:
            raise ValueError(f"storage uri {uri!r}: missing account or container (az://account/container/prefix)")
        from spotwise.runtime.storage.azblob import AzureBlobStorage

        return AzureBlobStorage(u.netloc, container, prefix)
    raise ValueError(f"storage uri {uri!r}: scheme {u.scheme!r} not supported; allowed: file://, s3://, gs://, az://")

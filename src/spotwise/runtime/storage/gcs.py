"""``gs://bucket/prefix`` checkpoint storage through Google's own client (``google-cloud-storage``).

The same :class:`~spotwise.runtime.storage.base.Storage` contract as S3, so the checkpointer's layout
and commit protocol (shards first, the ``COMMITTED`` marker last, keep-last pruning) are unchanged:

* **Atomic objects.** A GCS upload (single request or resumable) is visible only once it is
  complete, so a reader never sees half a shard; a retried upload simply overwrites.
* **Credentials** are Application Default Credentials, found by ``google.auth``: on a GCP VM its
  service account through the metadata server, elsewhere ``GOOGLE_APPLICATION_CREDENTIALS`` or
  ``gcloud auth application-default login``. No key is read or stored by spotwise.
* **Endpoint.** ``SPOTWISE_GCS_ENDPOINT`` (e.g. ``http://127.0.0.1:9023``) points the client at
  another JSON API endpoint *with the same credentials* (the emulated GCP's authenticating GCS,
  a private endpoint); ``STORAGE_EMULATOR_HOST`` (the library's own variable) points it at an
  emulator with anonymous credentials.
* **Retries** are ours alone (:mod:`spotwise.runtime.storage.retry`: the S3 policy, extended to
  google.api_core's 429/5xx and connection errors); the library's own retry is switched off per
  call (``retry=None``) so a failing store costs one policy's backoff, not two nested ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spotwise.config import setting
from spotwise.errors import SpotwiseError
from spotwise.extras import require
from spotwise.runtime.storage.retry import RetryPolicy, with_retries

#: seconds to connect, seconds to wait for each read (a shard upload is streamed, not waited on whole)
TIMEOUT = (5, 60)


class GcsCredentialsMissing(SpotwiseError):
    """No Application Default Credentials: nothing here can reach a ``gs://`` bucket (exit 1: the
    input is fine, this machine's setup is not)."""


class CannotSign(SpotwiseError):
    """The credentials in use cannot sign a URL (e.g. anonymous ones, against an emulator)."""


class GcsStorage:
    """``gs://bucket/prefix`` through ``google-cloud-storage`` (ADC; ``STORAGE_EMULATOR_HOST`` when set)."""

    def __init__(self, bucket: str, prefix: str, *, retry: RetryPolicy | None = None,
                 credentials: Any = None) -> None:
        """``credentials``: a ``google.auth`` credentials object; None (the default) finds ADC."""
        gcs = require("google.cloud.storage", "gcp", "gs:// checkpoint storage")
        from google.auth.exceptions import DefaultCredentialsError

        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.uri = f"gs://{bucket}/{self.prefix}" if self.prefix else f"gs://{bucket}"
        self.retry = retry or RetryPolicy()
        try:
            # project=None: object reads and writes need no project (and a VM's may be unknown)
            endpoint = setting("SPOTWISE_GCS_ENDPOINT")
            self._client = gcs.Client(project=None, credentials=credentials,
                                      client_options={"api_endpoint": endpoint} if endpoint else None)
        except DefaultCredentialsError as e:
            raise GcsCredentialsMissing(
                f"{self.uri}: no Google Application Default Credentials (on a GCP VM they are its service "
                "account; elsewhere set GOOGLE_APPLICATION_CREDENTIALS or run `gcloud auth "
                f"application-default login`): {e}") from None
        self._bucket = self._client.bucket(bucket)

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _blob(self, key: str) -> Any:
        return self._bucket.blob(self._k(key))

    def local_path(self, key: str) -> None:
        return None

    def child_uri(self, key: str) -> str:
        return f"gs://{self.bucket}/{self._k(key)}"

    def put_file(self, local: Path, key: str) -> None:
        with_retries(lambda: self._blob(key).upload_from_filename(str(local), retry=None, timeout=TIMEOUT),
                     what=f"upload {key}", policy=self.retry)

    def put_bytes(self, key: str, data: bytes) -> None:
        with_retries(lambda: self._blob(key).upload_from_string(data, retry=None, timeout=TIMEOUT),
                     what=f"put {key}", policy=self.retry)

    def get_file(self, key: str, local: Path) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        with_retries(lambda: self._blob(key).download_to_filename(str(local), retry=None, timeout=TIMEOUT),
                     what=f"download {key}", policy=self.retry)

    def get_bytes(self, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        def get() -> bytes | None:
            try:
                return bytes(self._blob(key).download_as_bytes(retry=None, timeout=TIMEOUT))
            except NotFound:
                return None

        return with_retries(get, what=f"get {key}", policy=self.retry)

    def list(self, prefix: str) -> list[str]:
        strip = len(self.prefix) + 1 if self.prefix else 0

        def lst() -> list[str]:
            blobs = self._client.list_blobs(self.bucket, prefix=self._k(prefix), retry=None, timeout=TIMEOUT)
            return sorted(b.name[strip:] for b in blobs)

        return with_retries(lst, what=f"list {prefix}", policy=self.retry)

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under ``prefix``, one request each (a retried delete of an object
        already gone is a 404, which counts as done: deleting is idempotent)."""
        from google.api_core.exceptions import NotFound

        for key in self.list(prefix):
            def delete(key: str = key) -> None:
                try:
                    self._blob(key).delete(retry=None, timeout=TIMEOUT)
                except NotFound:
                    pass

            with_retries(delete, what=f"delete {key}", policy=self.retry)

    def has(self, key: str, *, size: int | None = None) -> bool:
        """Whether ``key`` exists (with ``size`` bytes, when given)."""
        def head() -> bool:
            blob = self._bucket.get_blob(self._k(key), retry=None, timeout=TIMEOUT)
            return blob is not None and (size is None or int(blob.size or 0) == size)

        return with_retries(head, what=f"head {key}", policy=self.retry)

    def fetch_url(self, key: str, *, expires_s: int) -> str:
        """A V4 signed GET URL of ``key``, valid ``expires_s`` seconds (at most 7 days, GCS's
        limit): what a node without spotwise or any Google library fetches with ``curl``.

        Credentials with a private key (a service-account key file) sign locally; a VM's metadata
        credentials have none, so they sign through the IAM Credentials API (``signBlob``: the
        service account needs ``iam.serviceAccounts.signBlob`` on itself). Anything else (user
        credentials, the emulator's anonymous ones) raises :class:`CannotSign`."""
        from datetime import timedelta

        from google.auth.credentials import Signing
        from google.auth.transport.requests import Request

        creds = self._client._credentials
        kw: dict[str, Any] = {}
        if not isinstance(creds, Signing):
            email = getattr(creds, "service_account_email", None)
            if not email or not hasattr(creds, "refresh"):
                raise CannotSign(f"{self.child_uri(key)}: the credentials in use ({type(creds).__name__}) "
                                 "cannot sign a fetch URL; use a service account (a VM's, or "
                                 "GOOGLE_APPLICATION_CREDENTIALS) with iam.serviceAccounts.signBlob")
            if not creds.valid:
                creds.refresh(Request())
            kw = {"service_account_email": creds.service_account_email, "access_token": creds.token}
        return str(self._blob(key).generate_signed_url(
            version="v4", method="GET", expiration=timedelta(seconds=min(int(expires_s), 7 * 24 * 3600)), **kw))

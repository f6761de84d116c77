"""When an object-store call is worth retrying, and how: one policy for every backend.

:func:`with_retries` runs a storage call with exponential backoff and full jitter, retrying only
what :func:`is_transient` calls transient: 5xx, 429/throttling, request timeouts and
connection-level errors, as botocore reports them for S3 and as google.api_core / google.auth /
``requests`` report them for GCS, and as azure-core reports them for Azure Blob. Anything else (a 403, a 404, a bad request) fails at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

from spotwise.utils.retry import with_backoff

T = TypeVar("T")


@dataclass(kw_only=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter: ``sleep = U(0, min(cap, base * 2**attempt))``."""

    attempts: int = 8
    base_s: float = 0.1
    cap_s: float = 5.0


def with_retries(fn: Callable[[], T], *, what: str, policy: RetryPolicy | None = None) -> T:
    """Run ``fn``; retry it on transient storage errors (see :func:`is_transient`), full jitter."""
    policy = policy or RetryPolicy()
    return with_backoff(fn, should_retry=is_transient, attempts=policy.attempts, base_s=policy.base_s,
                        cap_s=policy.cap_s)


def is_transient(e: BaseException) -> bool:
    """5xx, throttling, request timeouts and connection-level errors are worth retrying (botocore's
    for S3, google.api_core's and the ``requests`` transport's for GCS, azure-core's for Azure Blob)."""
    return (_boto_transient(e) or _google_transient(e) or _azure_transient(e)
            or isinstance(e, (ConnectionError, TimeoutError)))


def _boto_transient(e: BaseException) -> bool:
    try:
        from botocore.exceptions import (
            ClientError,
            ConnectionError as BotoConnectionError,
            ReadTimeoutError,
            ResponseStreamingError,
        )
        from boto3.exceptions import S3UploadFailedError
    except ImportError:  # no [aws] extra: no boto3 error can occur
        return False
    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500 or status == 429 or err.get("Code") in {
            "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
            "ServiceUnavailable", "RequestTimeTooSkewed"}
    if isinstance(e, S3UploadFailedError):
        return True   # boto3 wraps the multipart failure; the cause was already classified there
    return isinstance(e, (BotoConnectionError, ReadTimeoutError, ResponseStreamingError))


def _google_transient(e: BaseException) -> bool:
    try:
        from google.api_core.exceptions import GoogleAPICallError
        from google.auth.exceptions import TransportError
        from requests.exceptions import ChunkedEncodingError, ConnectionError as RequestsConnectionError, Timeout
    except ImportError:  # no [gcp] extra: no google error can occur
        return False
    if isinstance(e, GoogleAPICallError):
        code = e.code if isinstance(e.code, int) else 0
        return code == 429 or code == 408 or code >= 500
    if type(e).__name__ == "DataCorruption":   # a download whose checksum did not match (a truncated body)
        return True
    return isinstance(e, (TransportError, RequestsConnectionError, ChunkedEncodingError, Timeout))


def _azure_transient(e: BaseException) -> bool:
    try:
        from azure.core.exceptions import (
            HttpResponseError,
            IncompleteReadError,
            ServiceRequestError,
            ServiceResponseError,
        )
    except ImportError:  # no [azure] extra: no azure-core error can occur
        return False
    if isinstance(e, IncompleteReadError):   # the body ended early (a connection cut mid-download)
        return True
    if isinstance(e, HttpResponseError):
        code = e.status_code or 0
        return code in (408, 429) or code >= 500
    return isinstance(e, (ServiceRequestError, ServiceResponseError))

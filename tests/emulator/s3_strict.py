"""S3 as strict as a real bucket about presigned URLs: a WSGI layer in front of moto's server.

moto checks no signature, so a URL a real bucket refuses (signed SigV2, signed for another region,
tampered, expired) downloads fine from it and no test could see the difference. This layer checks
every request that carries its authentication in the query string (a presigned URL, what a node's
``curl`` fetches the shipped wheel with) before moto sees it, and answers as S3 does:

* SigV2 query authentication (``AWSAccessKeyId`` + ``Signature``): ``400 InvalidRequest``, "The
  authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256." S3
  refuses SigV2 on every bucket created after June 24, 2020 and on every KMS-encrypted object
  whatever its bucket's age (AWS re:Post announcement "AWS Signature Version 4 to replace AWS
  Signature Version 2 for signing S3 API requests", revised plan; AWS knowledge center
  "s3-kms-signature-version-error"; S3 API reference, "Appendix: Authenticating requests (AWS
  signature version 2)": "Signature Version 4 is ... the only version that is supported for new
  Regions"). Every bucket here is such a bucket. A SigV2 ``Authorization: AWS ...`` header is
  refused the same way.
* SigV4 query authentication whose credential scope names another region than the bucket's:
  ``400 AuthorizationQueryParametersError``, "Error parsing the X-Amz-Credential parameter; the
  region 'R' is wrong; expecting 'B'" with ``<Region>B</Region>`` (S3's answer as quoted in
  aws/aws-cli#4338 and ai-dock/comfyui#34; the header-signed twin is
  ``AuthorizationHeaderMalformed``).
* an access key S3 does not know: ``403 InvalidAccessKeyId``; a signature that does not verify
  (recomputed with botocore's own SigV4 query signer, :class:`botocore.auth.S3SigV4QueryAuth`,
  against the emulator's known keys): ``403 SignatureDoesNotMatch``, "The request signature we
  calculated does not match the signature you provided. Check your key and signing method." (IAM
  user guide, "Troubleshoot Signature Version 4 signing"); past ``X-Amz-Date + X-Amz-Expires``:
  ``403 AccessDenied``, "Request has expired"; ``X-Amz-Expires`` over 604800:
  ``400 AuthorizationQueryParametersError`` (S3 API reference, "Authenticating Requests: Using
  Query Parameters": at most seven days).

What is checked is what real S3 checks for these URLs; requests signed in the ``Authorization``
header with SigV4 (the SDK's own calls) pass through to moto unchanged (botocore follows S3's
region redirect for those itself). Test support only, never product code.
"""

from __future__ import annotations

import hmac
import time
from calendar import timegm
from typing import Callable, Iterable
from urllib.parse import parse_qsl, quote, unquote
from xml.sax.saxutils import escape

#: the secret of every access key the emulated AWS hands out (the launcher's keys and the ones
#: a node's instance profile gets from its metadata server are the same test keys)
KNOWN_KEYS = {"testing": "testing"}
ACCOUNT = "123456789012"          # moto's default account: where its buckets live
MAX_EXPIRES_S = 604800

StartResponse = Callable[..., object]


def bucket_region(bucket: str) -> str | None:
    """The region moto created ``bucket`` in (None when it does not exist: moto answers that)."""
    from moto.s3.models import s3_backends

    partition, account = s3_backends.bucket_accounts.get(bucket, ("aws", ACCOUNT))
    b = s3_backends[account][partition].buckets.get(bucket)
    return getattr(b, "region_name", None) if b is not None else None


def _error(start_response: StartResponse, status: str, code: str, message: str,
           **extra: str) -> Iterable[bytes]:
    fields = "".join(f"<{k}>{escape(v)}</{k}>" for k, v in extra.items())
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{escape(message)}'
            f"</Message>{fields}<RequestId>emulated</RequestId></Error>").encode()
    start_response(status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
    return [body]


def _bucket_of(environ: dict, path: str) -> str:
    """The bucket a request names: its virtual host (``BUCKET.s3...``) or the path's first part."""
    host = (environ.get("HTTP_HOST") or "").split(":")[0]
    if ".s3." in host or host.endswith(".s3.amazonaws.com"):
        return host.split(".s3", 1)[0]
    return unquote(path.lstrip("/").split("/", 1)[0])


def check(environ: dict) -> tuple[str, str, str, dict[str, str]] | None:
    """Why S3 would refuse this request (status, code, message, extra XML fields), or None."""
    auth = environ.get("HTTP_AUTHORIZATION") or ""
    if auth.startswith("AWS ") and ":" in auth:
        return ("400 Bad Request", "InvalidRequest", "The authorization mechanism you have provided is not "
                "supported. Please use AWS4-HMAC-SHA256.", {})
    raw_query = environ.get("QUERY_STRING") or ""
    pairs = parse_qsl(raw_query, keep_blank_values=True)
    q = dict(pairs)
    if "Signature" in q and "AWSAccessKeyId" in q:
        return ("400 Bad Request", "InvalidRequest", "The authorization mechanism you have provided is not "
                "supported. Please use AWS4-HMAC-SHA256.", {})
    if "X-Amz-Signature" not in q:
        return None
    raw_uri = environ.get("RAW_URI") or environ.get("REQUEST_URI") or quote(environ.get("PATH_INFO", "/"))
    path = raw_uri.split("?", 1)[0]
    if "://" in path:                       # an absolute request-target
        path = "/" + path.split("://", 1)[1].split("/", 1)[-1]
    if q.get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256":
        return ("400 Bad Request", "AuthorizationQueryParametersError",
                "X-Amz-Algorithm only supports \"AWS4-HMAC-SHA256\"", {})
    scope = q.get("X-Amz-Credential", "").split("/")
    if len(scope) != 5 or scope[3] != "s3" or scope[4] != "aws4_request":
        return ("400 Bad Request", "AuthorizationQueryParametersError",
                "Error parsing the X-Amz-Credential parameter; the Credential is mal-formed; expecting "
                "\"<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/aws4_request\".", {})
    akid, day, region = scope[0], scope[1], scope[2]
    bucket = _bucket_of(environ, path)
    want = bucket_region(bucket) if bucket else None
    if want is not None and region != want:
        return ("400 Bad Request", "AuthorizationQueryParametersError",
                f"Error parsing the X-Amz-Credential parameter; the region '{region}' is wrong; "
                f"expecting '{want}'", {"Region": want})
    try:
        expires = int(q.get("X-Amz-Expires", ""))
        signed_at = timegm(time.strptime(q.get("X-Amz-Date", ""), "%Y%m%dT%H%M%SZ"))
    except ValueError:
        return ("400 Bad Request", "AuthorizationQueryParametersError",
                "X-Amz-Date and X-Amz-Expires must be given, as YYYYMMDD'T'HHMMSS'Z' and seconds", {})
    if expires > MAX_EXPIRES_S:
        return ("400 Bad Request", "AuthorizationQueryParametersError",
                "X-Amz-Expires must be less than a week (in seconds) that is; 604800", {})
    if q["X-Amz-Date"][:8] != day:
        return ("403 Forbidden", "SignatureDoesNotMatch", "The request signature we calculated does not match "
                "the signature you provided. Check your key and signing method.", {})
    secret = KNOWN_KEYS.get(akid)
    if secret is None:
        return ("403 Forbidden", "InvalidAccessKeyId",
                "The AWS Access Key Id you provided does not exist in our records.", {"AWSAccessKeyId": akid})
    if not hmac.compare_digest(_signature(environ, path, raw_query, q, akid, secret, region),
                               q["X-Amz-Signature"]):
        return ("403 Forbidden", "SignatureDoesNotMatch", "The request signature we calculated does not match "
                "the signature you provided. Check your key and signing method.", {"AWSAccessKeyId": akid})
    if time.time() > signed_at + expires:
        return ("403 Forbidden", "AccessDenied", "Request has expired", {})
    return None


def _signature(environ: dict, path: str, raw_query: str, q: dict[str, str], akid: str, secret: str,
               region: str) -> str:
    """The SigV4 query signature S3 computes for this request, with botocore's own signer."""
    from botocore.auth import S3SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    unsigned = "&".join(p for p in raw_query.split("&") if not p.startswith("X-Amz-Signature="))
    host = environ.get("HTTP_HOST") or ""
    headers = {}
    for name in q.get("X-Amz-SignedHeaders", "host").split(";"):
        value = host if name == "host" else environ.get("HTTP_" + name.upper().replace("-", "_"), "")
        headers[name] = value
    req = AWSRequest(method=environ.get("REQUEST_METHOD", "GET"), url=f"http://{host}{path}?{unsigned}",
                     headers=headers)
    req.context["timestamp"] = q["X-Amz-Date"]
    signer = S3SigV4QueryAuth(Credentials(akid, secret, q.get("X-Amz-Security-Token")), "s3", region)
    canonical = signer.canonical_request(req)
    return signer.signature(signer.string_to_sign(req, canonical), req)


class StrictS3:
    """The WSGI layer: a refused request is answered here; every other goes to ``app`` (moto)."""

    def __init__(self, app: Callable[[dict, StartResponse], Iterable[bytes]]) -> None:
        self.app = app

    def __call__(self, environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        refused = check(environ)
        if refused is not None:
            status, code, message, extra = refused
            return _error(start_response, status, code, message, **extra)
        return self.app(environ, start_response)

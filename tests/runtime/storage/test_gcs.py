"""``gs://`` storage specifics against gcp-storage-emulator on loopback (the checkpoint layout,
keep-last and fault tests run on both stores in test_s3.py / test_s3_faults.py): the emulator is
as strict as GCS where the checkpointer depends on it, and fetch URLs are V4-signed or refused."""

import urllib.parse
import urllib.request

import pytest
from google.api_core.exceptions import NotFound
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from spotwise.runtime.storage.gcs import CannotSign, GcsStorage
from spotwise.runtime.storage.base import open_storage

from ..fakes import EnvPatch


@pytest.fixture
def bucket(gcs, request):
    return gcs.create_bucket("gcs-" + request.node.name.replace("_", "-")[:50].lower())


def test_emulator_is_as_strict_as_gcs_where_checkpoints_depend_on_it(gcs, bucket, tmp_path):
    with EnvPatch(gcs.env()):
        st = open_storage(f"gs://{bucket}/run")
        assert isinstance(st, GcsStorage) and st.uri == f"gs://{bucket}/run"
        assert st.get_bytes("missing") is None and not st.has("missing")   # a 404, not an empty object
        st.put_bytes("a/x", b"one")
        st.put_bytes("a/x", b"second")                  # no generation precondition: replaced
        st.put_bytes("a/y", b"2")
        st.put_bytes("ab/z", b"3")
        assert st.get_bytes("a/x") == b"second" and st.has("a/x", size=6) and not st.has("a/x", size=3)
        assert st.list("a/") == ["a/x", "a/y"]          # a prefix, not a glob: ab/z is not under a/
        assert st.child_uri("a/x") == f"gs://{bucket}/run/a/x"
        st.delete_prefix("a/")
        st.delete_prefix("a/")                          # deleting nothing is fine
        assert st.list("") == ["ab/z"]
        with pytest.raises(NotFound):                   # not retried: a 404 is not transient
            st.get_file("missing", tmp_path / "x")


def _service_account_key() -> dict:
    """A throwaway service-account key (made here; signing with it needs no network)."""
    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    return {"type": "service_account", "client_email": "ckpt@test-project.iam.gserviceaccount.com",
            "private_key": pem, "private_key_id": "k1", "token_uri": "https://oauth2.googleapis.com/token",
            "project_id": "test-project"}


def test_fetch_url_is_a_v4_signed_get_a_plain_http_client_can_read(gcs, bucket):
    from google.oauth2 import service_account

    creds = service_account.Credentials.from_service_account_info(_service_account_key())
    with EnvPatch(gcs.env()):
        GcsStorage(bucket, "run").put_bytes("_builds/abc/w.whl", b"wheel bytes")
        url = GcsStorage(bucket, "run", credentials=creds).fetch_url("_builds/abc/w.whl", expires_s=600)
    q = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    assert url.startswith(f"{gcs.endpoint}/{bucket}/run/_builds/abc/w.whl?")
    assert q["X-Goog-Algorithm"] == ["GOOG4-RSA-SHA256"] and q["X-Goog-Expires"] == ["600"]
    assert q["X-Goog-Credential"][0].startswith("ckpt@test-project.iam.gserviceaccount.com/")
    assert len(q["X-Goog-Signature"][0]) == 512       # RSA-2048, hex
    with urllib.request.urlopen(url, timeout=10) as r:   # no Google library, as on a fresh node
        assert r.read() == b"wheel bytes"


def test_fetch_url_without_signing_credentials_is_a_clear_error(gcs, bucket):
    with EnvPatch(gcs.env()):
        with pytest.raises(CannotSign, match="cannot sign a fetch URL.*signBlob"):
            GcsStorage(bucket, "run").fetch_url("x", expires_s=60)   # the emulator's anonymous credentials

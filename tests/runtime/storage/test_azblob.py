"""``az://`` storage specifics against Azurite on loopback (the checkpoint layout, keep-last and
fault tests run on every store in test_s3.py / test_s3_faults.py): the emulator is as strict as
Azure where the checkpointer depends on it, fetch URLs are read-only SAS URLs Azurite verifies, and
credentials that do not work are a clear error, not a traceback."""

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from azure.core.exceptions import ResourceNotFoundError

from emulator.azurite_server import ACCOUNT, conn_str
from spotwise.runtime.storage.azblob import AzureAuthFailed, AzureBlobStorage, parse_conn_str
from spotwise.runtime.storage.base import RetryPolicy, open_storage

from ..fakes import EnvPatch


@pytest.fixture
def container(azurite, request):
    return azurite.create_container("az-" + request.node.name.replace("_", "-")[:50].lower().strip("-"))


def test_emulator_is_as_strict_as_azure_where_checkpoints_depend_on_it(azurite, container, tmp_path):
    with EnvPatch(azurite.env()):
        st = open_storage(f"az://{ACCOUNT}/{container}/run")
        assert isinstance(st, AzureBlobStorage) and st.uri == f"az://{ACCOUNT}/{container}/run"
        assert st.get_bytes("missing") is None and not st.has("missing")   # a 404, not an empty blob
        st.put_bytes("a/x", b"one")
        st.put_bytes("a/x", b"second")                  # overwritten
        st.put_bytes("a/y", b"2")
        st.put_bytes("ab/z", b"3")
        assert st.get_bytes("a/x") == b"second" and st.has("a/x", size=6) and not st.has("a/x", size=3)
        assert st.list("a/") == ["a/x", "a/y"]          # a prefix, not a glob: ab/z is not under a/
        assert st.child_uri("a/x") == f"az://{ACCOUNT}/{container}/run/a/x"
        big = tmp_path / "big"
        big.write_bytes(bytes(range(256)) * 4096 * 5)   # 5 MiB in 1 MiB blocks: Put Block + Put Block List
        AzureBlobStorage(ACCOUNT, container, "run", chunk_mb=1).put_file(big, "big")
        st.get_file("big", tmp_path / "back")
        assert (tmp_path / "back").read_bytes() == big.read_bytes()
        st.delete_prefix("a/")
        st.delete_prefix("a/")                          # deleting nothing is fine
        assert st.list("") == ["ab/z", "big"]
        with pytest.raises(ResourceNotFoundError):      # not retried: a 404 is not transient
            st.get_file("missing", tmp_path / "x")
    assert "run/ab/z" in [b.name for b in azurite.service().get_container_client(container).list_blobs()]


def test_fetch_url_is_a_read_only_sas_a_plain_http_client_can_read(azurite, container):
    with EnvPatch(azurite.env()):
        st = AzureBlobStorage(ACCOUNT, container, "run")
        st.put_bytes("_builds/abc/w.whl", b"wheel bytes")
        url = st.fetch_url("_builds/abc/w.whl", expires_s=600)
    q = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    assert url.startswith(f"{azurite.blob_endpoint}/{container}/run/_builds/abc/w.whl?")
    assert q["sp"] == ["r"] and q["sr"] == ["b"] and "sig" in q
    with urllib.request.urlopen(url, timeout=10) as r:   # no Azure library, as on a fresh node
        assert r.read() == b"wheel bytes"
    forged = url.replace("sp=r", "sp=rw")                # Azurite checks the signature
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(forged, data=b"x", method="PUT",
                                                      headers={"x-ms-blob-type": "BlockBlob"}), timeout=10)
    assert e.value.code == 403


def test_a_wrong_account_key_is_a_clear_error_not_retried(azurite, container):
    bad = conn_str(azurite.blob_endpoint).replace("AccountKey=", "AccountKey=AAAA")
    with EnvPatch({"AZURE_STORAGE_CONNECTION_STRING": bad}):
        st = AzureBlobStorage(ACCOUNT, container, "run", retry=RetryPolicy(attempts=2, base_s=0.01, cap_s=0.01))
        with pytest.raises(AzureAuthFailed, match=f"storage account '{ACCOUNT}'.*az login"):
            st.put_bytes("x", b"1")


def test_credentials_are_picked_by_account(monkeypatch):
    """A connection string for another account is not used for this one (it would write elsewhere);
    AZURE_STORAGE_KEY pairs with the URI's account; the endpoint setting fills in the account."""
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", conn_str("http://127.0.0.1:1/devstoreaccount1"))
    monkeypatch.setenv("AZURE_STORAGE_KEY", "a2V5")
    monkeypatch.setenv("SPOTWISE_AZURE_BLOB_ENDPOINT", "https://{account}.blob.example.net")
    st = AzureBlobStorage("otheraccount", "ckpt", "p")
    assert st._service.url.startswith("https://otheraccount.blob.example.net")
    assert st._service.credential.account_name == "otheraccount"
    assert parse_conn_str("A=1;AccountKey=ab==;B= 2 ")["AccountKey"] == "ab=="


def _b64(obj: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")


class EntraToken:
    """A token credential like a managed identity's: ``get_token`` for Azure Storage's scope gives a
    JWT whose issuer, audience and lifetime are Entra ID's shape (Azurite checks those three; no
    signature, which Azurite does not check). ``lifetime_s`` < 0 gives an expired one."""

    def __init__(self, *, lifetime_s: int = 3600) -> None:
        self.lifetime_s, self.scopes = lifetime_s, []

    def get_token(self, *scopes, **kw):
        from azure.core.credentials import AccessToken

        self.scopes.extend(scopes)
        now, tid = int(time.time()), "72f988bf-86f1-41af-91ab-2d7cd011db47"
        claims = {"aud": "https://storage.azure.com", "iss": f"https://sts.windows.net/{tid}/", "iat": now - 600,
                  "nbf": now - 600, "exp": now + self.lifetime_s, "oid": "0b1f0c6e-5a0c-4b8e-9d1e-5c7a2b1f4e3d",
                  "tid": tid}
        return AccessToken(f"{_b64({'alg': 'RS256', 'typ': 'JWT'})}.{_b64(claims)}.c2ln", now + self.lifetime_s)


@pytest.fixture(scope="module")
def azurite_tls(azurite):   # azurite: skips where it is not installed
    from emulator.azurite_server import Azurite

    a = Azurite(https=True)
    yield a
    a.close()


def test_a_token_credential_reads_writes_and_signs_user_delegation_sas_urls(azurite_tls, monkeypatch):
    """What a node's managed identity does: bearer tokens (over HTTPS, as Azure requires) for every
    call, and a user-delegation SAS for fetch URLs; the endpoint from SPOTWISE_AZURE_BLOB_ENDPOINT."""
    container = azurite_tls.create_container("az-token")
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_KEY", raising=False)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", azurite_tls.ca)
    monkeypatch.setenv("SPOTWISE_AZURE_BLOB_ENDPOINT", f"{azurite_tls.endpoint}/{{account}}")
    cred = EntraToken()
    st = AzureBlobStorage(ACCOUNT, container, "run", credential=cred)
    st.put_bytes("ckpt/COMMITTED", b"ok")
    assert st.list("ckpt/") == ["ckpt/COMMITTED"] and st.has("ckpt/COMMITTED", size=2)
    assert st.get_bytes("ckpt/COMMITTED") == b"ok" and cred.scopes[0] == "https://storage.azure.com/.default"
    url = st.fetch_url("ckpt/COMMITTED", expires_s=300)
    q = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    assert q["skoid"] == ["0b1f0c6e-5a0c-4b8e-9d1e-5c7a2b1f4e3d"] and q["sp"] == ["r"]   # user delegation
    with urllib.request.urlopen(url, timeout=10, context=azurite_tls.ssl_context()) as r:
        assert r.read() == b"ok"
    expired = AzureBlobStorage(ACCOUNT, container, "run", credential=EntraToken(lifetime_s=-60),
                               retry=RetryPolicy(attempts=2, base_s=0.01, cap_s=0.01))
    with pytest.raises(AzureAuthFailed, match="managed identity"):
        expired.get_bytes("ckpt/COMMITTED")

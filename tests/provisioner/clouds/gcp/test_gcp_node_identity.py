"""GCP nodes reach ``gs://`` storage as their service account, never with keys: a launch whose GCP
nodes would have no such identity is refused before anything starts (exit 2, naming the setting);
clouds whose nodes cannot read ``gs://`` refuse it; the emulated GCS is as strict as GCS about who
asks (:mod:`emulator.gcs_auth`); a node fetches the shipped wheel from ``gs://`` with its own
metadata-server token and checks its sha256 before installing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from emulator.base import stock_image_python
from emulator.gcp_metadata import GcpMetadataServer
from emulator.gcs_auth import GcsAuthFront
from emulator.gcs_server import GcsEmulator
from spotwise.build import BootBuild, build_wheel
from spotwise.cli import main
from spotwise.provisioner.boot.script import install_script
from spotwise.provisioner.clouds.gcp.identity import NODE_SCOPES, SCOPE_PREFIX

TASK = "name: ident\nresources:\n  accelerators: {A100: 8}\n  clouds: [%s]\ntraining:\n  steps: 10\n"
STORAGE_ONLY = (SCOPE_PREFIX + "devstorage.read_write",)
COMPUTE_ONLY = (SCOPE_PREFIX + "compute",)


def _launch(tmp_path: Path, cloud: str, *args: str) -> int | None:
    task = tmp_path / f"{cloud}.yaml"
    task.write_text(TASK % cloud)
    return main(["launch", str(task), *args, "--dry-run", "--format", "json"])


def test_a_gcp_launch_on_gs_needs_a_service_account_whose_scopes_write_storage(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPOTWISE_GCP_SERVICE_ACCOUNT", raising=False)
    monkeypatch.delenv("SPOTWISE_GCP_NODE_SCOPES", raising=False)
    assert _launch(tmp_path, "gcp", "--storage", "gs://ckpt/runs") in (0, None)   # a dry run lists it (issue 48)
    assert [n["field"] for n in json.loads(capsys.readouterr().out)["launch_needs"]] == ["SPOTWISE_GCP_SERVICE_ACCOUNT"]

    monkeypatch.setenv("SPOTWISE_GCP_SERVICE_ACCOUNT", "spotwise-node@p.iam.gserviceaccount.com")
    monkeypatch.setenv("SPOTWISE_GCP_NODE_SCOPES", "compute")          # a token that cannot write GCS
    assert _launch(tmp_path, "gcp", "--storage", "gs://ckpt/runs") == 2
    err = capsys.readouterr().err
    assert "SPOTWISE_GCP_NODE_SCOPES" in err and "devstorage.read_write" in err and "Traceback" not in err

    monkeypatch.setenv("SPOTWISE_GCP_NODE_SCOPES", "compute, not a scope")
    assert _launch(tmp_path, "gcp", "--storage", "gs://ckpt/runs") == 2
    assert "SPOTWISE_GCP_NODE_SCOPES" in capsys.readouterr().err

    monkeypatch.delenv("SPOTWISE_GCP_NODE_SCOPES")
    assert _launch(tmp_path, "gcp", "--storage", "gs://ckpt/runs") in (0, None)
    assert json.loads(capsys.readouterr().out)["chosen"]["cloud"] == "gcp"


def test_gs_storage_or_token_file_is_refused_where_nodes_cannot_read_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPOTWISE_AWS_INSTANCE_PROFILE", "spotwise-node")
    assert _launch(tmp_path, "aws", "--storage", "gs://ckpt/runs") == 2
    err = capsys.readouterr().err
    assert "--storage" in err and "aws nodes cannot reach gs://" in err and "Traceback" not in err
    task = tmp_path / "data.yaml"
    task.write_text(TASK % "aws" + "  data: {uri: gs://ckpt/tokens.bin}\n")
    assert main(["launch", str(task), "--storage", "s3://ckpt/runs", "--dry-run", "--format", "json"]) == 2
    err = capsys.readouterr().err
    assert "training.data.uri" in err and "gs://" in err and "Traceback" not in err


@pytest.fixture
def gcs():
    """The emulated GCP's storage as its nodes see it: a metadata server that issues tokens, and the
    loopback GCS behind the front that accepts only those (and the launcher's)."""
    md = GcpMetadataServer().start()
    with GcsEmulator() as g:
        g.create_bucket("ckpt")
        with GcsAuthFront(g.endpoint, md.token_scopes) as front:
            for name, scopes in (("rw", STORAGE_ONLY), ("node", NODE_SCOPES), ("cpu", COMPUTE_ONLY)):
                md.set_instance(name, instance_id=name, zone="us-central1-a", ip="127.0.0.1", attributes={},
                                scopes=scopes)
            md.set_instance("nosa", instance_id="nosa", zone="us-central1-a", ip="127.0.0.1", attributes={})
            yield md, front
    md.stop()


def _node_token(md: GcpMetadataServer, name: str) -> str | None:
    req = urllib.request.Request(f"{md.base_url(name)}/computeMetadata/v1/instance/service-accounts/default/token",
                                 headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return str(json.load(r)["access_token"])
    except urllib.error.HTTPError as e:
        assert e.code == 404                       # an instance without a service account has no token
        return None


def _put(front: GcsAuthFront, token: str | None, name: str = "x") -> int:
    req = urllib.request.Request(f"{front.endpoint}/upload/storage/v1/b/ckpt/o?uploadType=media&name={name}",
                                 data=b"x", method="POST",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_the_emulated_gcs_accepts_only_tokens_its_metadata_server_issued_with_a_storage_scope(gcs, tmp_path):
    md, front = gcs
    assert _node_token(md, "nosa") is None
    assert _put(front, None) == 401                                    # no token: anonymous
    assert _put(front, "ya29.made-up") == 401                          # a token nobody issued
    assert _put(front, _node_token(md, "cpu")) == 403                  # compute scope only
    assert _put(front, _node_token(md, "rw")) == 200
    assert _put(front, _node_token(md, "node")) == 200                 # NODE_SCOPES: storage and compute
    assert [r[0] for r in front.refused] == [401, 401, 403]

    # the launcher: its key file's JWT, signed with the key, is traded at the front for a token
    env = dict(os.environ, GOOGLE_APPLICATION_CREDENTIALS=str(front.launcher_credentials_file(tmp_path / "k.json")),
               SPOTWISE_GCS_ENDPOINT=front.endpoint)
    probe = ("from spotwise.runtime.storage.gcs import GcsStorage; s = GcsStorage('ckpt', 'p'); s.put_bytes('a', b'1'); "
             "print(s.get_bytes('a'))")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "b'1'", done.stderr[-2000:]
    assert ("launcher", "POST", "/upload/storage/v1/b/ckpt/o") in front.allowed
    forged = GcsAuthFront("http://127.0.0.1:1", md.token_scopes)      # another key: its JWT is refused
    forged.launcher_credentials_file(tmp_path / "forged.json")
    assert _trade_jwt(front, tmp_path / "forged.json") == 400
    assert _trade_jwt(front, tmp_path / "k.json") == 200


def _trade_jwt(front: GcsAuthFront, key_file: Path) -> int:
    """POST a JWT signed with ``key_file``'s key to the front's token endpoint, as google.auth does."""
    import time
    import urllib.parse

    from google.auth import crypt, jwt

    signer = crypt.RSASigner.from_service_account_file(str(key_file))
    now = int(time.time())
    assertion = jwt.encode(signer, {"iss": "x", "aud": "https://oauth2.googleapis.com/token", "iat": now,
                                    "exp": now + 600, "scope": SCOPE_PREFIX + "devstorage.read_write"})
    body = urllib.parse.urlencode({"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
                                   "assertion": assertion.decode()}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{front.endpoint}/token", data=body), timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_google_auth_on_a_node_finds_its_service_account_through_the_metadata_server(gcs):
    md, front = gcs
    probe = ("from spotwise.runtime.storage.gcs import GcsStorage; s = GcsStorage('ckpt', 'runs'); "
             "s.put_bytes('k', b'v'); print(s.list(''))")
    for name, ok in (("node", True), ("cpu", False)):
        host = md.base_url(name).split("://", 1)[1]
        env = {k: v for k, v in os.environ.items() if k not in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST")}
        env.update(GCE_METADATA_HOST=host, GCE_METADATA_IP=host, SPOTWISE_GCS_ENDPOINT=front.endpoint,
                   GCE_METADATA_TIMEOUT="30",       # google.auth's 3 s "on GCE?" ping, on a loaded machine
                   HOME="/nonexistent")           # no gcloud ADC of this machine's user
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
        assert (done.returncode == 0) is ok, done.stderr[-2000:]
        if ok:
            assert done.stdout.strip() == "['k']"
    assert ("node:emu-node-compute", "POST", "/upload/storage/v1/b/ckpt/o") in front.allowed


def test_google_auth_refreshes_again_by_the_accounts_email_as_on_gce(gcs):
    """After its first refresh google.auth knows the account's email and asks for it by email; GCE
    serves every account under its email as under ``default`` (CI saw a 404 here when the emulated
    metadata server served only ``default``)."""
    md, _ = gcs
    host = md.base_url("node").split("://", 1)[1]
    probe = ("from google.auth import compute_engine; from google.auth.transport.requests import Request; "
             "c = compute_engine.Credentials(); r = Request(); c.refresh(r); c.refresh(r); "
             "print(c.service_account_email, c.token)")
    env = {k: v for k, v in os.environ.items() if k != "GOOGLE_APPLICATION_CREDENTIALS"}
    env.update(GCE_METADATA_HOST=host, GCE_METADATA_IP=host, GCE_METADATA_TIMEOUT="30", HOME="/nonexistent")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["node@proj.iam.gserviceaccount.com", "emu-node-compute"]
    assert ("node", "service-accounts/node@proj.iam.gserviceaccount.com/") in md.requests


def _install_from_gs(tmp_path: Path, md: GcpMetadataServer, front: GcsAuthFront, node: str,
                     build: BootBuild) -> subprocess.CompletedProcess:
    """The install step of a GCP node's boot script, as node ``node`` of the emulated stock image runs it."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "install.sh"
    script.write_text(f'set -euo pipefail\nVENV={tmp_path}/venv\nSTATE_DIR={tmp_path}/state\n'
                      f'METADATA_URL={md.base_url(node)}\nmkdir -p "$STATE_DIR"\n{install_script(build, "gcp")}\n')
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(SPOTWISE_PYTHON=str(stock_image_python()), SPOTWISE_GCS_ENDPOINT=front.endpoint)
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)


def test_a_node_fetches_the_shipped_wheel_from_gs_with_its_own_token_and_checks_its_sha256(gcs, tmp_path):
    md, front = gcs
    w = build_wheel(tmp_path / "dist")
    key = f"runs/_builds/{w.sha256}/{w.name}"                    # the name holds a '+': quoted on the wire
    token = _node_token(md, "rw")
    req = urllib.request.Request(f"{front.endpoint}/upload/storage/v1/b/ckpt/o?uploadType=media&name="
                                 + urllib.request.quote(key, safe=""), data=w.path.read_bytes(), method="POST",
                                 headers={"Authorization": f"Bearer {token}"})
    urllib.request.urlopen(req, timeout=10).close()
    build = BootBuild(build_id=w.build_id, name=w.name, sha256=w.sha256, url=f"gs://ckpt/{key}")

    denied = _install_from_gs(tmp_path / "cpu", md, front, "cpu", build)     # no storage scope: no wheel
    assert denied.returncode != 0 and not (tmp_path / "cpu" / "venv").exists()
    tampered = BootBuild(build_id=w.build_id, name=w.name, sha256="0" * 64, url=build.url)
    bad = _install_from_gs(tmp_path / "bad", md, front, "node", tampered)
    assert bad.returncode != 0 and "refusing the shipped build" in bad.stderr
    assert not (tmp_path / "bad" / "venv").exists()

    done = _install_from_gs(tmp_path / "ok", md, front, "node", build)
    assert done.returncode == 0, done.stderr
    assert f"spotwise build {w.build_id} installed from {w.name} sha256 {w.sha256}" in done.stdout
    gets = [p for who, m, p in front.allowed if who == "node:emu-node-compute" and m == "GET"]
    assert gets and all("_builds" in p for p in gets)

"""Azure nodes reach ``az://`` storage as their managed identity, never with keys: a launch whose
Azure nodes would carry no identity is refused before anything starts (exit 2, naming the setting);
clouds whose nodes cannot reach ``az://`` refuse it; a node's boot script hands its processes the
identity (and the watcher the run's ``az://`` storage, for the Preempt acknowledgement); on a node,
the store takes tokens from IMDS only for a VM that carries the identity, and Azurite (OAuth over
HTTPS) accepts them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotwise.cli import main
from spotwise.provisioner.clouds.azure.cloud import AzureCloud
from spotwise.provisioner.base import LaunchRequest
from spotwise.provisioner.boot.script import install_script
from spotwise.build import BootBuild

from helpers import offer

TASK = "name: ident\nresources:\n  accelerators: {A100: 8}\n  clouds: [%s]\ntraining:\n  steps: 10\n"
IDENT = "/subscriptions/sub-1/resourceGroups/rg-1/providers/Microsoft.ManagedIdentity/userAssignedIdentities/sw"


def _launch(tmp_path: Path, cloud: str, *args: str) -> int | None:
    task = tmp_path / f"{cloud}.yaml"
    task.write_text(TASK % cloud)
    return main(["launch", str(task), *args, "--dry-run", "--format", "json"])


def test_an_azure_launch_on_az_needs_a_node_identity(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPOTWISE_AZURE_NODE_IDENTITY", raising=False)
    assert _launch(tmp_path, "azure", "--storage", "az://acct/ckpt/runs") in (0, None)   # a dry run lists it
    [need] = json.loads(capsys.readouterr().out)["launch_needs"]
    assert need["field"] == "SPOTWISE_AZURE_NODE_IDENTITY" and "Storage Blob Data Contributor" in need["allowed"]

    monkeypatch.setenv("SPOTWISE_AZURE_NODE_IDENTITY", "spotwise-node")       # a name, not a resource id
    assert _launch(tmp_path, "azure", "--storage", "az://acct/ckpt/runs") == 2
    err = capsys.readouterr().err
    assert "SPOTWISE_AZURE_NODE_IDENTITY" in err and "userAssignedIdentities" in err and "Traceback" not in err

    monkeypatch.setenv("SPOTWISE_AZURE_NODE_IDENTITY", IDENT)
    assert _launch(tmp_path, "azure", "--storage", "az://acct/My_Container/runs") == 2      # Azure's name rules
    assert "valid container name" in capsys.readouterr().err
    assert _launch(tmp_path, "azure", "--storage", "az://acct/ckpt/runs") in (0, None)
    assert json.loads(capsys.readouterr().out)["chosen"]["cloud"] == "azure"


def test_az_storage_is_refused_where_nodes_cannot_reach_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPOTWISE_AWS_INSTANCE_PROFILE", "spotwise-node")
    monkeypatch.setenv("SPOTWISE_AZURE_NODE_IDENTITY", IDENT)
    for cloud in ("aws", "gcp"):
        assert _launch(tmp_path, cloud, "--storage", "az://acct/ckpt/runs") == 2
        err = capsys.readouterr().err
        assert "--storage" in err and f"{cloud} nodes cannot reach az://" in err and "Traceback" not in err


def test_an_azure_boot_script_on_az_hands_its_processes_the_identity_and_no_key(monkeypatch):
    monkeypatch.setenv("SPOTWISE_AZURE_NODE_IDENTITY", IDENT)
    monkeypatch.setenv("SPOTWISE_AZURE_SUBSCRIPTION_ID", "sub-1")
    cloud = AzureCloud(run_storage="az://acct/ckpt/runs")
    req = LaunchRequest(cluster_id="c-az", job_id="job-1", offer=offer("azure", "Standard_ND96asr_v4", "eastus", usd=3.5),
                        count=1, role="worker", head_address="10.0.0.4:6379")
    script = cloud.boot_script(req)
    assert f"export SPOTWISE_AZURE_STORAGE_IDENTITY={IDENT}" in script
    # exported before the install and before Ray and the watcher start
    assert script.index("SPOTWISE_AZURE_STORAGE_IDENTITY") < script.index("# 2. runtime")
    assert "--ack-after-checkpoint az://acct/ckpt/runs/job-1" in script and "--self-end azure" in script
    assert "AccountKey" not in script and "AZURE_STORAGE_KEY" not in script and "sig=" not in script
    # without an identity (s3:// storage with the image's keys) nothing is exported
    monkeypatch.delenv("SPOTWISE_AZURE_NODE_IDENTITY")
    assert "SPOTWISE_AZURE_STORAGE_IDENTITY" not in AzureCloud(run_storage="s3://b/runs").boot_script(req)


def test_an_az_wheel_is_fetched_with_the_nodes_imds_token_not_a_sas():
    b = BootBuild(build_id="0" * 16, name="spotwise-0.1.0-py3-none-any.whl", sha256="1" * 64,
                  url="az://acct/ckpt/runs/_builds/x/spotwise-0.1.0-py3-none-any.whl")
    text = install_script(b, "azure")
    assert "/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https%3A%2F%2Fstorage.azure.com%2F" in text
    assert 'AZ_EP=https://acct.blob.core.windows.net' in text and "x-ms-version: " in text
    assert "/ckpt/runs/_builds/x/spotwise-0.1.0-py3-none-any.whl" in text and "sig=" not in text
    assert '"$WHEEL[azure]"' in text


@pytest.fixture(scope="module")
def azurite_oauth():
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from emulator.azurite_server import Azurite, azurite_bin

    if azurite_bin() is None:
        pytest.skip("azurite is not installed (scripts/install.sh --test installs it)")
    a = Azurite(https=True)
    yield a
    a.close()


def test_a_node_writes_az_storage_only_as_the_identity_its_vm_carries(azurite_oauth, tmp_path):
    """The node-side store on an emulated Azure VM: no key anywhere in its environment, tokens from
    its own IMDS. A VM that carries the identity writes; one without an identity (or carrying
    another) cannot, and says which role/identity is missing."""
    from emulator.azure_imds import AzureImds

    container = azurite_oauth.create_container("nodeident")
    imds = AzureImds().start()
    try:
        imds.set_vm("withid", private_ip="127.0.0.9", tags={}, identity=IDENT)
        imds.set_vm("noid", private_ip="127.0.0.10", tags={}, identity=False)
        imds.set_vm("other", private_ip="127.0.0.11", tags={}, identity=IDENT + "-other")
        probe = ("from spotwise.runtime.storage.azblob import AzureBlobStorage; "
                 "from spotwise.runtime.storage.retry import RetryPolicy; "
                 f"s = AzureBlobStorage('devstoreaccount1', {container!r}, 'runs', "
                 "retry=RetryPolicy(attempts=1, base_s=0.01, cap_s=0.01)); "
                 "s.put_bytes('ckpt/COMMITTED', b'ok'); print(s.list('ckpt/'))")
        results = {}
        for vm in ("withid", "noid", "other"):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "AWS_"))}
            env.update(AZURE_POD_IDENTITY_AUTHORITY_HOST=imds.base_url(vm), REQUESTS_CA_BUNDLE=azurite_oauth.ca,
                       SPOTWISE_AZURE_BLOB_ENDPOINT=f"{azurite_oauth.endpoint}/{{account}}",
                       SPOTWISE_AZURE_STORAGE_IDENTITY=IDENT,
                       # a key in the node's environment (an image's storage.env) is never used
                       AZURE_STORAGE_KEY="Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
                                         "KBHBeksoGMGw==", AZURE_STORAGE_ACCOUNT="devstoreaccount1",
                       HOME=str(tmp_path))
            results[vm] = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                                         timeout=120)
    finally:
        imds.stop()
    ok = results["withid"]
    assert ok.returncode == 0 and ok.stdout.strip() == "['ckpt/COMMITTED']", ok.stderr[-2000:]
    for vm in ("noid", "other"):
        r = results[vm]
        assert r.returncode != 0 and "managed identity" in r.stderr, (vm, r.stderr[-2000:])


def _install_from_az(tmp_path: Path, imds, azurite, node: str, build: BootBuild) -> subprocess.CompletedProcess:
    """The install step of an Azure node's boot script, as VM ``node`` of the emulated stock image runs it."""
    from emulator.base import stock_image_python

    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "install.sh"
    script.write_text(f'set -euo pipefail\nVENV={tmp_path}/venv\nSTATE_DIR={tmp_path}/state\n'
                      f'METADATA_URL={imds.base_url(node)}\nmkdir -p "$STATE_DIR"\n'
                      f'export SPOTWISE_AZURE_STORAGE_IDENTITY={IDENT}\n{install_script(build, "azure")}\n')
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("AZURE_")}
    env.update(SPOTWISE_PYTHON=str(stock_image_python()), CURL_CA_BUNDLE=azurite.ca,
               SPOTWISE_AZURE_BLOB_ENDPOINT=f"{azurite.endpoint}/{{account}}")
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)


def test_a_node_fetches_the_shipped_wheel_from_az_with_its_own_token_and_checks_its_sha256(azurite_oauth, tmp_path):
    from emulator.azure_imds import AzureImds
    from spotwise.build import build_wheel

    w = build_wheel(tmp_path / "dist")
    container = azurite_oauth.create_container("wheels")
    key = f"runs/_builds/{w.sha256}/{w.name}"                    # the name holds a '+': quoted on the wire
    azurite_oauth.service().get_blob_client(container, key).upload_blob(w.path.read_bytes())
    build = BootBuild(build_id=w.build_id, name=w.name, sha256=w.sha256, url=f"az://devstoreaccount1/{container}/{key}")
    imds = AzureImds().start()
    try:
        imds.set_vm("withid", private_ip="127.0.0.9", tags={}, identity=IDENT)
        imds.set_vm("noid", private_ip="127.0.0.10", tags={}, identity=False)
        denied = _install_from_az(tmp_path / "noid", imds, azurite_oauth, "noid", build)
        tampered = BootBuild(build_id=w.build_id, name=w.name, sha256="0" * 64, url=build.url)
        bad = _install_from_az(tmp_path / "bad", imds, azurite_oauth, "withid", tampered)
        ok = _install_from_az(tmp_path / "ok", imds, azurite_oauth, "withid", build)
    finally:
        imds.stop()
    assert denied.returncode != 0 and "no managed-identity token" in denied.stderr
    assert not (tmp_path / "noid" / "venv").exists()
    assert bad.returncode != 0 and "refusing the shipped build" in bad.stderr and not (tmp_path / "bad" / "venv").exists()
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-3000:]
    assert f"spotwise build {w.build_id} installed from {w.name} sha256 {w.sha256}" in ok.stdout

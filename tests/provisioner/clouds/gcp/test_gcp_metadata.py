"""The emulated GCP metadata server speaks GCP's protocol, and the node's GCP poller and boot
script work against it (the same code that runs on a VM against metadata.google.internal)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from emulator.gcp_metadata import GcpMetadataServer  # noqa: E402
from spotwise.provisioner.boot.script import BootstrapSpec, render_script  # noqa: E402
from spotwise.runtime.node.notices import GcpMetadata  # noqa: E402


@pytest.fixture
def md():
    server = GcpMetadataServer().start()
    server.set_instance("sw-c-w-1", instance_id="4242", zone="us-central1-b", ip="127.17.0.9",
                        attributes={"spotwise-head": "127.17.0.2:6379"})
    try:
        yield server
    finally:
        server.stop()


def _get(url: str, flavor: bool = True) -> tuple[int, str, dict]:
    req = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"} if flavor else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def test_paths_and_the_required_header(md):
    base = md.base_url("sw-c-w-1") + "/computeMetadata/v1/instance/"
    assert _get(base + "name")[1] == "sw-c-w-1"
    assert _get(base + "id")[1] == "4242"
    assert _get(base + "network-interfaces/0/ip")[1] == "127.17.0.9"
    assert _get(base + "attributes/spotwise-head")[1] == "127.17.0.2:6379"
    status, body, headers = _get(base + "preempted")
    assert (status, body, headers["Metadata-Flavor"]) == (200, "FALSE", "Google") and headers["ETag"]
    assert _get(base + "name", flavor=False)[0] == 403 and md.refused == 1
    assert _get(base + "attributes/nope")[0] == 404
    assert _get(md.base_url("other") + "/computeMetadata/v1/instance/name")[0] == 404


def test_wait_for_change_answers_when_preempted(md):
    url = md.base_url("sw-c-w-1") + "/computeMetadata/v1/instance/preempted?wait_for_change=true&timeout_sec=60"
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(r=_get(url)))
    t.start()
    while ("sw-c-w-1", "preempted") not in md.requests:    # the request is being held
        t.join(0.05)
    md.preempt("sw-c-w-1")
    t.join()
    assert box["r"][:2] == (200, "TRUE")


def test_wait_for_change_times_out_with_the_current_value(md):
    url = md.base_url("sw-c-w-1") + "/computeMetadata/v1/instance/preempted?wait_for_change=true&timeout_sec=0"
    assert _get(url)[:2] == (200, "FALSE")


def test_poller_deadline_is_the_configured_window(md, monkeypatch):
    monkeypatch.setenv("SPOTWISE_GCP_NOTICE_S", "12")
    import time

    p = GcpMetadata(md.base_url("sw-c-w-1"), wait_timeout_s=0)
    assert p.poll() is None
    md.preempt("sw-c-w-1")
    before = time.time()
    n = p.poll()
    # int() truncates the deadline to the millisecond below
    assert n.cloud == "gcp" and before * 1000 + 12_000 - 1 <= n.deadline_ms <= time.time() * 1000 + 12_000


@pytest.mark.parametrize("bad", ["0", "abc", "31"])
def test_bad_notice_window_names_the_variable(monkeypatch, bad):
    monkeypatch.setenv("SPOTWISE_GCP_NOTICE_S", bad)
    with pytest.raises(ValueError, match="SPOTWISE_GCP_NOTICE_S"):
        GcpMetadata("http://127.0.0.1:9")


def test_worker_boot_script_reads_identity_and_head_from_metadata(md, tmp_path):
    """The GCP script, rendered without a head address, asks the metadata server for it (up to
    Ray's start, replaced here by a stub venv that records its arguments)."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    for tool in ("python", "ray"):
        (venv / tool).write_text(f'#!/bin/bash\necho "{tool} $*" >> "{tmp_path}/calls"\n')
        (venv / tool).chmod(0o755)
    head = socket.socket()                   # the head's GCS port listens: the worker starts Ray at once
    head.bind(("127.17.0.2", 0))
    head.listen()
    addr = f"127.17.0.2:{head.getsockname()[1]}"
    md.set_instance("sw-c-w-1", instance_id="4242", zone="us-central1-b", ip="127.17.0.9",
                    attributes={"spotwise-head": addr})
    script = render_script(BootstrapSpec(cloud="gcp", cluster_id="c", job_id="j", role="worker",
                                         region="us-central1", zone="us-central1-b", market="spot",
                                         instance_type="a2-highgpu-8g"))
    (tmp_path / "startup-script").write_text(script)
    env = dict(os.environ, SPOTWISE_STATE_DIR=str(tmp_path / "state"), SPOTWISE_ETC_DIR=str(tmp_path / "etc"),
               SPOTWISE_VENV=str(tmp_path / "venv"), SPOTWISE_METADATA_URL=md.base_url("sw-c-w-1"),
               SPOTWISE_GPU_WAIT_S="0")                 # no driver will come on this machine
    with head:
        subprocess.run(["bash", str(tmp_path / "startup-script")], env=env, check=True, timeout=60)
        calls = ""
        for _ in range(600):      # ray and the watcher start in the background (nohup ... &)
            calls = (tmp_path / "calls").read_text() if (tmp_path / "calls").exists() else ""
            if "-m ray.scripts.scripts start" in calls and "spotwise.runtime.node.watch" in calls:
                break
            threading.Event().wait(0.05)
    assert f'--address={addr}' in calls and "--node-ip-address=127.17.0.9" in calls
    assert "--instance-id sw-c-w-1" in calls and "--cloud gcp" in calls
    assert (tmp_path / "state" / "head_address").read_text().strip() == addr

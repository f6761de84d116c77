"""The launcher reaches an emulated GCP head through ssh, as from a laptop (issue 48 item 3): the
head gets an external address (loopback here), the emulator runs a real sshd there, port 22, whose
authorized keys the head's real startup-script fills with the cluster's key, and spotwise's own
endpoint code forwards the dashboard port through it to the head's private address.

What this does not show (not built): that the launcher could *not* reach the private address
directly. The emulated nodes' private addresses are loopback addresses of this machine, reachable
by anyone here; the per-region network namespaces that would make them unreachable are missing.
The dashboard is a stand-in HTTP server on the head's private address (no node build is shipped,
so the boot ends after authorizing the key, before Ray), which keeps this test fast."""

from __future__ import annotations

import http.server
import threading
import urllib.request

import pytest

import sshd as test_sshd
from emulator.gcp import EmulatedGcp
from helpers import offer
from spotwise.provisioner import head_path as hp
from spotwise.provisioner.base import LaunchRequest
from spotwise.utils.net import service_port


@pytest.fixture
def dashboard_port(monkeypatch):
    port = service_port()
    monkeypatch.setenv("SPOTWISE_RAY_DASHBOARD_PORT", str(port))
    return port


def test_the_launcher_reaches_an_emulated_gcp_head_only_through_its_sshd(tmp_path, monkeypatch, dashboard_port):
    why = test_sshd.missing()
    if why:
        pytest.skip(why)
    from google.auth.credentials import AnonymousCredentials

    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    with EmulatedGcp(tmp_path / "gcp", head_path="ssh") as emu:
        for k, v in emu.env().items():
            if k != "SPOTWISE_RAY_DASHBOARD_PORT":
                monkeypatch.setenv(k, v)
        cloud = GcpCloud(project=emu.project, credentials=AnonymousCredentials(), endpoint=emu.fake.endpoint)
        cloud.prepare_cluster("c1", "j1", "us-central1")
        [head] = cloud.launch(LaunchRequest(cluster_id="c1", job_id="j1", role="head",
                                            offer=offer("gcp", "n2-standard-2", "us-central1", "us-central1-a",
                                                        market="on-demand")))
        assert head.extra["public_address"].startswith("127.19.") and head.address.startswith("127.17.")

        class Dashboard(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = f"dashboard of {head.instance_id}".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer((head.address, dashboard_port), Dashboard)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            ep = cloud.endpoint("c1", head)        # waits for the head's sshd and its key, as for a booting head
            assert ep.dashboard_url.startswith("http://127.0.0.1:") and ep.control_listen.startswith(head.address)
            with urllib.request.urlopen(ep.dashboard_url, timeout=10) as r:
                assert r.read().decode() == f"dashboard of {head.instance_id}"
            keys = emu.sshds[head.instance_id].root / "authorized_keys"    # type: ignore[attr-defined]
            assert keys.read_text() == hp.authorized_key_line("c1") + "\n"   # written by the real script
        finally:
            server.shutdown()
            server.server_close()
        cloud.terminate([head])
        gone = cloud.cleanup_cluster("c1")
        assert any(g.startswith("ssh tunnel to ") for g in gone) and not hp.key_path("c1").exists()

"""The emulated regions' network namespaces (:mod:`emulator.netns`, issue 48 item 3): a node inside
reaches the emulator's endpoints at the URLs it was handed and its region's other nodes; the launcher
(this process, the root namespace) reaches a head's public address (a real sshd there) and no node's
private address; another region reaches nothing of this one's; nothing is left after."""

from __future__ import annotations

import http.server
import ipaddress
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import sshd as test_sshd
from emulator import netns


@pytest.fixture(scope="module", autouse=True)
def _needs_netns():
    why = netns.missing()
    if why:
        pytest.skip(why)


class Endpoint:
    """An HTTP server on ``127.0.0.1`` of the root namespace (an emulator's metadata server)."""

    def __init__(self) -> None:
        class Answer(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = b"endpoint " + self.path.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


INSIDE = """
import socket, sys, urllib.request
url, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
print(urllib.request.urlopen(url, timeout=10).read().decode())
try:
    socket.create_connection((host, port), timeout=3).close()
    print("connected")
except OSError as e:
    print("failed", type(e).__name__)
"""


def inside(nets: netns.RegionNets, region: str, url: str, host: str, port: int) -> list[str]:
    out = subprocess.run([*nets.enter(region), sys.executable, "-c", INSIDE, url, host, str(port)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_a_node_reaches_the_endpoints_and_its_region_the_launcher_only_the_heads_sshd(tmp_path):
    endpoint = Endpoint()
    try:
        with netns.RegionNets() as nets:
            nets.forward(endpoint.port)
            block = nets.block
            assert block is not None and block.subnet_of(netns.BLOCKS)
            private = [str(h) for h in list(ipaddress.ip_network(nets.private_range).hosts())[1:3]]
            public = str(next(ipaddress.ip_network(nets.public_range).hosts()))
            nets.add_node("r1", private[0], public)            # the head: a private and a public address
            nets.add_node("r1", private[1])                    # a worker: a private one only
            nets.add_node("r2", str(block.network_address + 1000))
            # a node's server on the head's private address (its Ray, say), made inside r1
            server = netns.listen_inside(nets.regions["r1"].ns, private[0], 0)
            port = server.getsockname()[1]
            sshd = None
            why = test_sshd.missing()
            if why is None:
                sshd = test_sshd.TestSshd(tmp_path / "sshd", port=22, listen=public, authorize_client=False,
                                          wrap=tuple(nets.enter("r1"))).start()
            try:
                url = f"http://127.0.0.1:{endpoint.port}/computeMetadata/v1/instance/id"
                # a node of r1: the endpoint at the URL it was handed; the head's server at its private address
                assert inside(nets, "r1", url, private[0], port) == ["endpoint /computeMetadata/v1/instance/id",
                                                                    "connected"]
                # a node of another region: the endpoint, and no way to r1's private address
                assert inside(nets, "r2", url, private[0], port) == ["endpoint /computeMetadata/v1/instance/id",
                                                                    "failed OSError"]
                # the launcher: no connection to the private address (no route: EHOSTUNREACH, not a
                # refusal from something answering there), and the head's sshd at its public address
                with pytest.raises(OSError) as direct:
                    socket.create_connection((private[0], port), timeout=3)
                assert not isinstance(direct.value, ConnectionRefusedError), direct.value
                # the same, as the e2e and the bench try it while a run goes on
                probe = netns.DirectProbe(nets, port)
                probe({"head": ("r1", private[0]), "not-yet": ("r3", private[1])})
                assert probe.tried["head"][0] == "connected" and probe.unreachable is True, probe.tried
                assert "not-yet" not in probe.tried            # a region not made yet is not tried
                if sshd is not None:
                    with socket.create_connection((public, 22), timeout=10) as s:
                        assert s.recv(64).startswith(b"SSH-2.0-OpenSSH")
            finally:
                server.close()
                if sshd is not None:
                    sshd.stop()
            # two at once (pytest-xdist) never share a block
            with netns.RegionNets() as other, netns.RegionNets(units=4) as wide:
                assert other.block != block and other.tag != nets.tag
                assert wide.block is not None and wide.block.prefixlen == 20
                assert not wide.block.overlaps(block) and not wide.block.overlaps(other.block)
                assert ipaddress.ip_network(wide.network(2)).subnet_of(wide.block)      # an emulated AWS's VPCs
            names = [r.ns for r in nets.regions.values()]
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not any(n in listed.split() for n in names), listed
        routes = subprocess.run(["ip", "route", "show", "root", str(block)], capture_output=True, text=True).stdout
        assert routes.strip() == "", routes
        assert Path(netns.NETNS_DIR).is_dir()
    finally:
        endpoint.close()

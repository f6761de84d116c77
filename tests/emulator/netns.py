"""One network namespace per emulated region, so the launcher cannot reach a node's private address
(test and bench support, never product code; issue 48 item 3).

On a real cloud a laptop's ``spotwise launch`` reaches no node's private address: only a head's
public address, port 22. The emulated nodes are processes of this machine, so without a separation
every private address would be reachable from the tests. :class:`RegionNets` gives each emulated
region a namespace of its own (``ip netns add``) and the nodes of that region run inside it (their
commands are prefixed with :meth:`RegionNets.enter`):

* **addresses**: each :class:`RegionNets` holds one ``/22`` of ``198.18.0.0/15`` (RFC 2544's
  benchmarking range: no real network uses it), taken under a lock file so that two tests at once
  (pytest-xdist, or another checkout's) never share one. Its first ``/24`` holds the veth links (a
  ``/30`` per region: ``.4i+1`` the root end, where the launcher's connections come from, and
  ``.4i+2`` the region's end), its second the public addresses (:attr:`public_range`), the last
  ``/23`` the private ones (:attr:`private_range`). One that needs networks of its own (the
  emulated AWS: a VPC per region) holds several consecutive ``/22`` (``units``), each further one a
  network (:meth:`RegionNets.network`). A node's private address is a ``/32`` on its
  region's loopback; a head's public address a ``/32`` on its region's end of the link, with a
  route to it in the root namespace.
* **the launcher's side** (the root namespace) gets an ``unreachable`` route for the whole block
  besides those: a connection to a private address fails at once (``EHOSTUNREACH``) and no packet
  for the block ever leaves this machine. Only the links' ``/30`` and the heads' public ``/32``
  routes lead into a namespace.
* **the region's side** has a route to the launcher's link address only (no default route): the
  nodes of one region reach each other (one loopback, as one VPC's subnets route to each other)
  and nothing of another region's.
* **the emulator's endpoints** (metadata server, storage, the cloud API the nodes call) listen on
  ``127.0.0.1`` of the root namespace; :meth:`RegionNets.forward` makes each one answer on the
  same ``127.0.0.1:PORT`` inside every region (a listening socket made inside the namespace by a
  thread that entered it, relaying to the root's), so every URL a node is handed stays as it is.

Cleanup: :meth:`RegionNets.stop` (and an ``atexit`` hook for a run that never called it) deletes
the namespaces and the routes and releases the block; a block whose last holder died without
cleaning up is swept by the next one that takes it. Everything needs root (``CAP_NET_ADMIN``):
:func:`missing` says why it cannot run here.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import ipaddress
import os
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")

BLOCKS = ipaddress.ip_network("198.18.0.0/15")
BLOCK_PREFIX = 22
LOCK_DIR = Path("/run/spotwise-netns")
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def missing() -> str | None:
    """Why namespaces cannot be made here (None: they can): ``ip netns add`` of a probe namespace."""
    if os.geteuid() != 0:
        return "network namespaces per emulated region need root (ip netns add); not root here"
    name = f"swprobe{os.getpid()}"
    try:
        made = _ip("netns", "add", name, check=False)
    except FileNotFoundError:
        return "iproute2's ip is not installed"
    if made.returncode != 0:
        return f"ip netns add is not permitted here: {made.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


def _setns(path: str) -> None:
    """The calling thread enters the network namespace at ``path``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def inside(ns: str, fn: Callable[[], T]) -> T:
    """``fn()`` run by a thread that entered namespace ``ns`` (the sockets it makes are there, and
    stay there after the thread is gone); its result, or its exception raised here."""
    out: list = []

    def run() -> None:
        try:
            _setns(str(NETNS_DIR / ns))
            out.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out.append((False, e))

    t = threading.Thread(target=run, name=f"netns-{ns}")
    t.start()
    t.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value


def listen_inside(ns: str, host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` inside namespace ``ns``."""
    def make() -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(64)
        return s

    return inside(ns, make)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _relay(listener: socket.socket, port: int) -> None:
    """Accept inside the namespace, connect to ``127.0.0.1:port`` of the root one, copy both ways."""
    while True:
        try:
            inner, _ = listener.accept()
        except OSError:
            return                          # closed: the namespace is going
        try:
            outer = socket.create_connection(("127.0.0.1", port), timeout=10)
            outer.settimeout(None)
        except OSError:
            inner.close()
            continue
        for a, b in ((inner, outer), (outer, inner)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


@dataclass
class Region:
    name: str                     # the cloud's region
    ns: str                       # its namespace
    veth: str                     # the root end's name
    root_ip: str                  # the root end's address (the launcher's, as the region sees it)
    ns_ip: str                    # the region's end of the link
    listeners: list[socket.socket] = field(default_factory=list)


class RegionNets:
    """The namespaces of one emulated cloud's regions (see the module's docstring). ``units``: how
    many ``/22`` it holds (a power of two; consecutive, aligned): the first is laid out as the
    module says, each further one is a private network of its own (:meth:`network`: the emulated
    AWS's VPCs, one per region)."""

    def __init__(self, units: int = 1) -> None:
        if units < 1 or units & (units - 1):
            raise ValueError(f"units: a power of two, not {units}")
        self.units = units
        self.block: ipaddress.IPv4Network | None = None
        self.regions: dict[str, Region] = {}
        self.ports: list[int] = []
        self._public: dict[str, str] = {}       # public address -> region
        self._lock = threading.RLock()
        self._lockfiles: list[int] = []
        self._tags: list[str] = []

    # -- the block ----------------------------------------------------------------------------
    def start(self) -> "RegionNets":
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        unit_blocks = list(BLOCKS.subnets(new_prefix=BLOCK_PREFIX))
        for k in range(0, len(unit_blocks), self.units):
            held = []
            for u in range(k, k + self.units):
                fd = os.open(LOCK_DIR / f"block-{u}.lock", os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    break
                held.append(fd)
            if len(held) < self.units:
                for fd in held:
                    os.close(fd)            # closing the only descriptor releases its lock
                continue
            self._lockfiles, self._tags = held, [f"sw{u}" for u in range(k, k + self.units)]
            self.tag = self._tags[0]
            self.block = unit_blocks[k].supernet(new_prefix=BLOCK_PREFIX - self.units.bit_length() + 1)
            self._sweep()
            _ip("route", "add", "unreachable", str(self.block))
            atexit.register(self.stop)
            return self
        raise RuntimeError(f"no {self.units} free /{BLOCK_PREFIX} of {BLOCKS} (held by other runs: {LOCK_DIR})")

    def _sweep(self) -> None:
        """What dead holders of this block's units left: namespaces (their veths go with them),
        veths whose namespace outlived its name, routes."""
        owned = tuple(f"{t}r" for t in self._tags)
        for line in _ip("netns", "list").stdout.splitlines():
            ns = line.split()[0] if line.split() else ""
            if ns.startswith(owned):
                _ip("netns", "del", ns, check=False)
        veths = tuple(f"{t}v" for t in self._tags)
        for line in _ip("-o", "link", "show").stdout.splitlines():
            dev = line.split(":")[1].strip().split("@")[0] if line.count(":") > 1 else ""
            if dev.startswith(veths):
                _ip("link", "del", dev, check=False)
        _ip("route", "flush", "root", str(self.block), check=False)

    def network(self, j: int) -> str:
        """The ``j``-th private network of its own (a ``/22``: the ``j+1``-th unit of the block)."""
        if not 0 <= j < self.units - 1:
            raise ValueError(f"network {j}: this block holds {self.units - 1}")
        return f"{self._at(1024 * (j + 1))}/{BLOCK_PREFIX}"

    def _at(self, offset: int) -> str:
        assert self.block is not None
        return str(self.block.network_address + offset)

    @property
    def launcher_cidr(self) -> str:
        """Where the launcher's connections to a region come from: the root ends of the links."""
        return f"{self._at(0)}/24"

    @property
    def public_range(self) -> str:
        return f"{self._at(256)}/24"

    @property
    def private_range(self) -> str:
        return f"{self._at(512)}/23"

    # -- regions --------------------------------------------------------------------------------
    def region(self, name: str) -> Region:
        """Region ``name``'s namespace, made on first use, with every endpoint forwarded into it."""
        with self._lock:
            if name in self.regions:
                return self.regions[name]
            i = len(self.regions)
            if i >= 64:
                raise RuntimeError("at most 64 emulated regions per block")
            r = Region(name, f"{self.tag}r{i}", f"{self.tag}v{i}", self._at(4 * i + 1), self._at(4 * i + 2))
            self.regions[name] = r
            _ip("netns", "add", r.ns)
            _ip("-n", r.ns, "link", "set", "lo", "up")
            _ip("link", "add", r.veth, "type", "veth", "peer", "name", "eth0", "netns", r.ns)
            _ip("addr", "add", f"{r.root_ip}/30", "dev", r.veth)
            _ip("link", "set", r.veth, "up")
            _ip("-n", r.ns, "addr", "add", f"{r.ns_ip}/30", "dev", "eth0")
            _ip("-n", r.ns, "link", "set", "eth0", "up")
            for port in self.ports:
                self._forward_into(r, port)
            return r

    def forward(self, port: int) -> None:
        """``127.0.0.1:port`` of the root namespace answers on ``127.0.0.1:port`` in every region."""
        with self._lock:
            if port in self.ports:
                return
            self.ports.append(port)
            for r in self.regions.values():
                self._forward_into(r, port)

    def _forward_into(self, r: Region, port: int) -> None:
        listener = listen_inside(r.ns, "127.0.0.1", port)
        r.listeners.append(listener)
        threading.Thread(target=_relay, args=(listener, port), daemon=True, name=f"relay-{r.ns}-{port}").start()

    def enter(self, region: str) -> list[str]:
        """The command prefix that runs a command inside ``region``'s namespace."""
        return ["nsenter", f"--net={NETNS_DIR / self.region(region).ns}", "--"]

    def add_node(self, region: str, private_ip: str, public_ip: str | None = None) -> None:
        """A node's private address on its region's loopback; a head's public address on the
        region's end of the link, routed to from the launcher's side."""
        r = self.region(region)
        _ip("-n", r.ns, "addr", "replace", f"{private_ip}/32", "dev", "lo")
        if public_ip:
            _ip("-n", r.ns, "addr", "replace", f"{public_ip}/32", "dev", "eth0")
            _ip("route", "replace", f"{public_ip}/32", "via", r.ns_ip, "dev", r.veth)
            with self._lock:
                self._public[public_ip] = region

    def remove_node(self, region: str, private_ip: str, public_ip: str | None = None) -> None:
        r = self.regions.get(region)
        if r is None:
            return
        _ip("-n", r.ns, "addr", "del", f"{private_ip}/32", "dev", "lo", check=False)
        if public_ip:
            _ip("route", "del", f"{public_ip}/32", check=False)
            _ip("-n", r.ns, "addr", "del", f"{public_ip}/32", "dev", "eth0", check=False)
            with self._lock:
                self._public.pop(public_ip, None)

    def stop(self) -> None:
        with self._lock:
            if not self._lockfiles:
                return
            for r in self.regions.values():
                for s in r.listeners:
                    try:
                        s.shutdown(socket.SHUT_RDWR)       # wakes the relay's accept()
                    except OSError:
                        pass
                    s.close()
                _ip("netns", "del", r.ns, check=False)
            self.regions.clear()
            _ip("route", "flush", "root", str(self.block), check=False)
            _ip("route", "del", "unreachable", str(self.block), check=False)
            for fd in self._lockfiles:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            self._lockfiles = []
        atexit.unregister(self.stop)

    def __enter__(self) -> "RegionNets":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def connect_from(ns: str | None, host: str, port: int, timeout: float = 3.0) -> str:
    """A TCP connection to ``host:port`` made inside namespace ``ns`` (None: this process's own,
    the launcher's): ``connected``, ``refused`` (the address answered) or the error that stopped it."""
    out: list[str] = []

    def attempt() -> None:
        try:
            if ns is not None:
                _setns(str(NETNS_DIR / ns))
            with socket.create_connection((host, port), timeout=timeout):
                out.append("connected")
        except ConnectionRefusedError:
            out.append("refused")
        except OSError as e:
            out.append(f"{type(e).__name__}: {e}")

    t = threading.Thread(target=attempt, name="netns-connect")
    t.start()
    t.join()
    return out[0]


class DirectProbe:
    """The launcher's direct reach of each head's private address, tried for real: once a connection
    to ``port`` of the head's private address made inside its region connects (the head listens
    there), the same connection from this process is tried once. :attr:`tried`: head -> (inside,
    launcher) results; :attr:`unreachable`: True when every head tried connected inside and the
    launcher's tries all failed without an answer (not refused), None when no head was tried."""

    def __init__(self, nets: RegionNets, port: int) -> None:
        self.nets, self.port = nets, port
        self.tried: dict[str, tuple[str, str]] = {}

    def __call__(self, heads: dict[str, tuple[str, str]]) -> None:
        """``heads``: machine -> (region, private address), the heads running now."""
        for name, (region, ip) in heads.items():
            if name in self.tried or region not in self.nets.regions:
                continue
            inside = connect_from(self.nets.regions[region].ns, ip, self.port, timeout=1.0)
            if inside == "connected":
                self.tried[name] = (inside, connect_from(None, ip, self.port))

    @property
    def unreachable(self) -> bool | None:
        if not self.tried:
            return None
        return all(o not in ("connected", "refused") for _, o in self.tried.values())

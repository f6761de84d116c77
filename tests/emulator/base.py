"""What every emulated cloud shares (test and bench support, never product code).

An emulated cloud is a wire-level fake of the cloud's API plus an *instance emulator*: a thread
that watches the fake and turns each machine it reports running into a local node — the exact boot
script spotwise handed the cloud, run by ``bash`` with only environment overrides — and ends the
node's processes when the machine goes away. The clouds differ in what the fake is, how a machine
and its boot script are read from it, and how a preemption is delivered; they share, here:

* the S3 for checkpoints: the emulated AWS moto server on loopback (:class:`MotoServer`);
* the watch loop, which boots every machine the fake reports running at once, as a cloud does (a
  worker can be up before its head: the node's own boot must cope, as on the cloud);
* each node's environment (own state dirs and Ray temp dir, a stock image's Python without
  spotwise — the node installs the build the launch shipped — its metadata URL,
  free Ray agent ports, the marker variable that finds its processes) and its end;
* the free ports the orchestrator's own Ray head and control server take;
* a guest OS ``shutdown``: the machine halts and the cloud does what it does with it
  (:meth:`_guest_shutdown`: EC2 per the instance's shutdown behaviour, GCP ``TERMINATED`` with its
  disk, Azure still allocated), so a node that ends itself the wrong way is caught by what is left.

A subclass sets :attr:`NODES_DIR` and :attr:`THREAD_NAME` and implements :meth:`_live`,
:meth:`_start_node` (read the script, register the metadata, then :meth:`_boot`) and the cloud's
faults; :meth:`_is_running` when a listed machine may be in a state other than running.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from emulator.images import UBUNTU_2204_PY310, py310_image
from emulator.moto_server import MotoServer
from emulator.netns import RegionNets
from spotwise.provisioner.clouds.local.procs import KEEP_MARKER_ENV, MARKER_ENV, kill_until_gone, marked_pids
from spotwise.utils.net import service_port

RAY_AGENT_PORTS = ("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port",
                   "metrics-export-port")


_image_lock = threading.Lock()
_image: list[Path] = []


def stock_image_python() -> Path:
    """The Python of the emulated nodes' stock image (made once per process): a bare venv of this
    interpreter's base Python whose site packages are the test venv's, read as a plain directory.
    So it has torch, Ray and the cloud libraries, as a DL image has torch, but not spotwise: the
    test venv's editable install is a ``.pth`` file there, and ``.pth`` files of a directory that is
    merely on ``sys.path`` are not processed. A node must install the build the launch shipped."""
    import sysconfig

    with _image_lock:
        if not _image:
            root = Path(tempfile.mkdtemp(prefix="sw-image-"))
            base = getattr(sys, "_base_executable", None) or sys.executable
            subprocess.run([base, "-m", "venv", "--without-pip", str(root)], check=True)
            py = root / "bin" / "python"
            site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip()
            Path(site, "_stock_image.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
            probe = subprocess.run([str(py), "-c", "import spotwise"], capture_output=True, env=_node_base_env())
            assert probe.returncode != 0, "the stock image must not hold spotwise"
            _image.append(py)
        return _image[0]


def _node_base_env() -> dict[str, str]:
    """This process's environment minus what would hand a node this checkout's spotwise."""
    env = dict(os.environ)
    for k in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(k, None)
    return env


def orchestrator_ports() -> dict[str, str]:
    """Free ports for the ``spotwise launch`` process's own Ray head, dashboard and control server,
    and the node listing period an emulator affords (``SPOTWISE_NODE_POLL_S``: 2 s instead of a
    real account's 20; the listing-rate test holds the default against the clouds' limits)."""
    return {"SPOTWISE_RAY_PORT": str(service_port()), "SPOTWISE_RAY_DASHBOARD_PORT": str(service_port()),
            "SPOTWISE_CONTROL_PORT": str(service_port()), "SPOTWISE_NODE_POLL_S": "2"}


class EmulatedCloud:
    NODES_DIR = "instances"        # workdir/<NODES_DIR>/<machine>/: the node's script, state and boot log
    #: the image a node boots from: "stock" (a Python >= 3.11 with torch and Ray, named by
    #: SPOTWISE_PYTHON) or images.UBUNTU_2204_PY310 (python3 is 3.10, apt with empty lists and its
    #: first-boot locks: the node must install a Python that fits; :mod:`emulator.images`)
    IMAGE = "stock"
    THREAD_NAME = "instance-emulator"

    def __init__(self, workdir: Path, *, bucket: str = "ckpt") -> None:
        self.workdir = Path(workdir)
        self.bucket = bucket
        self.scripts: dict[str, bytes] = {}        # machine -> the boot script it executed
        self.nodes: dict[str, str] = {}            # machine -> marker value
        self.preempted: list[str] = []
        self.errors: list[str] = []
        self._tmps: dict[str, str] = {}            # machine -> its own temp dir (Ray's, under /tmp)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.moto: MotoServer | None = None
        self.halted: list[str] = []              # machines whose guest OS shut down (`shutdown -h now`)
        self.envs: dict[str, dict[str, str]] = {}  # machine -> its node's environment (what its guest runs with)
        #: "ssh": a head's public address (loopback here) runs a real sshd on port 22 whose authorized
        #: keys the head's boot script fills, and the launcher reaches the head through it
        #: (SPOTWISE_HEAD_PATH=ssh); "private": the launcher uses private addresses (a subclass sets it)
        self.head_path = "private"
        self.sshds: dict[str, object] = {}         # head -> its TestSshd (tests/sshd.py)
        self.offline: dict[str, str] = {}          # machine -> why it had no outbound access (its boot never ran)
        #: machine -> the command prefix its processes run under (its region's network namespace,
        #: :mod:`emulator.netns`; empty: this machine's own network)
        self.wraps: dict[str, list[str]] = {}
        #: the regions' network namespaces (:mod:`emulator.netns`), where a subclass made them
        self.nets: RegionNets | None = None
        self._addresses: dict[str, tuple[str, str, str | None]] = {}   # machine -> region, private, public

    # -- lifecycle ------------------------------------------------------------------------------
    def _start_moto(self, env: dict[str, str] | None = None) -> MotoServer:
        """The emulated AWS (moto) on loopback, logging to ``workdir/moto.log``."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.moto = MotoServer(patched=True, env=env, log=self.workdir / "moto.log")
        return self.moto

    def _start_loop(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.THREAD_NAME, daemon=True)
        self._thread.start()

    def _stop_nodes(self) -> None:
        """Stop watching, then end every node still running."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for name in list(self.nodes):
            self._end_node(name)
        # an sshd whose machine never became a node (its boot failed after the sshd started): a
        # leaked one kept the public address's port 22, and a later run's head could not bind it
        for name in list(self.sshds):
            self._end_node(name)

    def _stop_moto(self) -> None:
        if self.moto is not None:
            self.moto.close()
            self.moto = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self):  # pragma: no cover - each cloud's
        raise NotImplementedError

    def stop(self) -> None:  # pragma: no cover - each cloud's
        raise NotImplementedError

    # -- the instance emulator ----------------------------------------------------------------
    def _live(self) -> dict[str, dict]:
        """The cloud's machines of spotwise's, by name (or id), as the fake reports them now."""
        raise NotImplementedError

    def _is_running(self, machine: dict) -> bool:
        """Whether a listed machine runs (its node should exist). Default: listed means running."""
        return True

    def _start_node(self, machine: dict) -> None:
        raise NotImplementedError

    def _guest_bin(self) -> Path:
        """What a node's guest OS answers to ``shutdown`` (and ``sudo -n shutdown``): the machine
        halts, and the cloud acts on it as it would (:meth:`_guest_shutdown`). Nothing here ever
        shuts down the machine the tests run on. ``nvidia-smi`` fails as on a machine without a
        driver: an emulated node has no GPU even where the tests' machine has some (its boot
        would otherwise count the host's GPUs and check its torch against them)."""
        d = self.workdir / "guest-bin"
        if not (d / "shutdown").exists():
            d.mkdir(parents=True, exist_ok=True)
            halts = self.workdir / "guest-shutdowns"
            halts.mkdir(exist_ok=True)
            (d / "shutdown").write_text(f'#!/bin/bash\necho "$*" >"{halts}/${{{MARKER_ENV}}}"\n')
            (d / "sudo").write_text('#!/bin/bash\n[ "$1" = "-n" ] && shift\nexec "$@"\n')
            (d / "nvidia-smi").write_text("#!/bin/bash\necho 'NVIDIA-SMI has failed because it couldn'\"'\"'t "
                                          "communicate with the NVIDIA driver.' >&2\nexit 9\n")
            for f in ("shutdown", "sudo", "nvidia-smi"):
                (d / f).chmod(0o755)
        return d

    def _guest_shutdown(self, name: str) -> None:
        """What the cloud does with a machine whose guest OS shut down (each cloud's)."""
        raise NotImplementedError

    def _halts(self) -> None:
        """Machines whose guest ran ``shutdown``: the cloud acts, then the machine's processes stop."""
        d = self.workdir / "guest-shutdowns"
        for f in (d.iterdir() if d.is_dir() else []):
            name = next((n for n, m in list(self.nodes.items()) if m == f.name), None)
            f.unlink()
            if name is None:
                continue
            self.halted.append(name)
            self._guest_shutdown(name)
            self._end_node(name)

    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            try:
                self._halts()
                live = self._live()
                for name, m in live.items():
                    if self._is_running(m) and name not in self.nodes and name not in self.halted:
                        self._start_node(m)
                for name in list(self.nodes):
                    if name not in live or not self._is_running(live[name]):
                        self._end_node(name)
            except Exception as e:  # noqa: BLE001 - recorded; the test asserts there were none
                self.errors.append(f"{type(e).__name__}: {e}")

    def nodes_from_wheel(self) -> dict[str, tuple[str, str]]:
        """Machine -> (build id, wheel sha256) each node's boot log says it installed from the
        wheel its launch shipped (nodes boot from a stock image without spotwise)."""
        import re

        out = {}
        for name in list(self.scripts):
            log = self.node_dir(name) / "state" / "bootstrap.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            m = re.search(r"spotwise build ([0-9a-f]{16}) installed from \S+ sha256 ([0-9a-f]{64})", text)
            if m:
                out[name] = (m.group(1), m.group(2))
        return out

    def node_dir(self, name: str) -> Path:
        return self.workdir / self.NODES_DIR / name

    def _boot(self, name: str, script: bytes, script_file: str, *, metadata_url: str, creds: dict[str, str],
              extra_env: dict[str, str] | None = None, drop_env: tuple[str, ...] = (),
              no_way_out: str | None = None, wrap: list[str] | None = None) -> None:
        """Run ``script`` as machine ``name``'s node: saved as ``<node dir>/<script_file>``, run by
        bash in a new session with the node's environment (``drop_env``: the orchestrator's
        variables the node must not inherit), its processes marked for :meth:`_end_node`.
        ``no_way_out``: why the machine has no outbound access (no NAT, no public address): the
        script is not run, since every boot downloads the wheel and packages (issue 48 item 5).
        ``wrap``: the prefix that runs it inside its region's network namespace (:mod:`emulator.netns`)."""
        self.scripts[name] = script
        d = self.node_dir(name)
        d.mkdir(parents=True, exist_ok=True)
        (d / script_file).write_bytes(script)
        marker = f"emu-{name}"
        if no_way_out:
            # the machine runs, but nothing it asks of the wheel's URL or PyPI ever leaves its
            # network: its boot cannot install anything, so it is never run; the boot log says why
            # and the node never joins (the launcher's join watchdog ends it)
            (d / "boot.out").write_text(f"emulator: no outbound access: {no_way_out}\n")
            with self._lock:
                self.nodes[name] = marker
                self.offline[name] = no_way_out
            return
        # below the kernel's ephemeral range, never twice (service_port): a kernel-picked port was
        # taken by an outgoing connection before the agent bound it, and the node's agent died
        ports = " ".join(f"--{k}={service_port()}" for k in RAY_AGENT_PORTS)
        # the node's own temp dir, as a machine has its own /tmp: nodes that shared one (Ray's
        # default /tmp/ray) and started at once took the same Unix socket names, and one raylet
        # died with "bind: Address already in use". Short, for Unix socket paths (<= 107 bytes).
        tmp = tempfile.mkdtemp(prefix="swn-")
        with self._lock:
            self._tmps[name] = tmp
        env = _node_base_env()
        env.update(creds)
        env.update({
            "SPOTWISE_STATE_DIR": str(d / "state"), "SPOTWISE_ETC_DIR": str(d / "etc"),
            # a stock image: its Python has torch and Ray but no spotwise; the node's venv starts empty
            "SPOTWISE_VENV": str(d / "venv"), "SPOTWISE_PYTHON": str(stock_image_python()),
            "SPOTWISE_GPU_WAIT_S": "0",          # a CPU-only machine: no driver will come,
            "SPOTWISE_CPU_STANDIN": "1",         # and it stands in for a GPU node (no boot failure)
            "SPOTWISE_METADATA_URL": metadata_url,
            "SPOTWISE_RAY_START_ARGS": f"{ports} --num-cpus=1 --object-store-memory=100000000 --temp-dir={tmp}",
            "SPOTWISE_HOME": str(self.workdir), MARKER_ENV: marker, **KEEP_MARKER_ENV,
            "PATH": f"{self._guest_bin()}:{env.get('PATH', '/usr/bin:/bin')}",
            "GLOO_SOCKET_IFNAME": "lo", "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5",
            **(extra_env or {}),
        })
        # a machine of its own has its own home: this one's ~/.ray/auth_token (Ray writes one on a
        # local ray.init()) would turn on token auth in the node's Ray, whose dashboard then refused
        # the launcher's Jobs API calls with 401 until the boot timeout; so would an inherited mode
        home = d / "home"
        home.mkdir(exist_ok=True)
        env["HOME"] = str(home)
        for k in ("RAY_ADDRESS", "SPOTWISE_RAY_PORT", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
                  *drop_env):
            env.pop(k, None)
        if self.IMAGE == UBUNTU_2204_PY310:
            del env["SPOTWISE_PYTHON"]
            env["PATH"] = f'{py310_image(d / "image", stock_python=stock_image_python())}:{env["PATH"]}'
        with self._lock:
            self.nodes[name] = marker
            self.envs[name] = env
            self.wraps[name] = list(wrap or [])
        with open(d / "boot.out", "ab") as log:
            subprocess.Popen([*(wrap or []), "bash", str(d / script_file)], env=env, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)

    def _sigterm_node(self, name: str) -> None:
        """SIGTERM to every process of machine ``name``'s node, as a guest's shutdown sends it to
        what is still running (systemd's final kill); they may act on it, the hard off follows."""
        import signal

        with self._lock:
            marker = self.nodes.get(name)
        for pid in marked_pids(marker) if marker else []:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass

    def _head_sshd(self, name: str, public: str | None, allow_from: list[str] | None = None,
                   wrap: list[str] | None = None) -> dict[str, str]:
        """On the ssh head path, an sshd on the public address of a machine that has one (a head),
        port 22, as the test's user, its authorized keys a file of the node's own that the boot
        script fills (``SPOTWISE_AUTHORIZED_KEYS``), admitting only connections from ``allow_from``
        (the CIDRs the cloud's rules open port 22 to; None: any), run under ``wrap`` (the head's
        region's network namespace, where its public address is); the node's environment for it."""
        if self.head_path != "ssh" or not public:
            return {}
        from sshd import TestSshd

        server = TestSshd(self.node_dir(name) / "sshd", port=22, listen=public, authorize_client=False,
                          allow_from=None if allow_from is None else tuple(allow_from),
                          wrap=tuple(wrap or ())).start()
        with self._lock:
            self.sshds[name] = server
        return {"SPOTWISE_AUTHORIZED_KEYS": str(server.root / "authorized_keys")}

    def _in_region(self, name: str, region: str, private: str, public: str | None) -> list[str] | None:
        """With :attr:`nets`: machine ``name``'s addresses in its region's namespace, and the prefix
        its processes run under there (None: no namespaces, this machine's own network)."""
        if self.nets is None:
            return None
        self.nets.add_node(region, private, public)
        with self._lock:
            self._addresses[name] = (region, private, public)
        return self.nets.enter(region)

    def heads_in_netns(self) -> dict[str, tuple[str, str]]:
        """With :attr:`nets`: each running head (a machine with a public address) -> its region and
        private address (what :class:`emulator.netns.DirectProbe` tries)."""
        with self._lock:
            return {n: (r, ip) for n, (r, ip, pub) in self._addresses.items() if pub and n in self.nodes}

    def _end_node(self, name: str) -> None:
        """End every process of machine ``name``'s node (found by its marker variable), and its sshd;
        its addresses leave its region's namespace."""
        with self._lock:
            marker = self.nodes.pop(name, None)
            tmp = self._tmps.pop(name, None)
            server = self.sshds.pop(name, None)
            where = self._addresses.pop(name, None)
        if server is not None:
            server.stop()  # type: ignore[attr-defined]
        if marker:
            kill_until_gone(lambda: marked_pids(marker))
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        if self.nets is not None and where is not None:
            self.nets.remove_node(*where)

"""The ``local`` cloud: Ray nodes started as local processes, billed from a local price sheet.

Each "instance" is one ``ray start --block`` process (plus the interruption watcher) in a process
group of its own, so ending an instance is ``killpg`` — exactly as abrupt as a cloud reclaiming a
VM. Instances are recorded as JSON files under ``$SPOTWISE_HOME/local/instances/`` so that any
process (``spotwise down``, ``spotwise gc``, a restarted orchestrator) can find and end them:
the local equivalent of listing instances by tag.

Labels on every Ray node: ``spotwise-instance``, ``spotwise-cluster``, ``spotwise-job``,
``spotwise-cloud``, ``spotwise-zone``, ``spotwise-market`` — the same labels the real clouds'
bootstrap scripts set, so scheduling and the watcher behave identically.

Beside it: :mod:`~spotwise.provisioner.clouds.local.procs` finds and ends a node's processes (its
:data:`MARKER_ENV`, :func:`marked_pids` and :func:`cluster_of` are importable from here too), and
:mod:`~spotwise.provisioner.clouds.local.market` is the simulated spot market of each cluster.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from spotwise.errors import SpotwiseError
from spotwise.paths import home
from spotwise.pricing.offer import Market, Offer
from spotwise.provisioner.base import (
    CapacityError,
    Cloud,
    HeadEndpoint,
    LaunchRequest,
    Node,
    ProvisionError,
    register_cloud,
)
from spotwise.provisioner.boot.script import HEAD_RESOURCE, RAY_NODE_FLAGS, WORKER_RESOURCE
from spotwise.runtime.api import INSTANCE_LABEL
from spotwise.provisioner.clouds.local.market import MarketSettings, RunSide, SimulatedMarket
from spotwise.provisioner.clouds.local.metadata import MetadataServer
from spotwise.runtime.api import EMULATED_GPUS_LABEL  # the label the trainer reads (runtime/training/trainer.py)
from spotwise.provisioner.clouds.local.procs import (  # MARKER_ENV, marked_pids, cluster_of: public here too
    KEEP_MARKER_ENV,
    MARKER_ENV,
    cluster_of,
    kill_groups,
    kill_marked,
    kill_until_gone,
    marked_instances,
    marked_pids,
)
from spotwise.utils.net import service_port
from spotwise.utils.procs import group_alive as _alive

PRICE_SHEET_AS_OF = "2026-11-22"
PRICE_SHEET_SOURCE = "spotwise local cloud price sheet (mirrors AWS p3.2xlarge us-west-2)"


EMULATED_GPUS_ENV = "SPOTWISE_LOCAL_EMULATED_GPUS"
MAX_EMULATED_GPUS = 16


def emulated_gpus() -> int:
    """``local.emulated_gpus`` (``$SPOTWISE_LOCAL_EMULATED_GPUS``): how many GPUs each local worker
    node declares to Ray, for tests and benchmarks (docs/configuration.md); 0 when unset. Anything
    but a whole number 0..16 is refused, naming the setting."""
    from spotwise.config import setting, where
    from spotwise.errors import InputError, Problem

    raw = setting(EMULATED_GPUS_ENV)
    if raw is None or raw == "":
        return 0
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_EMULATED_GPUS:
        raise InputError(Problem(where(EMULATED_GPUS_ENV), raw,
                                 f"a whole number 0..{MAX_EMULATED_GPUS}: the GPUs each local worker node declares "
                                 "(tests and benchmarks only)"), source="environment")
    return n


def worker_ray_args(gpus: int) -> list[str]:
    """A local worker node's resources: one CPU and the worker resource; with ``gpus`` emulated GPUs,
    that many GPUs and CPUs (one of each per rank: Ray Train asks a GPU per rank)."""
    if not gpus:
        return ["--num-cpus=1"]
    return [f"--num-cpus={gpus}", f"--num-gpus={gpus}"]


def local_offers() -> list[Offer]:
    """The local price sheet as Offers (package data ``provisioner/data/local_prices.csv``)."""
    text = resources.files("spotwise.provisioner").joinpath("data/local_prices.csv").read_text()
    rows = csv.DictReader(line for line in text.splitlines() if line and not line.startswith("#"))
    return [
        Offer(cloud="local", instance_type=r["instance_type"], accelerator=r["accelerator"],
              accelerator_count=int(r["accelerator_count"]), region="local", zone=r["zone"],
              market=Market.parse(r["market"]), usd_per_hour=float(r["usd_per_hour"]),
              vcpus=float(r["vcpus"]), memory_gib=float(r["memory_gib"]),
              source=PRICE_SHEET_SOURCE, as_of=PRICE_SHEET_AS_OF)
        for r in rows
    ]


@dataclass
class LocalClusterConfig:
    """Per-cluster settings shared by the nodes of one local cluster."""

    cluster_id: str
    gcs_port: int
    temp_dir: str
    auth_token: str = ""
    metadata_url: str | None = None   # e.g. http://127.0.0.1:PORT/i  (per-instance root appended)
    dashboard_port: int = 0           # the head's Ray dashboard / Jobs API (0: no dashboard)
    control_port: int = 0             # the job driver's control endpoint on the head

    def env(self) -> dict[str, str]:
        """Environment of the cluster's node processes (loopback gloo, token auth)."""
        return {"GLOO_SOCKET_IFNAME": "lo", "RAY_USAGE_STATS_ENABLED": "0",
                # the head's job driver runs `python -m spotwise.runtime.node.job`: this venv's python
                "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.auth_token,
                # nodes must allow a multi-node cluster even if our caller is a loopback driver
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
                # Ray Train checks node drains every 5 s by default; the local market's notices
                # are seconds long, so look twice a second.
                "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5"}

    def driver_env(self) -> dict[str, str]:
        """Environment of a driver (the orchestrator) connecting to this cluster. The Windows/OSX
        flag makes Ray keep ``127.0.0.1`` instead of swapping in the machine's external address,
        which the loopback-bound GCS would not answer on."""
        return {**self.env(), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _state_dir() -> Path:
    d = home() / "local" / "instances"
    d.mkdir(parents=True, exist_ok=True)
    return d


@register_cloud("local")
class LocalCloud(Cloud):
    """Ray nodes on this machine. ``capacity`` limits concurrent spot nodes per zone (None: no limit);
    the simulated market (:mod:`spotwise.provisioner.clouds.local.market`) sets ``spot_unavailable``
    zones to make spot launches fail with :class:`CapacityError`, as a real cloud would."""

    priced_by_catalog = False
    on_this_machine = True
    list_period_s = 1.0           # listing reads local state files, not an API: as often as the monitor likes

    def __init__(self, *, python: str | None = None, market: MarketSettings | None = None) -> None:
        self.python = python or sys.executable
        self.spot_unavailable: set[str] = set()
        self._configs: dict[str, LocalClusterConfig] = {}
        self.market_settings = market
        self._runs: dict[str, RunSide] = {}

    @classmethod
    def for_task(cls, spec, opts) -> "LocalCloud":
        """The simulated market of the task's ``local:`` section, with the launch's overrides."""
        local = spec.local
        no = bool(getattr(opts, "no_preempt", False))
        preempt_at = getattr(opts, "preempt_at", None)
        notice = getattr(opts, "notice_seconds", None)
        return cls(market=MarketSettings(
            preempt_at=[] if no else list(preempt_at if preempt_at is not None else local.preempt_at),
            trace=None if no else (getattr(opts, "trace", None) or local.trace),
            tick_seconds=local.trace_tick_seconds,
            notice_seconds=notice if notice is not None else local.notice_seconds))

    # -- cluster-level ---------------------------------------------------------------------------
    def offers(self) -> list[Offer]:
        """The price sheet's worker offers; with ``local.emulated_gpus`` N, each sells N (CPU) ranks
        a node, so the plan's world size is the one the run will have."""
        n = emulated_gpus()
        return [o if not n else dataclasses.replace(o, accelerator_count=n)
                for o in local_offers() if o.instance_type != "local.head"]

    def head_offer(self, region: str, zone: str) -> Offer:
        return min((o for o in local_offers() if o.instance_type == "local.head"), key=lambda o: o.usd_per_hour)

    def prepare_cluster(self, cluster_id: str, job_id: str, region: str) -> None:
        """Per-cluster ports and token, the loopback metadata server (IMDSv2 for every instance)
        and the simulated spot market that posts notices on it."""
        if cluster_id in self._runs:
            return
        cfg = self.cluster_config(cluster_id)
        metadata = MetadataServer().start()
        cfg.metadata_url = f"http://127.0.0.1:{metadata.port}/i"
        cfg.dashboard_port, cfg.control_port = service_port(), service_port()
        run = RunSide(metadata=metadata)
        ms = self.market_settings or MarketSettings()
        if ms.trace and not Path(ms.trace).is_file():
            metadata.stop()
            raise SpotwiseError(f"local.trace: {ms.trace!r} is not a file (a spot trace JSON, 1 = available)")
        try:
            run.market = self._market(cluster_id, run, metadata, ms)
        except BaseException:   # re-raised below
            metadata.stop()              # nothing of this cluster may outlive a failed preparation
            raise
        self._runs[cluster_id] = run

    def _market(self, cluster_id: str, run: RunSide, metadata, ms: MarketSettings):
        return SimulatedMarket(
            cloud=self, metadata=metadata,
            spot_nodes=lambda: sorted((n for n in self.list_nodes(cluster_id)
                                       if n.role == "worker" and n.market == "spot"),
                                      key=lambda n: n.launched_at or 0),
            on_preempted=lambda node, p: None,     # the orchestrator sees the node go (list_nodes)
            on_notice=run.notice, ready=run.training_since_last_notice,
            preempt_at=list(ms.preempt_at), trace_path=ms.trace, tick_seconds=ms.tick_seconds,
            notice_seconds=ms.notice_seconds, zone="local-a")

    def endpoint(self, cluster_id: str, head: Node) -> HeadEndpoint:
        cfg = self.cluster_config(cluster_id)
        return HeadEndpoint(dashboard_url=f"http://127.0.0.1:{cfg.dashboard_port}",
                            control_url=f"http://127.0.0.1:{cfg.control_port}", env=cfg.driver_env(),
                            headers={"Authorization": f"Bearer {cfg.auth_token}"})

    def observe(self, cluster_id: str, snapshot: dict) -> list[dict]:
        run = self._runs.get(cluster_id)
        if run is None:
            return []
        run.seen(snapshot)
        if snapshot.get("started_at") and run.market is not None:
            run.market.start(snapshot["started_at"])      # once: later calls are no-ops
        return run.take_events()

    def was_preempted(self, node: Node) -> bool:
        run = self._runs.get(node.cluster_id)
        return run is not None and node.instance_id in run.noticed

    def cleanup_cluster(self, cluster_id: str) -> list[str]:
        run = self._runs.pop(cluster_id, None)
        if run is not None and run.market is not None:
            run.market.stop()
        killed = self.reap_cluster(cluster_id)
        if run is not None:
            run.metadata.stop()
        cfg = self._configs.get(cluster_id)
        if cfg:
            shutil.rmtree(cfg.temp_dir, ignore_errors=True)
        return [f"local: {killed} stray process(es) of cluster {cluster_id}"] if killed else []

    def configure(self, config: LocalClusterConfig) -> None:
        self._configs[config.cluster_id] = config

    def cluster_config(self, cluster_id: str) -> LocalClusterConfig:
        if cluster_id not in self._configs:
            self._configs[cluster_id] = LocalClusterConfig(
                cluster_id=cluster_id, gcs_port=service_port(),
                temp_dir=self.temp_dir_of(cluster_id), auth_token=secrets.token_hex(32))
        return self._configs[cluster_id]

    def head_address(self, cluster_id: str) -> str:
        return f"127.0.0.1:{self.cluster_config(cluster_id).gcs_port}"

    # -- Cloud interface -------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> list[Node]:
        offer = request.offer
        if offer.cloud != "local":
            raise ProvisionError(f"the local cloud cannot launch a {offer.cloud} offer ({offer.key})")
        if offer.market is Market.SPOT and offer.zone in self.spot_unavailable:
            raise CapacityError(f"no spot capacity for {offer.instance_type} in {offer.zone} right now",
                                offer_key=offer.key, cloud="local", region=offer.region,
                                code="InsufficientInstanceCapacity")
        cfg = self.cluster_config(request.cluster_id)
        started: list[Node] = []       # every node started, restarts included: what a failure ends
        try:
            # all of the request's nodes boot at once, as a cloud's do; then each is waited for
            for _ in range(request.count):
                started.append(self._start_node(request, cfg))
            return [self._up_or_restarted(request, cfg, n, started=started) for n in list(started)]
        # broad on purpose, and re-raised: whatever stopped the launch, the nodes already started
        # are ended first (never a partial launch left behind)
        except Exception:
            self.terminate(started)
            raise

    def _up_or_restarted(self, request: LaunchRequest, cfg: LocalClusterConfig, node: Node, *,
                         started: list[Node], attempts: int = 3) -> Node:
        """``node`` once Ray says it is up; a node whose raylet failed to register (it happens on an
        overloaded machine) is ended and started again, up to ``attempts`` starts in all. Each
        restart is appended to ``started`` at once, so a launch that fails later ends it too."""
        for attempt in range(1, attempts + 1):
            try:
                self._wait_until_up(node)
                return node
            except ProvisionError:
                self.terminate([node])
                if attempt == attempts:
                    raise
                node = self._start_node(request, cfg)
                started.append(node)
        raise AssertionError("unreachable")

    def _wait_until_up(self, node: Node, timeout: float = 120) -> None:
        log = home() / "local" / "logs" / f"{node.instance_id}.log"
        pgid = node.extra["pgid"]
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if b"Ray runtime started" in log.read_bytes():
                    return
            except OSError:
                pass
            if not _alive(pgid):
                raise ProvisionError(f"local node {node.instance_id} failed to start; see {log}")
            time.sleep(0.1)
        raise ProvisionError(f"local node {node.instance_id} did not start within {timeout:.0f} s; see {log}")

    def _start_node(self, request: LaunchRequest, cfg: LocalClusterConfig) -> Node:
        offer = request.offer
        instance_id = f"{request.cluster_id}-{request.role}-{os.urandom(3).hex()}"
        labels = {
            INSTANCE_LABEL: instance_id,
            "spotwise-cluster": request.cluster_id,
            "spotwise-job": request.job_id,
            "spotwise-cloud": "local",
            "spotwise-zone": offer.zone,
            "spotwise-market": offer.market.value,
            **request.labels,
        }
        gpus = emulated_gpus() if request.role != "head" else 0
        if gpus:
            labels[EMULATED_GPUS_LABEL] = str(gpus)
        ray_bin = str(Path(self.python).with_name("ray"))
        cmd = [ray_bin, "start", "--block", *RAY_NODE_FLAGS, "--node-ip-address=127.0.0.1",
               f"--labels={','.join(f'{k}={v}' for k, v in labels.items())}",
               f"--dashboard-agent-listen-port={service_port()}",
               f"--dashboard-agent-grpc-port={service_port()}",
               f"--runtime-env-agent-port={service_port()}",
               f"--metrics-export-port={service_port()}",
               "--object-store-memory=100000000"]
        if request.role == "head":
            cmd += ["--head", f"--port={cfg.gcs_port}", "--num-cpus=0", f"--temp-dir={cfg.temp_dir}",
                    f"--resources={json.dumps({HEAD_RESOURCE: 1})}"]
            cmd += (["--dashboard-host=127.0.0.1", f"--dashboard-port={cfg.dashboard_port}"]
                    if cfg.dashboard_port else ["--include-dashboard=false"])
        else:
            # Each worker its own temp dir, as on a machine of its own: Ray names a node's Unix
            # sockets by the first free suffix in its session's sockets dir, so two workers that
            # shared the cluster's and started at once both took ``raylet.1``; one raylet died with
            # "bind: Address already in use" and its node came up only after Ray's 30 s start-up
            # timeout and a restart (every local launch of two workers, measured 2026-11-27).
            node_tmp = Path(cfg.temp_dir) / "nodes" / instance_id.rsplit("-", 1)[-1]
            node_tmp.mkdir(parents=True, exist_ok=True)
            cmd += [f"--address={self.head_address(request.cluster_id)}", *worker_ray_args(gpus),
                    f"--resources={json.dumps({WORKER_RESOURCE: 1})}", f"--temp-dir={node_tmp}"]
        log_dir = home() / "local" / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        log = open(log_dir / f"{instance_id}.log", "ab")
        env = dict(os.environ)
        env.update(cfg.env())
        env[MARKER_ENV] = instance_id
        env.update(KEEP_MARKER_ENV)           # ... readable in /proc even after Ray renames a process
        env["SPOTWISE_HOME"] = str(home())    # whose node this is: `gc` sweeps only its own home's strays
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
        log.close()
        now = time.time()
        node = Node(cloud="local", instance_id=instance_id, instance_type=offer.instance_type,
                    region=offer.region, zone=offer.zone, market=offer.market.value,
                    usd_per_hour=offer.usd_per_hour, cluster_id=request.cluster_id,
                    job_id=request.job_id, role=request.role, state="running", launched_at=now,
                    address=self.head_address(request.cluster_id),
                    extra={"pgid": proc.pid, "price_source": offer.source, "price_as_of": offer.as_of})
        self._write(node)
        if cfg.metadata_url:
            self._start_watcher(node, cfg, env)   # env carries MARKER_ENV=instance_id
        return node

    def _start_watcher(self, node: Node, cfg: LocalClusterConfig, env: dict) -> None:
        """The interruption watcher (and dead man's switch) of a node, head included: the same
        arguments as the cloud boot script gives it, except that the node ends itself by killing
        its own marked processes (``--self-end local``) instead of shutting a machine down."""
        from spotwise.runtime.node.deadman import BOOT_LEASE_S

        cmd = [self.python, "-m", "spotwise.runtime.node.watch", "--cloud", "aws",
               "--metadata-url", f"{cfg.metadata_url}/{node.instance_id}",
               "--instance-id", node.instance_id, "--gcs-address", self.head_address(node.cluster_id),
               "--lease-deadline", f"{time.time() + BOOT_LEASE_S:.3f}", "--self-end", "local"]
        log = open(home() / "local" / "logs" / f"{node.instance_id}.watch.log", "ab")
        # Own session; it carries the node's marker variable, so ending the node ends it too.
        subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True, env=env)
        log.close()

    def _wait_for_gcs(self, cfg: LocalClusterConfig, proc: subprocess.Popen, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if proc.poll() is not None:
                raise ProvisionError(f"the local Ray head exited with code {proc.returncode}; "
                                     f"see {home() / 'local' / 'logs'}")
            try:
                with socket.create_connection(("127.0.0.1", cfg.gcs_port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        raise ProvisionError("the local Ray head did not come up within 60 s")

    def terminate(self, nodes: list[Node]) -> None:
        """End ``nodes`` together (one grace period for all of them, not one each)."""
        kill_groups([p for p in (node.extra.get("pgid") or self._read_pgid(node.instance_id) for node in nodes) if p])
        for node in nodes:
            kill_marked(node.instance_id)
            node.state = "terminated"
            rec = _state_dir() / f"{node.instance_id}.json"
            try:
                data = json.loads(rec.read_text())
            except (OSError, json.JSONDecodeError):
                continue                      # gone (or never written): nothing to mark
            if data:
                data["state"] = "terminated"
                data["terminated_at"] = time.time()
                _write_json(rec, data)
        # A head going away takes its temp dir with it.
        for node in nodes:
            if node.role == "head":
                cfg = self._configs.get(node.cluster_id)
                if cfg:
                    shutil.rmtree(cfg.temp_dir, ignore_errors=True)

    def kill_now(self, node: Node) -> None:
        """SIGKILL a node's whole process group at once: how a spot reclaim looks from inside."""
        pgid = node.extra.get("pgid") or self._read_pgid(node.instance_id)
        if pgid:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(pgid, os.WNOHANG)
            except ChildProcessError:
                pass
        kill_marked(node.instance_id)
        self.terminate([node])

    def reap_cluster(self, cluster_id: str) -> int:
        """Kill every process left by any instance of ``cluster_id`` (instance ids start with it),
        including ones whose ``ray start`` already died. Returns how many were killed."""
        return len(kill_until_gone(lambda: marked_pids(prefix=f"{cluster_id}-")))

    def leftovers(self, cluster_ids: set[str], *, match: bool, dry_run: bool) -> list[str]:
        """Processes and temporary directories of this home's local clusters that no node record
        accounts for: a ``ray start`` or watcher started while its launch was interrupted (before
        its record was written), helpers re-parented away from a node that was ended, the
        ``/tmp/sw-<cluster>`` directory of a head that died. ``match=True``: those of
        ``cluster_ids`` (``down``); ``match=False``: those of every other cluster (``gc``).
        Ends them unless ``dry_run``; returns what it found, one line each."""
        out: list[str] = []
        by_cluster: dict[str, list[int]] = {}
        for pid, iid in marked_instances(str(home())).items():
            by_cluster.setdefault(cluster_of(iid), []).append(pid)
        known = set(by_cluster)
        for rec in _state_dir().glob("*.json"):
            try:
                known.add(json.loads(rec.read_text())["cluster_id"])
            except (OSError, ValueError, KeyError):
                continue
        for cid in sorted(known):
            if (cid in cluster_ids) != match:
                continue
            pids = by_cluster.get(cid, [])
            if pids:
                if not dry_run:
                    pids = sorted(kill_until_gone(lambda: [p for p, i in marked_instances(str(home())).items()
                                                            if cluster_of(i) == cid]))
                out.append(f"local: {len(pids)} stray process(es) of cluster {cid}")
            tmp = Path(self.temp_dir_of(cid))
            if tmp.is_dir():
                if not dry_run:
                    shutil.rmtree(tmp, ignore_errors=True)
                out.append(f"local: temporary directory {tmp} of cluster {cid}")
        return out

    @staticmethod
    def temp_dir_of(cluster_id: str) -> str:
        return f"/tmp/sw-{cluster_id[-12:]}"

    def list_nodes(self, cluster_id: str | None = None, *, regions: list[str] | None = None) -> list[Node]:
        out = []
        for rec in sorted(_state_dir().glob("*.json")):
            try:
                data = json.loads(rec.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if cluster_id and data.get("cluster_id") != cluster_id:
                continue
            if data.get("state") == "terminated":
                continue
            pgid = data.get("extra", {}).get("pgid")
            if not pgid or not _alive(pgid):
                data["state"] = "terminated"
                _write_json(rec, data)
                continue
            data.pop("terminated_at", None)
            out.append(Node(**data))
        return out

    # -- records ---------------------------------------------------------------------------------
    def _write(self, node: Node) -> None:
        _write_json(_state_dir() / f"{node.instance_id}.json", node.to_dict())

    def _read_pgid(self, instance_id: str) -> int | None:
        rec = _state_dir() / f"{instance_id}.json"
        if not rec.exists():
            return None
        return json.loads(rec.read_text()).get("extra", {}).get("pgid")


def _write_json(path: Path, data: dict) -> None:
    """Replace ``path`` with ``data`` atomically: several processes (the runner, ``gc``, a node's
    own switch) read and rewrite these records, and a reader must never see half a file. The temp
    name is this writer's own, so two writers never share one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)

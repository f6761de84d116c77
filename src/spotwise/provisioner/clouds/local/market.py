"""The local cloud's simulated spot market, and what the local cloud keeps per running cluster.

It preempts spot nodes the way EC2 does: post a ``spot/instance-action`` notice on the node's
metadata endpoint, wait the notice period, then kill the node's processes. Preemptions come from
a schedule (seconds after training starts) or from a spot trace (the format of the shared
spot-traces collection: ``data[i] == 1`` means spot available during tick ``i``), replayed at
``tick_seconds`` of wall time per tick; while a trace says 0, spot launches in that zone fail
with a capacity error.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from spotwise.provisioner.base import Node
from spotwise.provisioner.clouds.local.metadata import MetadataServer


class MarketHost(Protocol):
    """What the market needs of the cloud it runs in (the local cloud,
    :class:`~spotwise.provisioner.clouds.local.cloud.LocalCloud`): the zones where a spot launch now meets a
    capacity error, and a way to reclaim a node at once. A Protocol rather than the class, so
    this module does not import the cloud that imports it."""

    spot_unavailable: set[str]

    def kill_now(self, node: Node) -> None: ...


@dataclass
class Preemption:
    instance_id: str
    notice_at: float
    kill_at: float
    killed_at: float | None = None


@dataclass
class SimulatedMarket:
    cloud: MarketHost
    metadata: MetadataServer
    spot_nodes: Callable[[], list[Node]]          # live spot worker nodes, oldest first
    on_preempted: Callable[[Node, Preemption], None]
    on_notice: Callable[[Node, Preemption], None] | None = None
    # Scheduled preemptions wait until this says the run is training (not mid-restart), so each
    # scheduled preemption interrupts real work; None: fire on the clock regardless.
    ready: Callable[[], bool] | None = None
    preempt_at: list[float] = field(default_factory=list)
    trace_path: str | None = None
    tick_seconds: float | None = None
    notice_seconds: float = 5.0
    zone: str = "local-a"
    history: list[Preemption] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._trace: list[int] | None = None
        if self.trace_path:
            data = json.loads(Path(self.trace_path).read_text())
            self._trace = [int(x) for x in data["data"]]
            if self.tick_seconds is None:
                self.tick_seconds = 1.0

    def start(self, t0: float) -> None:
        """Start the clock at ``t0`` (when training started)."""
        if self._thread is not None:
            return
        target = self._run_trace if self._trace is not None else self._run_schedule
        self._thread = threading.Thread(target=target, args=(t0,), name="spot-market", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- drivers -------------------------------------------------------------------------------
    def _run_schedule(self, t0: float) -> None:
        """Each scheduled time notices one spot node not already under notice; a time given N
        times notices N distinct nodes at once (``--preempt-at 10,10``: two nodes noticed
        together, as when a Slurm job of several nodes is preempted, or a zone reclaims several
        instances). A notice does not wait for an earlier noticed node to go: on a real cloud a
        second reclaim can come while the first node's warning runs, and a run that restarted
        without the first node (issue 51) is training again well before then."""
        times = sorted(self.preempt_at)
        for t in sorted(set(times)):
            if self._stop.wait(max(0.0, t0 + t - time.time())):
                return
            while self.ready is not None and not self.ready():
                if self._stop.wait(0.2):
                    return
            for node in self._unnoticed()[:times.count(t)]:
                self._preempt(node)

    def _unnoticed(self) -> list[Node]:
        """The live spot workers, oldest first, less those already given a notice."""
        noticed = {p.instance_id for p in self.history}
        return [n for n in self.spot_nodes() if n.instance_id not in noticed]

    def _run_trace(self, t0: float) -> None:
        assert self._trace is not None and self.tick_seconds
        prev = 1
        for i, avail in enumerate(self._trace):
            if self._stop.wait(max(0.0, t0 + i * self.tick_seconds - time.time())):
                return
            if avail:
                self.cloud.spot_unavailable.discard(self.zone)
            else:
                self.cloud.spot_unavailable.add(self.zone)
                if prev:
                    for node in self._unnoticed():
                        if node.zone == self.zone:
                            self._preempt(node)
            prev = avail
        self.cloud.spot_unavailable.discard(self.zone)

    def _preempt(self, node: Node) -> None:
        """Notice ``node`` now (recorded before this returns, so the next choice skips it), end
        it when the notice runs out (a thread)."""
        now = time.time()
        p = Preemption(node.instance_id, notice_at=now, kill_at=now + self.notice_seconds)
        self.history.append(p)
        if self.on_notice is not None:
            self.on_notice(node, p)
        self.metadata.post_notice(node.instance_id, action="terminate", at=p.kill_at)
        threading.Thread(target=self._kill_at_deadline, args=(node, p), daemon=True).start()

    def _kill_at_deadline(self, node: Node, p: Preemption) -> None:
        if self._stop.wait(max(0.0, p.kill_at - time.time())):
            return
        self.cloud.kill_now(node)
        p.killed_at = time.time()
        self.on_preempted(node, p)


@dataclass
class MarketSettings:
    """The local cloud's simulated spot market for one run (task ``local:`` + launch flags)."""

    preempt_at: list[float] = field(default_factory=list)
    trace: str | None = None
    tick_seconds: float | None = None
    notice_seconds: float = 5.0


@dataclass
class RunSide:
    """What the local cloud (:class:`~spotwise.provisioner.clouds.local.cloud.LocalCloud`) keeps per running
    cluster: its metadata server, its market, the nodes it gave a notice and the progress it has
    seen (scheduled preemptions wait until training runs again after a notice)."""

    metadata: MetadataServer
    market: SimulatedMarket | None = None
    noticed: set = field(default_factory=set)
    events: list = field(default_factory=list)
    last_step_t: float = 0.0
    last_notice_t: float = 0.0
    resumes_seen: int = 0
    resumes_at_notice: int = 0

    def notice(self, node: Node, p) -> None:
        self.noticed.add(node.instance_id)
        self.last_notice_t = time.time()
        self.resumes_at_notice = self.resumes_seen
        self.events.append({"event": "spot_notice", "instance_id": node.instance_id,
                            "kill_at": round(p.kill_at, 3)})

    def seen(self, snapshot: dict) -> None:
        if snapshot.get("step_time"):
            self.last_step_t = max(self.last_step_t, float(snapshot["step_time"]))
        self.resumes_seen = len(snapshot.get("resumes") or [])

    def training_since_last_notice(self) -> bool:
        resumed = self.last_notice_t == 0.0 or self.resumes_seen > self.resumes_at_notice
        return self.last_step_t > self.last_notice_t + 1e-6 and resumed

    def take_events(self) -> list[dict]:
        out, self.events = self.events, []
        return out

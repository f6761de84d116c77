"""The head tells the orchestrator which of the cluster's nodes are being drained, at once.

Why: a node's interruption notice reaches training through the node's own watcher
(:mod:`spotwise.runtime.node.watch`: cloud notice -> ``GcsClient.drain_node`` with reason
PREEMPTION), and nothing told the orchestrator until the cloud stopped listing the node — after
the notice window (2 min on AWS) — so the replacement was asked for only then. Ray's GCS knows
every draining node and its deadline the moment the drain is accepted, on any cloud (Slurm's
signal included: its watcher drains the same way), and the head's job driver can ask it.

How: :class:`DrainReporter`, a daemon thread in the job driver (:mod:`spotwise.runtime.node.job`),
asks the GCS every ``every_s`` (1 s) for the draining nodes
(``ray._private.state.state.get_draining_nodes()``: Ray node id -> deadline in ms, 0 for none) and
reports each newly draining one once, as the control actor's event ``node_draining`` with the
node's ``spotwise-instance`` label (:data:`~spotwise.runtime.node.watch.INSTANCE_LABEL`, which
names the cloud instance) and the deadline. The orchestrator reads it with the job's snapshot
(every tick). A node it drains itself (a market move) is reported too; the orchestrator knows its
own. An error asking the GCS is logged once and asked again next time: a notice then only waits
for the cloud's listing, as before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from spotwise.runtime.node.watch import INSTANCE_LABEL

log = logging.getLogger("spotwise.drains")

EVERY_S = 1.0
EVENT = "node_draining"


def ray_draining() -> dict[str, int]:
    """Ray node id (hex) -> drain deadline in ms (0: none), from the connected driver's GCS."""
    from ray._private.state import state

    return dict(state.get_draining_nodes())


def ray_labels() -> dict[str, str]:
    """Ray node id (hex) -> its ``spotwise-instance`` label (nodes without one left out)."""
    import ray

    return {n["NodeID"]: n["Labels"][INSTANCE_LABEL] for n in ray.nodes()
            if INSTANCE_LABEL in (n.get("Labels") or {})}


class DrainReporter:
    """Reports each newly draining node once through ``report(EVENT, instance=, node_id=,
    deadline_ms=)``; ``draining`` and ``labels`` ask Ray (replaced in tests by what Ray answers)."""

    def __init__(self, report: Callable[..., object], *, draining: Callable[[], dict[str, int]] = ray_draining,
                 labels: Callable[[], dict[str, str]] = ray_labels, every_s: float = EVERY_S) -> None:
        self.report, self.draining, self.labels, self.every_s = report, draining, labels, every_s
        self.seen: set[str] = set()
        self._failing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spotwise-drains", daemon=True)

    def check(self) -> list[str]:
        """Ask once; report the nodes that started draining since the last time. Returns their ids."""
        try:
            now = self.draining()
            new = [nid for nid in now if nid not in self.seen]
            names = self.labels() if new else {}
        except Exception as e:  # noqa: BLE001 - the GCS is busy or going: asked again next time
            if not self._failing:
                log.warning("could not ask Ray which nodes are draining (asked again every %.0f s): %s",
                            self.every_s, e)
            self._failing = True
            return []
        self._failing = False
        for nid in new:
            self.seen.add(nid)
            self.report(EVENT, instance=names.get(nid), node_id=nid, deadline_ms=now[nid] or None)
        return new

    def start(self) -> DrainReporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.check()

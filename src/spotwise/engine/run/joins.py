"""The join watchdog: a worker the cloud lists but whose Ray is not in the cluster is ended.

Why: the orchestrator learns that a node went away from its cloud (``Cloud.list_nodes``). A worker
whose Ray never joined the cluster (its boot script failed, ``ray start`` died, the raylet could not
register) or left it later (the raylet crashed, the instance stayed up) is still listed, so nothing
replaces it: training waits for it while the node is billed. ``boot_timeout_s`` only covers a run
whose training never starts; a *replacement* worker launched after a preemption is past it.

How: every node's boot script starts Ray with the label ``spotwise-instance=<instance id>``
(:data:`~spotwise.runtime.api.INSTANCE_LABEL`), so the head's Ray dashboard says which
of our instances have an ALIVE Ray node (:func:`alive_instances`, Ray's state API). :class:`JoinWatch`
keeps, per worker, when it was last seen ALIVE (or launched) and names those not seen for longer
than the join timeout; the orchestrator ends them, counts them as lost and replaces them.

Unknown is never "not joined": only a successful answer of the dashboard is evidence, and a
worker is judged only against such an answer (:meth:`JoinWatch.overdue`). The head is not
watched: losing it is already fatal, and a dashboard that answers means it is up.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from spotwise.provisioner.base import Node
from spotwise.provisioner.boot.script import instance_label_value
from spotwise.runtime.api import INSTANCE_LABEL

log = logging.getLogger("spotwise.orchestrator")

POLL_S = 5.0               # ask the dashboard at most this often (the monitor ticks 4 times a second)
HTTP_TIMEOUT_S = 3.0       # one question; the monitor's other work (budget, progress) waits for it
MAX_NODES = 10_000         # Ray's own cap on one state-API answer (RAY_MAX_LIMIT_FROM_API_SERVER)


@dataclass(frozen=True, slots=True)
class Overdue:
    """A worker the watchdog gives up on: how long it has gone unseen and what was last seen of it."""

    node: Node
    unseen_s: float
    seen: str                  # "never ALIVE in Ray" | "last ALIVE in Ray N s before"


@dataclass
class JoinWatch:
    """Pure bookkeeping of which workers' Ray nodes are ALIVE, fed by the monitor.

    Contract:
      * :meth:`seen` takes one answer of the dashboard: the ``spotwise-instance`` label values of
        its ALIVE nodes (each is then "last seen" at ``now``), or ``None`` when it did not answer:
        unknown, so the previous answer is set aside and :meth:`overdue` names no node until the
        next successful one.
      * :meth:`overdue` names the workers absent from the last successful answer whose clock — the
        last answer that listed them, else their launch (``Node.launched_at``, else the first time
        the watch was shown them) — ran past ``timeout_s`` *at that answer* (never by the passing
        of time alone). The head, and the ``exclude``d instance ids (nodes being drained or ended
        by the orchestrator), never are.
      * Nodes no longer shown to :meth:`overdue` are forgotten.
    """

    timeout_s: float
    _last_alive: dict[str, float] = field(default_factory=dict)   # label value -> last answer listing it
    _first_shown: dict[str, float] = field(default_factory=dict)  # instance id -> first overdue() call with it
    _alive: frozenset[str] | None = None                          # label values of the last answer
    _answered_at: float | None = None                             # when the last answer (if successful) came

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s!r}")

    def seen(self, alive: Iterable[str] | None, now: float) -> None:
        """Record the dashboard's answer at ``now``: label values of ALIVE nodes, or None (unknown)."""
        if alive is None:
            self._alive, self._answered_at = None, None
            return
        self._alive, self._answered_at = frozenset(alive), now
        for label in self._alive:
            self._last_alive[label] = max(now, self._last_alive.get(label, now))

    def overdue(self, nodes: Iterable[Node], now: float, *, exclude: Collection[str] = ()) -> list[Overdue]:
        """The workers of ``nodes`` to give up on, judged against the last successful answer."""
        nodes = list(nodes)
        ids, labels = {n.instance_id for n in nodes}, {instance_label_value(n.instance_id) for n in nodes}
        self._first_shown = {i: t for i, t in self._first_shown.items() if i in ids}
        self._last_alive = {v: t for v, t in self._last_alive.items() if v in labels}
        for n in nodes:
            self._first_shown.setdefault(n.instance_id, now)
        if self._alive is None or self._answered_at is None:
            return []
        t, out = self._answered_at, []
        for n in nodes:
            if n.role == "head" or n.instance_id in exclude:
                continue
            label = instance_label_value(n.instance_id)
            if label in self._alive:
                continue
            last = self._last_alive.get(label)
            since = last if last is not None else (n.launched_at or self._first_shown[n.instance_id])
            if t - since > self.timeout_s:
                seen = "never ALIVE in Ray" if last is None else f"last ALIVE in Ray {t - last:.0f} s before"
                out.append(Overdue(node=n, unseen_s=t - since, seen=seen))
        return out


def alive_instances(dashboard_url: str, headers: Mapping[str, str] | None = None, *,
                    timeout_s: float = HTTP_TIMEOUT_S) -> set[str] | None:
    """The ``spotwise-instance`` label values of the cluster's ALIVE Ray nodes, from the head's
    dashboard (Ray's state API, ``GET /api/v0/nodes`` filtered on ``state=ALIVE``); ``headers`` are
    the endpoint's (its auth token). ``None`` — unknown, never "none alive" — when the dashboard
    does not answer, answers an error, a body that is not the state API's, a partial answer (a data
    source failed) or one cut by the limit: a node missing from such an answer may well be alive.

    Ray 2.60 applies the state filter in the GCS query, so the answer's ``total`` counts the DEAD
    nodes it left out (``total - num_after_truncation`` are those, not a truncation); ``num_filtered``
    is the number of ALIVE nodes before the ``limit``."""
    query = urllib.parse.urlencode({"limit": MAX_NODES, "timeout": max(1, int(timeout_s)), "detail": "false",
                                    "filter_keys": "state", "filter_predicates": "=", "filter_values": "ALIVE"})
    req = urllib.request.Request(f"{dashboard_url.rstrip('/')}/api/v0/nodes?{query}", headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            body = json.loads(r.read())
    except (OSError, ValueError) as e:   # URLError/HTTPError/timeouts are OSErrors; bad JSON a ValueError
        log.debug("join watch: no answer from %s: %s", dashboard_url, e)
        return None
    try:
        if body.get("result") is not True:
            return None
        data = body["data"]["result"]
        rows = data["result"]
        if data.get("partial_failure_warning") or int(data["num_filtered"]) > len(rows):
            return None
        return {str(row["labels"][INSTANCE_LABEL]) for row in rows
                if row.get("state") == "ALIVE" and INSTANCE_LABEL in (row.get("labels") or {})}
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        log.warning("join watch: unexpected answer from %s's state API: %s", dashboard_url, e)
        return None

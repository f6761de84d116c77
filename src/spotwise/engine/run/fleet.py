"""The cluster's nodes, through the provisioner's :class:`~spotwise.provisioner.base.Cloud` interface.

:class:`Fleet` owns every node of the run: it launches them (the head and workers through the
failover, walking the plan's offers), opens and closes their bills, notices the ones that went
away (:meth:`Fleet.sync`) or whose Ray never joined (:meth:`Fleet.check_joins`), drains and ends
them, and tears the cluster down. What a loss *means* for the run — counting it, giving up after
too many, measuring the restart — is the orchestrator's: the fleet hands each loss to a callback.

Rules that are easy to break:

* **One** ``Cloud`` instance per cloud name (:meth:`Fleet.cloud`), shared by the failover, the
  node checks, the job's observation and the teardown: the local cloud keeps its simulated market
  and metadata server in that instance.
* Three node filters, each for its reason: the run's **workers** (:meth:`Fleet.workers`: not being
  drained by a market move, not a spot probe the policy has not taken yet); **spot running** for
  the availability the policy is shown (those workers, less any being ended); the **spot record**
  for later runs (:meth:`Fleet.spot_sites`: every spot worker not being ended, drained and probing
  ones included).
* A node we end ourselves is in :attr:`Fleet.ending` first, so its disappearance is not a loss;
  every node's bill closes with the reason it ended (``gone``, ``ended``, ``moved``, ``budget``,
  ``migrated``, ``teardown``, ...).
* A worker under an interruption notice (:attr:`Fleet.noticed`) that the run ends itself —
  a region move, anything but the run's own end (:data:`OWN_ENDS`) — is its cloud's preemption
  all the same, come a little early: its bill closes ``preempted (REASON)`` and
  :attr:`Fleet.on_cut_short` (:meth:`Recovery.cut_short`) counts it. Without that, a move during
  a notice ended the node before its cloud did and no preemption was ever counted. "Under
  notice" lasts until the node is gone or the notice is judged to have passed, a minute past its
  deadline (:meth:`Recovery.check_notices`): a cloud takes a node at about its deadline, and the
  listing that shows it gone may come a listing period later, so a node the run ends in that
  minute was most likely already being taken.
* **Polite listing** (issue 30): each cloud is asked which nodes it still lists every
  ``node_poll_s`` (:data:`NODE_POLL_S`, 20 s: 3 calls a minute per cloud, within every cloud's
  read limits; a cloud with no API to spare, the local one, sets its own ``list_period_s``), only in the regions the run's nodes are in, by the cluster's tag. What needs to be
  fast does not wait for it: a notice reaches training through the node's own watcher, the dead
  man's switch is on the node, and when the head's Ray stops listing a worker as ALIVE (the join
  watch, every 5 s, asks Ray, not the cloud) the next tick lists at once (:meth:`Fleet.list_soon`).
  A listing that fails is "unknown" for that cloud, never "gone" (logged; asked again next
  period), and a node launched less than its cloud's ``listing_lag_s`` ago (AWS 60 s, else 0) that
  the listing lacks is not gone yet: EC2 may list an instance late after ``CreateFleet``. That
  grace ends once a listing has shown the instance (:attr:`Fleet.listed`): EC2's lag is a new
  resource not yet seen, so a node listed before and missing now is gone, even a young one (a spot
  worker reclaimed in its first minute was replaced a listing period after the grace, about 35 s
  late, in the emulated AWS run).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from spotwise.engine.plan.options import NODE_POLL_S
from spotwise.engine.run.cadence import Every
from spotwise.engine.run.joins import POLL_S as JOIN_POLL_S
from spotwise.engine.run.joins import JoinWatch, Overdue, alive_instances
from spotwise.engine.run.journal import Journal
from spotwise.engine.state.ledger import Ledger
from spotwise.engine.run.market_watch import MarketWatch, site_of
from spotwise.engine.state.spot_log import SiteKey
from spotwise.errors import SpotwiseError
from spotwise.policies.base import NONE, ON_DEMAND, SPOT
from spotwise.pricing.offer import Offer
from spotwise.provisioner.base import Cloud, Node
from spotwise.provisioner.head_path import HeadEndpoint
from spotwise.provisioner.boot.script import instance_label_value
from spotwise.provisioner.failover import Attempt, Failover

log = logging.getLogger("spotwise.orchestrator")

DRAIN_DEADLINE_S = 60.0    # a market move's old nodes get this long for their checkpoint
UPKEEP_S = 1.0             # drains, the join watch's clock and replacements are looked at this often
# ends of the run's own that are no preemption of a noticed worker among the nodes they end: the run
# is over (the budget's hard stop; the teardown closes its bills itself) or the notice passed
OWN_ENDS = frozenset({"budget", "teardown", "notice passed"})


class Fleet:
    """The run's nodes on every cloud it uses.

    ``cloud(name)`` makes the Cloud for a name (called once per name); ``failover(cloud)`` makes
    the failover that walks ``offers`` (the plan's, in order) with those clouds. Every node
    launched is adopted: its bill opened in ``bills``, a ``launched`` event in ``journal``, a spot
    worker reported to ``watch``; every launch's attempts go to both."""

    def __init__(self, *, cluster_id: str, job_id: str, workers: int, offers: Sequence[Offer], default_site: str,
                 cloud: Callable[[str], Cloud], failover: Callable[[Callable[[str], Cloud]], Failover],
                 bills: Ledger, journal: Journal, watch: MarketWatch, join_timeout_s: float,
                 node_poll_s: float = NODE_POLL_S) -> None:
        self.cluster_id, self.job_id, self.num_workers = cluster_id, job_id, workers
        self.offers, self.default_site = list(offers), default_site
        self.bills, self.journal, self.watch = bills, journal, watch
        self._make_cloud = cloud
        self.clouds: dict[str, Cloud] = {}
        self.failover = failover(self.cloud)
        self.nodes: dict[str, Node] = {}
        self.head: Node | None = None
        self.ending: set[str] = set()          # instance ids we are terminating ourselves
        self.draining: dict[str, float] = {}   # instance id -> drain deadline (a market move)
        self.probing: set[str] = set()         # a spot probe's instance, while the policy is asked
        self.noticed: dict[str, float] = {}    # instance id -> when its cloud takes it (an interruption notice)
        self.prepared: set[tuple[str, str]] = set()
        self.joins = JoinWatch(timeout_s=join_timeout_s)   # workers whose Ray never joined (or left)
        self.dashboard: tuple[str, dict[str, str]] | None = None   # the head's dashboard URL and headers
        self.node_poll_s = node_poll_s
        self.node_polls: dict[str, Every] = {}   # cloud -> its listing cadence (Cloud.list_period_s, else node_poll_s)
        self.upkeep = Every(UPKEEP_S)
        self.join_poll = Every(JOIN_POLL_S)
        self.adopted_at: dict[str, float] = {}   # instance id -> when this run adopted it (the list grace)
        self.listed: set[str] = set()            # instance ids a listing has shown (their grace is over)
        self.list_failures: dict[str, str] = {}  # cloud -> why its last listing failed (while it fails)
        self._alive_before: set[str] = set()     # workers the last dashboard answer listed ALIVE
        # a noticed worker the run ended before its cloud did, and the reason (Recovery.cut_short)
        self.on_cut_short: Callable[[Node, str], None] = lambda node, reason: None

    def cloud(self, name: str) -> Cloud:
        if name not in self.clouds:
            self.clouds[name] = self._make_cloud(name)
        return self.clouds[name]

    # -- launching ----------------------------------------------------------------------------------
    def provision(self, prefer: tuple[str, str] | None = None) -> None:
        """The head, then the workers, walking the plan (every attempt goes into the report).

        The walk crosses regions and clouds in plan order: when every offer of the first site
        answers a capacity error, the cluster comes up on the next site of the plan (another region,
        or another cloud when the task allows several). ``prefer`` = (site, market) puts that
        site's offers of that market first (a migration's target)."""
        offers = self.offers
        if prefer is not None:
            first = [o for o in offers if (site_of(o), o.market.value) == prefer]
            offers = first + [o for o in offers if o not in first]
        attempts: list[Attempt] = []
        try:
            cluster = self.failover.provision(offers, cluster_id=self.cluster_id, job_id=self.job_id,
                                              nodes=self.num_workers, dedicated_head=True, attempts=attempts,
                                              prepare=self.prepare_site)
        finally:
            self._saw(attempts)
        for n in cluster.nodes:
            self.adopt(n)
        self.head = cluster.head

    def prepare_site(self, cloud_name: str, region: str) -> None:
        """What a cluster needs in a site before its first node (once per site and run)."""
        if (cloud_name, region) not in self.prepared:
            self.cloud(cloud_name).prepare_cluster(self.cluster_id, self.job_id, region)
            self.prepared.add((cloud_name, region))

    def add(self, count: int, market: str, *, why: str) -> list[Node]:
        """Up to ``count`` workers on ``market`` next to the head (the failover tries the plan's
        offers of that market in order); never the other market: which market is the policy's call."""
        assert self.head is not None
        offers = [o for o in self.offers if o.market.value == market]
        attempts: list[Attempt] = []
        got = self.failover.add_workers(offers, head=self.head, cluster_id=self.cluster_id,
                                        job_id=self.job_id, count=count, attempts=attempts)
        self._saw(attempts)
        for n in got:
            self.adopt(n)
        if len(got) < count:
            self.journal.event("no_capacity", wanted=count, got=len(got), market=market, why=why)
        return got

    def probe_spot(self, now: float, every_s: float) -> Node | None:
        """On on-demand, with spot last seen unobtainable: ask for one spot worker (every
        ``every_s``, :meth:`MarketWatch.probe_due`). Granted, spot is obtainable again (the policy
        is asked next, and a move to spot keeps it as its first worker: until then it is in
        :attr:`probing`, not a worker); refused, the capacity error says it is still not."""
        if self.current_market() != ON_DEMAND or not self.watch.probe_due(now, every_s):
            return None
        self.watch.probe_asked(now)
        got = self.add(1, SPOT, why="probe: is spot obtainable again?")
        if not got:
            return None
        self.watch.probes["granted"] += 1
        self.probing.add(got[0].instance_id)
        self.journal.event("spot_probe_granted", instance_id=got[0].instance_id)
        return got[0]

    def settle_probe(self, probe: Node | None, *, keep: bool, why: str) -> Node | None:
        """The policy was asked with ``probe`` up (:meth:`probe_spot`): it is no longer a probe. Kept
        (returned) when the policy moves to spot, as the move's first new worker; else (spot is back
        but the policy stays, e.g. a young streak) ended at once, ``why`` in the event: what it found
        stays known, so no more probes until a spot launch fails again."""
        if probe is None:
            return None
        self.probing.discard(probe.instance_id)
        if keep:
            return probe
        self.end([probe], reason="probe")
        self.journal.event("spot_probe_ended", instance_id=probe.instance_id, reason=why)
        return None

    def move(self, market: str, now: float, *, why: str, probe: Node | None = None) -> list[Node] | None:
        """Move the workers to ``market``: launch the new ones (a kept ``probe`` is the first), then
        drain the old ones (:meth:`drain`) and return them — the caller asks the head to drain them.
        When the new market cannot supply them all, the new ones are ended at once and None says
        the move was abandoned (the old ones stay)."""
        kept = [probe] if probe is not None else []
        old = [w for w in self.workers() if w.market != market]
        new = kept + (self.add(len(old) - len(kept), market, why=why) if len(old) > len(kept) else [])
        if kept:
            self.watch.probes["kept"] += 1
        if len(new) < len(old) or any(n.market != market for n in new):
            self.end(new, reason="move abandoned")
            return None
        self.drain(old, now)
        return old

    def adopt(self, node: Node) -> None:
        """A node of ours from now on: billed from its launch — with what its cloud bills besides the
        instance, its disk and public address (:meth:`Cloud.node_charges`) — and in the report."""
        self.nodes[node.instance_id] = node
        self.adopted_at[node.instance_id] = time.time()
        if node.role == "worker" and node.market == SPOT:
            self.watch.saw_spot_worker(node, self.adopted_at[node.instance_id])
        charges = self.cloud(node.cloud).node_charges(node.region, node.market, public_ip=node.extra.get("public_ip"),
                                                      instance_type=node.instance_type)
        self.bills.open(node, charges)
        self.journal.event("launched", instance_id=node.instance_id, role=node.role, market=node.market,
                           usd_per_hour=node.usd_per_hour, zone=node.zone, cloud=node.cloud,
                           price_source=node.extra.get("price_source"),
                           **({"carries": [c.to_dict() for c in charges]} if charges else {}))

    def _saw(self, attempts: list[Attempt]) -> None:
        self.journal.saw_attempts(attempts)
        self.watch.saw_attempts(attempts, time.time())

    # -- what runs ------------------------------------------------------------------------------------
    def workers(self) -> list[Node]:
        """The run's workers: not being drained, not under an interruption notice (their
        replacement is asked for at once: :meth:`notices`), and not a spot probe the policy has
        not taken yet."""
        return [n for n in self.nodes.values() if n.role == "worker" and n.instance_id not in self.draining
                and n.instance_id not in self.probing and n.instance_id not in self.noticed]

    def notices(self, events: list[dict], now: float) -> list[Node]:
        """The workers of ours that training's events (the job's snapshot) say are being drained
        for a notice (``node_draining``, :mod:`spotwise.runtime.node.drains`) and that were not known
        to be: each is under notice from now on (:attr:`noticed`, until it is gone or ended at
        ``deadline_ms``, else ``now`` + its cloud's ``notice_window_s``), so it is no longer one of the :meth:`workers` and
        the next top-up asks for its replacement while it checkpoints and waits out its window.
        Nodes we drain or end ourselves, probes and the head are not noticed here."""
        by_label = {instance_label_value(i): n for i, n in self.nodes.items()}
        new: list[Node] = []
        for ev in events:
            n = by_label.get(str(ev.get("instance"))) if ev.get("event") == "node_draining" else None
            if (n is None or n.role != "worker" or n.instance_id in self.noticed or n.instance_id in self.draining
                    or n.instance_id in self.ending or n.instance_id in self.probing):
                continue
            dl = ev.get("deadline_ms")
            self.noticed[n.instance_id] = (float(dl) / 1000 if isinstance(dl, (int, float)) and dl > 0
                                           else now + (self.cloud(n.cloud).notice_window_s or 0.0))
            new.append(n)
        return new

    def missing(self) -> int:
        return self.num_workers - len(self.workers())

    def overlap(self, market: str, now: float) -> tuple[float, float]:
        """What a replacement on ``market`` asked for now would overlap the noticed workers with:
        (its price per hour, at most: the dearest of the plan's offers of that market at the
        cluster's site; the seconds until the last noticed worker is taken)."""
        site = self.site()
        prices = [o.usd_per_hour for o in self.offers if o.market.value == market and site_of(o) == site]
        return max(prices, default=0.0), max([t - now for t in self.noticed.values()], default=0.0)

    def current_market(self) -> str:
        """The workers' market (the majority's; spot on a tie); ``none`` without workers."""
        ws = self.workers()
        if not ws:
            return NONE
        return SPOT if sum(w.market == "spot" for w in ws) * 2 >= len(ws) else ON_DEMAND

    def site(self) -> str:
        """The site (``cloud/region``) the cluster is in; before it is up, the plan's choice."""
        if self.head is not None:
            return f"{self.head.cloud}/{self.head.region}"
        return self.default_site

    def spot_running(self) -> bool:
        """A spot worker of ours runs (not being ended): spot is obtainable here."""
        return any(w.market == SPOT and w.instance_id not in self.ending for w in self.workers())

    def spot_sites(self) -> set[SiteKey]:
        """Where spot workers of ours run, for the spot record (drained and probing ones too)."""
        return {SiteKey(n.cloud, n.region, n.instance_type) for n in self.nodes.values()
                if n.role == "worker" and n.market == SPOT and n.instance_id not in self.ending}

    # -- what the clouds and Ray report ---------------------------------------------------------------
    def node_poll(self, name: str) -> Every:
        """The listing cadence of cloud ``name``: its own ``list_period_s`` (the local cloud: 1 s),
        else the run's ``node_poll_s``."""
        if name not in self.node_polls:
            self.node_polls[name] = Every(self.cloud(name).list_period_s or self.node_poll_s)
        return self.node_polls[name]

    def poll(self, now: float, on_lost: Callable[[Node], None]) -> bool:
        """List each cloud whose period is due (or at once after :meth:`list_soon`) and hand over
        the nodes it no longer lists (:meth:`sync`). True when any cloud was listed."""
        due = {c for c in {n.cloud for n in self.nodes.values()} if self.node_poll(c).due(now)}
        if due:
            self.sync(on_lost, now, clouds=due)
        return bool(due)

    def list_soon(self) -> None:
        """Make the next :meth:`poll` list every cloud at once (Ray lost a worker: did its cloud?)."""
        for every in self.node_polls.values():
            every.last = float("-inf")

    def sync(self, on_lost: Callable[[Node], None], now: float | None = None, *,
             clouds: set[str] | None = None) -> None:
        """Nodes their cloud (of ``clouds``; None: every one) no longer lists: each is forgotten and
        its bill closed (``ended`` when we were ending it, else ``gone``), and ``on_lost(node)`` is
        called for those we did not end, one at a time (it may raise: the rest wait for the next
        call or the teardown)."""
        for n in self._gone(time.time() if now is None else now, clouds):
            self.nodes.pop(n.instance_id, None)
            self.adopted_at.pop(n.instance_id, None)
            self.listed.discard(n.instance_id)
            self.bills.close(n.instance_id, reason="ended" if n.instance_id in self.ending else "gone")
            try:
                if n.instance_id not in self.ending:
                    on_lost(n)          # under notice still: was_preempted says so
            finally:
                self.noticed.pop(n.instance_id, None)

    def _gone(self, now: float, clouds: set[str] | None) -> list[Node]:
        """Our nodes their cloud no longer lists: one ``list_nodes`` per cloud, in the regions our
        nodes of that cloud are in. A cloud whose listing fails says nothing this time."""
        by_cloud: dict[str, list[Node]] = {}
        for n in self.nodes.values():
            if clouds is None or n.cloud in clouds:
                by_cloud.setdefault(n.cloud, []).append(n)
        gone: list[Node] = []
        for name, nodes in by_cloud.items():
            regions = sorted({n.region for n in nodes})
            try:
                alive = {n.instance_id for n in self.cloud(name).list_nodes(self.cluster_id, regions=regions)}
            except SpotwiseError as e:
                if name not in self.list_failures:
                    self.journal.event("list_failed", cloud=name, regions=regions, message=str(e))
                self.list_failures[name] = str(e)
                log.warning("could not list %s nodes in %s (asked again in %.0f s): %s", name, regions,
                            self.node_poll(name).period_s, e)
                continue
            self.list_failures.pop(name, None)
            lag = self.cloud(name).listing_lag_s
            self.listed |= alive & {n.instance_id for n in nodes}
            gone += [n for n in nodes if n.instance_id not in alive
                     and (n.instance_id in self.ending or n.instance_id in self.listed
                          or now - self.adopted_at.get(n.instance_id, 0.0) >= lag)]
        return gone

    def was_preempted(self, node: Node) -> bool:
        """Did its cloud reclaim it (spot, after a notice), rather than lose it? A worker gone while
        under its interruption notice (:attr:`noticed`) is the preemption that notice announced,
        whatever its cloud's account of it (a Slurm job that ended itself once the notice's
        checkpoint was committed reads CANCELLED)."""
        return node.instance_id in self.noticed or self.cloud(node.cloud).was_preempted(node)

    def end_remains(self, node: Node) -> None:
        """End whatever is left of a node that went away (logged when the cloud refuses)."""
        try:
            self.cloud(node.cloud).terminate([node])
        except SpotwiseError as e:
            log.warning("could not end what is left of %s: %s", node.instance_id, e)

    def check_joins(self, now: float, on_ended: Callable[[Overdue], None]) -> None:
        """End the workers whose Ray has not been ALIVE in the cluster for the join timeout
        (:mod:`spotwise.engine.run.joins`; only a complete answer of the head's dashboard counts) and
        call ``on_ended`` for each; one the cloud refuses to end stays ours and is tried again."""
        if self.dashboard is None:
            return
        alive = alive_instances(*self.dashboard)
        if alive is not None:
            mine = {instance_label_value(i) for i in self.nodes}
            if (self._alive_before - set(alive)) & mine:
                self.list_soon()          # Ray lost a worker of ours: does its cloud still list it?
            self._alive_before = set(alive)
        self.joins.seen(alive, now)
        for o in self.joins.overdue(list(self.nodes.values()), now, exclude={*self.draining, *self.ending, *self.noticed}):
            n = o.node
            try:
                self.end([n], reason="not joined")
            except SpotwiseError as e:    # still ours and still overdue: tried again at the next poll
                self.ending.discard(n.instance_id)
                log.warning("could not end %s, whose Ray is not in the cluster: %s", n.instance_id, e)
                continue
            on_ended(o)

    def observe(self, snapshot: dict) -> None:
        """What the head's cloud makes of training's progress (the local market: its notices), as
        events in the journal."""
        for ev in self.cloud(self.head.cloud).observe(self.cluster_id, snapshot) if self.head else []:
            kind = ev.pop("event")
            self.journal.event(kind, **ev)

    def endpoint(self) -> tuple[HeadEndpoint, float | None]:
        """The head's endpoint and its cloud's interruption notice window."""
        assert self.head is not None
        cloud = self.cloud(self.head.cloud)
        return cloud.endpoint(self.cluster_id, self.head), cloud.notice_window_s

    # -- ending -----------------------------------------------------------------------------------------
    def drain(self, nodes: list[Node], now: float) -> None:
        """These nodes are being drained (a market move): no longer workers; ended at the deadline,
        or once a just-in-time checkpoint is committed (:meth:`finish_drains`)."""
        for n in nodes:
            self.draining[n.instance_id] = now + DRAIN_DEADLINE_S

    def finish_drains(self, now: float, checkpoints: list[dict]) -> None:
        """End the drained nodes whose deadline passed, or all of them once training committed a
        preemption checkpoint after the drain began (``checkpoints``: the job's, newest last)."""
        if not self.draining:
            return
        first = min(self.draining.values()) - DRAIN_DEADLINE_S
        ckpt_after = any(c.get("t", 0) >= first and c.get("kind") == "preemption" for c in checkpoints)
        due = [iid for iid, t in self.draining.items() if ckpt_after or now >= t]
        nodes = [self.nodes[i] for i in due if i in self.nodes]
        for iid in due:
            self.draining.pop(iid, None)
        self.end(nodes, reason="moved")

    def end(self, nodes: list[Node], *, reason: str) -> None:
        """Terminate ``nodes`` (one call per cloud) and close their bills with ``reason``; a worker
        still under its notice among them, unless ``reason`` is one of :data:`OWN_ENDS`, is a
        preemption: billed to ``preempted (REASON)`` and handed to :attr:`on_cut_short`."""
        cut = {n.instance_id for n in nodes if n.instance_id in self.noticed and reason not in OWN_ENDS}
        by_cloud: dict[str, list[Node]] = {}
        for n in nodes:
            self.ending.add(n.instance_id)
            by_cloud.setdefault(n.cloud, []).append(n)
        for name, ns in by_cloud.items():
            self.cloud(name).terminate(ns)
        for n in nodes:
            self.nodes.pop(n.instance_id, None)
            self.adopted_at.pop(n.instance_id, None)
            self.listed.discard(n.instance_id)
            self.noticed.pop(n.instance_id, None)
            self.bills.close(n.instance_id, reason=f"preempted ({reason})" if n.instance_id in cut else reason)
        for n in nodes:
            if n.instance_id in cut:
                self.on_cut_short(n, reason)

    def end_all(self, reason: str) -> None:
        self.end(list(self.nodes.values()), reason=reason)

    def teardown(self) -> None:
        """End every node of the cluster on every cloud used — the ones the cloud lists and the
        ones we know of — close every bill, and delete what the cluster shared (each step tried
        even when another fails: ``gc`` and the nodes' dead man's switch end what is left)."""
        for name, cloud in list(self.clouds.items()):
            regions = sorted({r for c, r in self.prepared if c == name} | {n.region for n in self.nodes.values()
                                                                             if n.cloud == name})
            try:
                live = cloud.list_nodes(self.cluster_id, regions=regions)
            except SpotwiseError as e:
                log.error("could not list %s nodes of %s (gc will end them): %s", name, self.cluster_id, e)
                live = []
            mine = [n for n in self.nodes.values() if n.cloud == name]
            ids = {n.instance_id for n in live}
            everything = live + [n for n in mine if n.instance_id not in ids]
            try:
                if everything:
                    cloud.terminate(everything)
            except SpotwiseError as e:
                log.error("could not end %d %s node(s) (gc will): %s", len(everything), name, e)
            for n in everything:
                self.bills.close(n.instance_id, reason="teardown")
            try:
                for what in cloud.cleanup_cluster(self.cluster_id):
                    self.journal.event("deleted", what=what)
            except SpotwiseError as e:
                log.error("cleanup of %s on %s failed (gc will retry): %s", self.cluster_id, name, e)
        self.bills.close_all()
        self.nodes.clear()

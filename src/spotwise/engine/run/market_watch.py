"""What a run has seen of capacity: the evidence its decisions about spot rest on.

A live run learns whether spot is obtainable only by asking for it, so every piece of evidence is
something the run itself did or saw: a launch granted or refused for capacity (the failover's
:class:`~spotwise.provisioner.failover.Attempt`), a spot worker of ours running, or one preempted.
:class:`MarketWatch` keeps that evidence and answers three questions from it — is spot obtainable
in a site (:meth:`MarketWatch.availability`), did a site just refuse a market
(:meth:`MarketWatch.blocked`), is a spot probe due (:meth:`MarketWatch.probe_due`) — and writes
one line per policy tick for later runs (:meth:`MarketWatch.record_tick`,
:mod:`spotwise.engine.state.spot_log`).

Pure bookkeeping, like :class:`~spotwise.engine.run.joins.JoinWatch`: it launches nothing, the time
is always passed in, and the nodes it is told about are the caller's (the orchestrator chooses
which nodes count as evidence; see :meth:`MarketWatch.availability`).

Also here: what the policy is shown of the zone *before* the run (:func:`show_history`, the task's
file; :func:`show_recorded_history`, what earlier runs recorded) — the same evidence, from the past.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from spotwise.engine.plan.planner import Plan
from spotwise.engine.state.spot_log import DOWN, UP, SiteKey, SpotLog, recorded_history
from spotwise.errors import InputError
from spotwise.policies.base import ON_DEMAND, SPOT, Policy
from spotwise.pricing.offer import Offer
from spotwise.provisioner.base import Node
from spotwise.provisioner.failover import Attempt
from spotwise.taskspec import TaskSpec, load_history

log = logging.getLogger("spotwise.orchestrator")

RETRY_SPOT_S = 10.0     # after a spot launch found no capacity, wait this long before asking again
SITE_MEMORY_S = 60.0    # a site's capacity error counts as "no capacity there" this long


def site_of(offer: Offer) -> str:
    """The site a Ray cluster on ``offer`` lives in: ``cloud/region``."""
    return f"{offer.cloud}/{offer.region}"


def history_key(plan: Plan) -> SiteKey:
    """Whose recorded history the policy is shown: the plan's best spot offer in the chosen site
    (the chosen offer itself when that site has no spot offer)."""
    site = site_of(plan.chosen.offer)
    spot = [o for o in plan.offers if site_of(o) == site and o.market.value == SPOT]
    o = spot[0] if spot else plan.chosen.offer
    return SiteKey(o.cloud, o.region, o.instance_type)


def show_history(policy: Policy, spec: TaskSpec) -> bool:
    """Show ``policy`` the zone's availability before the run (the task's ``spot_history`` trace);
    True if it was shown. The file was checked when the task was loaded; one unreadable now (a
    resumed job whose file is gone) is logged and the run goes on without it: it is only a hint."""
    if not spec.spot_history:
        return False
    try:
        trace = load_history(spec.spot_history)
    except InputError as e:
        log.warning("spot_history not shown to the policy: %s", e)
        return False
    policy.observe_history(trace.data, trace.tick_h)
    return True


def show_recorded_history(policy: Policy, key: SiteKey, *, hours: float, tick_s: float,
                          now: float | None = None) -> dict | None:
    """Show ``policy`` what earlier runs recorded of spot at ``key`` over the last ``hours``
    (:mod:`spotwise.engine.state.spot_log`); what was shown (for the report), or None when nothing was
    recorded there. A database error is logged and the run goes on without it: it is only a hint."""
    if hours <= 0:
        return None
    try:
        hist = recorded_history(key, now=time.time() if now is None else now, hours=hours, tick_s=tick_s)
    except Exception as e:  # noqa: BLE001 - a hint: the run does not depend on it
        log.warning("recorded spot history at %s not shown to the policy: %s", key, e)
        return None
    known = int((hist >= 0).sum())
    if known == 0:
        return None
    policy.observe_history(hist, tick_s / 3600)
    return {"source": "recorded", "site": str(key), "hours": hours, "tick_s": tick_s, "known_ticks": known,
            "obtainable_share": round(float((hist == UP).sum()) / known, 4)}


def run_history(policy: Policy, spec: TaskSpec, plan: Plan, *, tick_s: float) -> dict | None:
    """Show ``policy`` the zone's history before the run: the task's ``spot_history`` file when it
    names one (:func:`show_history`), else what earlier runs recorded at the plan's site
    (:func:`show_recorded_history`, over ``spot_history_hours``). What was shown, for the report."""
    if show_history(policy, spec):
        return {"source": "file", "path": spec.spot_history}
    return show_recorded_history(policy, history_key(plan), hours=spec.spot_history_hours, tick_s=tick_s)


@dataclass
class MarketWatch:
    """The run's evidence of capacity, per site and market.

    Contract:
      * :meth:`saw_attempts` takes every attempt of a launch (provisioning, a replacement, a move,
        a probe). A spot offer refused for capacity (``capacity``, or ``cached``: the failover still
        remembers a refusal) makes spot "last seen unobtainable" and marks that (site, instance
        type); an on-demand one marks its site. Launched or other outcomes change nothing here.
      * :meth:`saw_spot_worker` (a spot worker of ours launched) and :meth:`saw_spot_lost` (one was
        preempted) are the other evidence; the caller says whether another spot worker still runs.
        A spot worker granted at a site after a capacity error there (another zone of the region:
        EC2 Fleet walks them) ends that error's block: spot was obtainable there since.
      * Every answer is for the ``now`` passed in; nothing reads the clock.
    """

    offers: Mapping[str, Offer]          # the plan's offers by key: an attempt's site and instance type
    log: SpotLog                         # what this run writes down for later ones
    # what was last seen of spot in the run's site (one site): True a spot worker launched or ran,
    # False a spot launch met a capacity error or the last spot worker was preempted; None nothing yet
    spot_seen: bool | None = None
    last_spot_failure_t: float = 0.0
    spot_fail_t: dict[SiteKey, float] = field(default_factory=dict)   # last spot capacity error there
    od_fail_t: dict[str, float] = field(default_factory=dict)         # site -> last on-demand one
    spot_lost_t: dict[SiteKey, float] = field(default_factory=dict)   # a spot worker preempted there (newest)
    spot_ok_t: dict[SiteKey, float] = field(default_factory=dict)     # a spot worker granted there (newest)
    last_probe_t: float = 0.0
    probes: dict[str, int] = field(default_factory=lambda: {"asked": 0, "granted": 0, "kept": 0})

    # -- evidence ------------------------------------------------------------------------------
    def saw_attempts(self, attempts: Iterable[Attempt], now: float) -> None:
        for a in attempts:
            if a.outcome not in ("capacity", "cached"):
                continue
            offer = self.offers.get(a.offer_key)
            if a.offer_key.endswith("/spot"):
                # spot counts as unobtainable while any spot offer of ours is out of capacity
                self.last_spot_failure_t = now
                self.spot_seen = False
                if offer is not None:
                    self.spot_fail_t[SiteKey(offer.cloud, offer.region, offer.instance_type)] = now
            elif offer is not None:
                self.od_fail_t[site_of(offer)] = now

    def saw_spot_worker(self, node: Node | None = None, now: float | None = None) -> None:
        """A spot worker of ours launched (or runs): spot is obtainable (at ``node``'s site, as of
        ``now``, when given: a capacity error there before it no longer blocks the site)."""
        self.spot_seen = True
        if node is not None and now is not None:
            self.spot_ok_t[SiteKey(node.cloud, node.region, node.instance_type)] = now

    def saw_spot_lost(self, node: Node, now: float, *, spot_left: bool) -> None:
        """A spot worker was preempted; ``spot_left``: another spot worker of ours still runs."""
        self.spot_lost_t[SiteKey(node.cloud, node.region, node.instance_type)] = now
        if not spot_left:
            self.spot_seen = False

    # -- answers -------------------------------------------------------------------------------
    def spot_refused(self, now: float) -> bool:
        """A spot launch found no capacity within :data:`RETRY_SPOT_S`: do not ask again yet."""
        return now - self.last_spot_failure_t < RETRY_SPOT_S

    def blocked(self, site: str, market: str, now: float) -> bool:
        """Did ``site`` answer a capacity error for ``market`` within :data:`SITE_MEMORY_S` (for
        spot: for any instance type there, not followed by a spot worker of that type granted there)?"""
        if market == SPOT:
            last = max((t for k, t in self.spot_fail_t.items()
                        if k.site == site and t > self.spot_ok_t.get(k, float("-inf"))), default=0.0)
        else:
            last = self.od_fail_t.get(site, 0.0)
        return now - last < SITE_MEMORY_S

    def blocked_pairs(self, sites: Iterable[str], now: float) -> frozenset[tuple[str, str]]:
        """Every (site, market) of ``sites`` that is :meth:`blocked` at ``now``."""
        return frozenset((st, m) for st in sites for m in (SPOT, ON_DEMAND) if self.blocked(st, m, now))

    def availability(self, sites: list[str], now: float, *, spot_running: bool) -> dict[str, bool]:
        """Site -> spot obtainable now, as far as this run has seen.

        One site: what was seen last (:attr:`spot_seen`): obtainable while a spot worker of ours
        runs (``spot_running``, the caller's count: workers not being ended) or since one was
        granted; not obtainable since a spot launch met a capacity error or the last spot worker
        was preempted, until a launch is granted again (a replacement, a move, or a probe while on
        on-demand); obtainable before anything was seen. A run on on-demand has no other way to
        know: the simulator shows a policy the truth every tick, and saying "obtainable" for want
        of evidence made a live policy's spell statistics up (bench/bench_policy_live_signal.py).
        Several sites: no spot capacity error there within :data:`SITE_MEMORY_S`."""
        if len(sites) > 1:
            return {st: not self.blocked(st, SPOT, now) for st in sites}
        return {sites[0]: spot_running or self.spot_seen is not False}

    def probe_due(self, now: float, every_s: float) -> bool:
        """The evidence side of a spot probe: spot was last seen unobtainable, no probe within
        ``every_s`` and no refusal within :data:`RETRY_SPOT_S`. (Whether the run may probe at
        all — one site, a market the policy chooses, on on-demand, not stopping — is the caller's.)"""
        return (self.spot_seen is False and now - self.last_probe_t >= every_s
                and not self.spot_refused(now))

    def probe_asked(self, now: float) -> None:
        self.last_probe_t = now
        self.probes["asked"] += 1

    # -- for later runs ----------------------------------------------------------------------------
    def record_tick(self, now: float, running: set[SiteKey]) -> None:
        """This tick's evidence of spot per (site, instance type), for later runs there
        (:mod:`spotwise.engine.state.spot_log`): obtainable where a spot worker of ours runs
        (``running``, the caller's: spot workers not being ended, drained or probing ones
        included); not where none does and a spot launch there met a capacity error within
        :data:`SITE_MEMORY_S` or a spot worker there was preempted since the last tick; nothing
        written elsewhere."""
        since = now - self.log.tick_s
        down = ({k for k, t in self.spot_fail_t.items() if now - t < SITE_MEMORY_S}
                | {k for k, t in self.spot_lost_t.items() if t >= since})
        for key in running | down | set(self.log.open_keys()):
            self.log.observe(key, UP if key in running else DOWN if key in down else None, now)

    def close(self) -> None:
        """Write the open stretches' ends (the run is over); logs its own write errors."""
        self.log.close()

"""Where the run should be: the policy's answers turned into one command, with no side effects.

The orchestrator takes a :class:`View` — a frozen snapshot of the run (the policy's
:class:`~spotwise.policies.base.Observation` plus what only the orchestrator knows: its site, its
workers' markets, which sites just refused which market) — and :class:`Steering` answers with a
command: :class:`TopUp`, :class:`Wait`, :class:`MarketMove`, :class:`Migrate` or :class:`NoOp`.
Acting on it (launching, draining, moving) is the orchestrator's. So every rule here can be tested
on a recorded view, and the order of the rules is visible in one place.

The order (Karpenter's disruption methods, tried in priority order): the budget is not here — a
stopping run is never steered (``View.stopping``) — then a *capacity migration* (workers missing and
this site out of the market the run needs), then the *policy*, which may name another site (a
*policy migration*, when the saving on the work left pays for the move) or another market (a
*market move*, or the market of a *top-up*).

A worker under an interruption notice (issue 51) is missing — its replacement is asked for at
the notice — but still up, checkpointing and waiting out its window. While every missing worker
is such a one (``View.noticed``), :meth:`Steering.replace` never moves the whole job: a move it
would make becomes a :class:`Wait` that says why, and a site's capacity error is no reason for
:meth:`Steering.consult` to move either (a move that pays still may). The replacement meanwhile
walks the plan's offers of its market at the site, as the failover does; when none has capacity
the run waits for the noticed node as it did before issue 51, and once its cloud has taken it (a
preemption, counted) the same capacity error moves the job as it always did (the site's refusal
is remembered for ``SITE_MEMORY_S``). Why not move at once: the noticed node has not finished its
just-in-time checkpoint, and a move with a worker missing stops training at once; the notice may
pass without a preemption (a rebalance recommendation, a cancelled event), and the job would
have left a site that still runs it; and a move ends the noticed node itself, so that its
preemption was never seen (the emulated AWS e2e, 2026-12-06: ``preemptions`` 0).

Stateful only in :attr:`Steering.waiting` (a "waiting" event is announced once per wait) and in
the policy, which is stateful across ticks by design: :meth:`Steering.replace` and
:meth:`Steering.consult` each call ``policy.decide`` at most once, exactly where the orchestrator
always did.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from spotwise.engine.run.cadence import Every
from spotwise.engine.run.market_watch import SITE_MEMORY_S, site_of
from spotwise.policies.base import NONE, ON_DEMAND, SPOT, Decision, Observation, Policy
from spotwise.pricing.offer import Offer
from spotwise.taskspec import TaskSpec

MAX_MIGRATIONS = 3             # whole-job moves to another region/cloud per run
MIN_MOVE_RESTART_H = 5 / 60    # a move's restart (new cluster boot + resume) when none was measured yet


@dataclass(frozen=True, slots=True, kw_only=True)
class View:
    """The run as the orchestrator sees it when the policy is asked."""

    obs: Observation                     # what the policy is shown (prices per site, spot availability, ...)
    here: str                            # the site (``cloud/region``) the cluster is in
    sites: tuple[str, ...]               # every site of the plan
    missing: int                         # workers the run lacks
    current: str                         # the running workers' market (spot | on-demand | none)
    worker_markets: tuple[str, ...]      # each running worker's market (not draining, not a probe)
    fixed_market: str | None             # the task's market when it fixes one; None: the policy chooses
    blocked: frozenset[tuple[str, str]]  # (site, market) that answered a capacity error within SITE_MEMORY_S
    spot_refused: bool                   # a spot launch found no capacity within RETRY_SPOT_S
    stopping: bool                       # a stop (budget, cancel, move) is under way
    draining: bool                       # a market move's old workers are being drained
    migrations: int                      # whole-job moves so far
    cluster_up: bool                     # the cluster has a head
    noticed: int = 0                     # of the missing: workers still up under an interruption notice


@dataclass(frozen=True, slots=True)
class NoOp:
    """Nothing to do this time."""


@dataclass(frozen=True, slots=True)
class Wait:
    """Workers are missing and the policy says wait (spot unobtainable, the deadline allows it);
    ``announce``: the first tick of this wait (the orchestrator sends one "waiting" event)."""

    missing: int
    reason: str
    announce: bool


@dataclass(frozen=True, slots=True)
class TopUp:
    """Launch ``count`` workers on ``market`` next to the head."""

    count: int
    market: str
    reason: str


@dataclass(frozen=True, slots=True)
class MarketMove:
    """Move the workers from ``frm`` to ``to``: launch the new ones, drain the old ones."""

    frm: str
    to: str
    reason: str


@dataclass(frozen=True, slots=True)
class Migrate:
    """Move the whole job to ``target`` (another region or cloud) on ``market``."""

    target: str
    market: str
    reason: str


Command = NoOp | Wait | TopUp | MarketMove | Migrate


def site_prices(obs: Observation, market: str) -> dict[str, float]:
    """The observation's whole-cluster price per site for ``market``."""
    return obs.spot_price if market == SPOT else obs.on_demand_price


def transfer_read_usd(storage: str, spec: TaskSpec, site: str, stores: Mapping[str, str] | None = None) -> float:
    """What bringing one checkpoint of ``spec``'s model from ``storage`` (where it lies) to a
    cluster in ``site`` costs: read from there; or, where the run gives ``site``'s cloud another
    store (``stores``: cloud -> URI), copied into that store first and read from it
    (:mod:`spotwise.engine.run.run_stores`)."""
    from spotwise.pricing.egress import Site, checkpoint_gb, copy_usd, storage_site, transfer_rate
    from spotwise.pricing.estimate import params_from_taskspec

    cloud_name, _, region = site.partition("/")
    there = (stores or {}).get(cloud_name, storage)
    rate = transfer_rate(storage_site(there), Site(cloud_name, region))
    gb = checkpoint_gb(params_from_taskspec(spec)[0])
    return copy_usd(storage, there, gb) + rate.usd_per_gb * gb


def cluster_prices(offers: Sequence[Offer], sites: Sequence[str], workers: int) -> dict[str, dict[str, float]]:
    """Market -> site -> the cheapest whole-cluster (workers) price per hour among ``offers`` there."""
    prices: dict[str, dict[str, float]] = {SPOT: {}, ON_DEMAND: {}}
    for o in offers:
        st = site_of(o)
        if st in sites:
            cur = prices[o.market.value].get(st)
            rate = o.usd_per_hour * workers
            prices[o.market.value][st] = rate if cur is None else min(cur, rate)
    return prices


@dataclass
class Steering:
    """The policy, asked at the two moments the run has a choice: when workers are missing
    (:meth:`replace`, every node check) and every ``interval_s`` (:meth:`consult`).

    ``transfer_read_usd(site)``: what reading one checkpoint from ``site`` costs (a migration's
    cost besides the restart); injected, so the rules are testable without a price table.
    """

    policy: Policy
    policy_name: str
    transfer_read_usd: Callable[[str], float]
    interval_s: float = 5.0              # the policy is consulted this often (``LaunchOptions.policy_interval_s``)
    waiting: bool = False                # a Wait was announced and no worker has launched since

    def __post_init__(self) -> None:
        self.policy_poll = Every(self.interval_s)

    def why(self, decision: Decision, default: str | None = None) -> str:
        """The decision's own reason, else ``policy P chose M`` (or ``default``)."""
        return str(getattr(decision, "reason", "") or "") or default or \
            f"policy {self.policy_name} chose {decision.market}"

    # -- the two questions ------------------------------------------------------------------------
    def replace(self, view: View) -> Command:
        """Where missing workers' replacements go now; nothing missing: :class:`NoOp` (and a wait
        is over).

        A capacity migration first (before the policy is asked); a task fixed on spot that was
        just refused waits without asking; then the policy: another site (a policy migration), or
        the market of the replacements — its ``none`` is a :class:`Wait` while spot was just
        refused and spot again otherwise (the market fixed by the task, if any, wins). No move while
        every missing worker is still up under a notice (the module docstring): a :class:`Wait`
        that says why, announced once."""
        if view.missing <= 0:
            self.waiting = False
            return NoOp()
        cmd = self._replace(view)
        if isinstance(cmd, Migrate) and view.missing <= view.noticed:
            announce, self.waiting = not self.waiting, True
            return Wait(view.missing, f"the {view.missing} worker(s) missing still run out an interruption notice: "
                                      f"the job does not move before they are gone ({cmd.reason})", announce)
        return cmd

    def _replace(self, view: View) -> Command:
        move = self._capacity_move(view)
        if move is not None:
            return move
        if view.spot_refused and view.fixed_market == SPOT:
            return NoOp()
        decision = self.policy.decide(view.obs)
        move = self._policy_move(view, decision)
        if move is not None:
            return move
        market = view.fixed_market or decision.market
        if market == NONE:
            if view.spot_refused:
                announce, self.waiting = not self.waiting, True
                return Wait(view.missing, self.why(decision, f"policy {self.policy_name}: spot unobtainable, "
                                                             "deadline still allows waiting"), announce)
            market = SPOT                                   # try spot again
        return TopUp(view.missing, market, self.why(decision, f"policy {self.policy_name} chose {market}"))

    def consult(self, view: View) -> tuple[Decision, Command]:
        """The periodic question (task ``market: auto``, training started, no move under way):
        the policy's decision, and a :class:`Migrate` (another site that pays), a
        :class:`MarketMove` (workers on another market than it chose), or :class:`NoOp`."""
        decision = self.policy.decide(view.obs)
        target = decision.market
        move = self._policy_move(view, decision) if self._can_migrate(view) else None
        if move is not None:
            return decision, move
        old = sum(m != target for m in view.worker_markets)
        if target == NONE or not old or view.current == NONE:
            return decision, NoOp()
        if target == SPOT and view.spot_refused:
            return decision, NoOp()
        return decision, MarketMove(view.current, target, self.why(decision))

    # -- whole-job moves ---------------------------------------------------------------------------
    def _can_migrate(self, view: View) -> bool:
        """Several sites, a cluster up, moves left, and no stop or market move under way."""
        return (len(view.sites) >= 2 and not view.stopping and not view.draining
                and view.migrations < MAX_MIGRATIONS and view.cluster_up)

    def _capacity_move(self, view: View) -> Migrate | None:
        """Workers are missing and this site is out of the market the run needs (the task's, or
        both markets when the policy chooses): the cheapest other site not known to be out of it."""
        if not self._can_migrate(view):
            return None
        here, missing, fixed = view.here, view.missing, view.fixed_market
        market = fixed or (SPOT if view.current != ON_DEMAND else ON_DEMAND)
        if missing <= 0 or (here, market) not in view.blocked:
            return None
        if fixed is None and (here, ON_DEMAND) not in view.blocked:
            return None               # the policy may still choose on-demand here
        prices = site_prices(view.obs, market)
        targets = [st for st in view.sites if st != here and (st, market) not in view.blocked and st in prices]
        if not targets:
            return None
        target = min(targets, key=lambda st: prices[st])
        return Migrate(target, market, f"{here} has no {market} capacity (capacity error within {SITE_MEMORY_S:.0f} s) "
                                       f"and {missing} worker(s) are missing: moving to {target}, the cheapest site "
                                       f"left (${prices[target]:.4f}/h)")

    def _policy_move(self, view: View, decision: Decision) -> Migrate | None:
        """The policy names another site of the plan, in a market the task allows, and either this
        site is out of that market with workers missing (gone, not just under a notice) or the move
        pays (:meth:`_move_pays`)."""
        if not self._can_migrate(view):
            return None
        here = view.here
        target, market = decision.region, decision.market
        if target is None or target == here or target not in view.sites or market == NONE:
            return None
        if view.fixed_market is not None and market != view.fixed_market:
            return None
        if target not in site_prices(view.obs, market):
            return None
        if view.missing > view.noticed and (here, market) in view.blocked:
            return Migrate(target, market, self.why(decision, f"policy {self.policy_name} chose {market} in {target}"))
        why = self._move_pays(view, target, market)
        return None if why is None else Migrate(target, market, why)

    def _move_pays(self, view: View, target: str, market: str) -> str | None:
        """Why moving to ``target`` pays — the saving on the work left beats one restart of the
        cluster there and one checkpoint read across — or None when it does not."""
        obs, here = view.obs, view.here
        price = site_prices(obs, market)[target]
        here_rate = min(obs.spot_price.get(here, math.inf) if view.current == SPOT else math.inf,
                        obs.on_demand_price.get(here, math.inf))
        move_h = max(obs.restart_h, MIN_MOVE_RESTART_H)
        cost = move_h * price + self.transfer_read_usd(target)
        saving = (here_rate - price) * obs.work_left_h
        if not saving > cost:
            return None
        return (f"policy {self.policy_name}: {target} {market} at ${price:.4f}/h saves "
                f"${saving:.4f} on {obs.work_left_h:.3g} h left, more than the move costs (${cost:.4f})")

"""Plan a run: every offer that fits the task, ranked by the estimator's expected total cost.

The plan is what ``spotwise launch --dry-run`` prints and what the orchestrator walks: the first
offer is where the run starts, the rest are the fallbacks (capacity errors, replacements, a move
between markets) in order. Planning needs no cloud credentials: real clouds' offers come from the
price catalog (snapshot + live cache), the local cloud prices itself.

Expected total cost of an offer = (workers x offer price + the head's price + what the cluster's
nodes carry) x expected hours, where what a node carries is what its cloud bills besides the
instance — its boot disk and public IPv4 address at their published prices
(:mod:`spotwise.pricing.attached`, :meth:`Cloud.node_charges`) — and expected hours include spot
risk (interruptions, restarts, lost work; see :mod:`spotwise.pricing.estimate`). Offers whose expected cost passes the task's budget, or whose
deadline-miss probability is over one half, rank after all that fit, and say why. An offer
away from the checkpoint store (another region or cloud) also pays for the checkpoints that cross:
every periodic checkpoint written there and one read per expected resume, at the transfer price of
the cloud the bytes leave (:mod:`spotwise.pricing.egress`) — so a move between clouds is chosen
only when it is cheaper with its traffic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spotwise.errors import InputError, Problem
from spotwise.pricing.egress import Site
from spotwise.pricing.offer import Market, Offer
from spotwise.taskspec import TaskSpec

CPU_STEP_SECONDS = 0.3      # the built-in model's pace on one local CPU node (assumed; measured ~0.2-0.5 s)


@dataclass(slots=True, kw_only=True)
class PlannedOffer:
    offer: Offer
    expected_hours: float
    expected_cost_usd: float
    head_usd_per_hour: float
    p_deadline_miss: float | None = None
    transfer_usd: float = 0.0          # checkpoints crossing between the cluster and the store (in the cost)
    carried_usd_per_hour: float = 0.0  # the cluster's disks and public addresses, per hour (head + workers)
    carried_usd: float = 0.0           # the same over the expected hours (in the cost)
    carried: list[dict] = field(default_factory=list)   # one worker's charges (Charge.to_dict), for the reader
    notes: list[str] = field(default_factory=list)
    over_budget: bool = False          # its expected cost passes the budget (ranks after every offer that fits)
    late: bool = False                 # more likely than not to miss the deadline (ranks after those that fit)
    queue: str | None = None           # a Slurm partition's queue: jobs ahead, Slurm's start estimate

    @property
    def fits(self) -> bool:
        return not (self.over_budget or self.late)

    @property
    def site(self) -> str:
        """Where a Ray cluster on this offer lives: ``cloud/region``."""
        return f"{self.offer.cloud}/{self.offer.region}"

    def to_dict(self) -> dict:
        return {**self.offer.to_dict(), "expected_hours": self.expected_hours,
                "expected_cost_usd": self.expected_cost_usd, "head_usd_per_hour": self.head_usd_per_hour,
                "transfer_usd": round(self.transfer_usd, 6),
                "carried_usd_per_hour": round(self.carried_usd_per_hour, 6), "carried_usd": round(self.carried_usd, 6),
                "carried_per_worker": list(self.carried),
                "p_deadline_miss": self.p_deadline_miss, "notes": list(self.notes), "queue": self.queue}


@dataclass(slots=True, kw_only=True)
class Plan:
    ranked: list[PlannedOffer]
    reason: str
    clouds: list[str]
    #: sites (``cloud/region``) with offers that fit but that a run cannot use as the clouds are
    #: configured, with why (:mod:`spotwise.provisioner.sites`): not ranked, never attempted
    not_ranked: dict[str, str] = field(default_factory=dict)
    #: offers (by key) the task cannot run on at their world size, with why
    #: (:mod:`spotwise.engine.plan.ranks`): a batch the ranks do not divide, a rank its GPU cannot hold
    not_planned: dict[str, str] = field(default_factory=dict)

    @property
    def chosen(self) -> PlannedOffer:
        return self.ranked[0]

    @property
    def offers(self) -> list[Offer]:
        return [p.offer for p in self.ranked]

    def to_dict(self, limit: int | None = None) -> dict:
        fb = self.ranked[1:] if limit is None else self.ranked[1:1 + limit]
        return {"chosen": self.chosen.to_dict(), "fallbacks": [p.to_dict() for p in fb],
                "reason": self.reason, "clouds": self.clouds, "offers_considered": len(self.ranked),
                "sites_not_ranked": dict(self.not_ranked), "offers_not_planned": dict(self.not_planned),
                "highlights": [{**h, "offer": h["offer"].to_dict() if h["offer"] else None}
                               for h in self.highlights()]}

    def lines(self, *, title: str, width: int = 80, fallbacks: int = 10) -> list[str]:
        """The plan as a user reads it in a ``width``-column terminal (``launch --dry-run``): the
        highlights (:meth:`highlights`) with why each ranks where it does, then the next
        ``fallbacks`` offers, one line each, with each price's source as a short reference
        (``[1]``) listed once at the end. No line is wider than ``width``; ``--format json``
        (:meth:`to_dict`) keeps every field whole."""
        import textwrap

        refs: dict[str, int] = {}

        def ref(p: PlannedOffer) -> str:
            return cite(p.offer.source, p.offer.as_of)

        def cite(source: str, as_of: str) -> str:
            return f"[{refs.setdefault(f'{source} (as of {as_of})', len(refs) + 1)}]"

        def offer_line(rank: int, p: PlannedOffer) -> str:
            o = p.offer
            cost = f"${p.expected_cost_usd:,.2f}" if math.isfinite(p.expected_cost_usd) else "n/a"
            return (f"#{rank} {o.cloud} {o.instance_type} {o.market.value} {o.zone or o.region} "
                    f"${o.usd_per_hour:g}/h {cost} {ref(p)}" + (f"; {p.queue}" if p.queue else ""))

        def wrap(text: str, indent: str = "") -> list[str]:
            return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "    ") or [""]

        out = wrap(f"{title}: {len(self.ranked)} offers on {', '.join(self.clouds)}, ranked by expected "
                   "total cost (workers + head, disks and addresses, spot risk, checkpoint transfer)")
        for h in self.highlights():
            p = h["offer"]
            out += wrap(f"{h['label']}: " + (offer_line(h["rank"], p) if p is not None else "none"))
            out += wrap(h["why"], "  ")
            if p is not None and p.carried:
                out += wrap("each worker carries: " + ", ".join(
                    f"{c['what']} ${c['usd_per_hour']:g}/h {cite(c['source'], c['as_of'])}" for c in p.carried), "  ")
        shown = {id(h["offer"]) for h in self.highlights()}
        rest = [(i + 1, p) for i, p in enumerate(self.ranked) if id(p) not in shown][:fallbacks]
        if rest:
            out.append(f"next {len(rest)} of {len(self.ranked) - len(shown)} fallbacks:")
            for rank, p in rest:
                out += wrap(offer_line(rank, p), "  ")
        if self.not_ranked:
            out += wrap(f"not ranked, unusable as configured: {', '.join(self.not_ranked)}")
            for site, why in list(self.not_ranked.items())[:NOT_RANKED_SHOWN]:
                out += wrap(f"{site}: {why.removeprefix(site + ':').strip()}", "  ")
            if len(self.not_ranked) > NOT_RANKED_SHOWN:
                out += wrap(f"and {len(self.not_ranked) - NOT_RANKED_SHOWN} more (why: --format json)", "  ")
        if self.not_planned:
            whys = sorted(set(self.not_planned.values()))
            out += wrap(f"not planned, {len(self.not_planned)} offer(s) the task cannot run on:")
            for why in whys[:5]:
                out += wrap(why, "  ")
            if len(whys) > 5:
                out += wrap(f"and {len(whys) - 5} more (--format json)", "  ")
        out.append("sources:")
        for key, n in refs.items():
            out += wrap(f"[{n}] {key}", "  ")
        return out

    def highlights(self) -> list[dict]:
        """What a user must see before paying (issue 30): the chosen offer, the best offer of each
        cloud the task allows (``None`` where a cloud has no offer that fits the task), and the best
        on-demand one — each ``{"label", "rank" (1-based, None when absent), "offer" (a
        PlannedOffer), "why"}``. A cloud whose best is the chosen offer, or an on-demand best that is
        the chosen offer, is not repeated."""
        chosen = self.chosen
        out: list[dict] = [{"label": "chosen", "rank": 1, "offer": chosen, "why": _why(chosen, chosen)}]
        for cloud in self.clouds:
            best = next(((i, p) for i, p in enumerate(self.ranked) if p.offer.cloud == cloud), None)
            if best is None:
                out.append({"label": f"best on {cloud}", "rank": None, "offer": None,
                            "why": f"{cloud} sells nothing that fits the task's resources"})
            elif best[1] is not chosen:
                out.append({"label": f"best on {cloud}", "rank": best[0] + 1, "offer": best[1],
                            "why": _why(best[1], chosen)})
        od = next(((i, p) for i, p in enumerate(self.ranked) if p.offer.market is Market.ON_DEMAND), None)
        if od is not None and od[1] is not chosen:
            out.append({"label": "best on-demand", "rank": od[0] + 1, "offer": od[1], "why": _why(od[1], chosen)})
        return out


#: how many not-ranked sites the plan's text gives the reason of (all: ``--format json``)
NOT_RANKED_SHOWN = 5


def _why(p: PlannedOffer, chosen: PlannedOffer) -> str:
    """Why ``p`` ranks where it does against the chosen offer, in a few words."""
    o = p.offer
    cost = (f"${p.expected_cost_usd:,.2f} expected over {p.expected_hours:.3g} h" if math.isfinite(p.expected_cost_usd)
            else "no finite expected cost")
    parts = [cost]
    if o.market is Market.SPOT:
        parts.append("spot risk included")
    if p.transfer_usd > 0:
        parts.append(f"${p.transfer_usd:,.2f} of checkpoint transfer")
    if p.carried_usd_per_hour > 0:
        parts.append(f"${p.carried_usd_per_hour:.3f}/h of disks and addresses")
    if p is chosen:
        lead = "lowest expected total cost" if p.fits else "cheapest, but nothing fits the budget and deadline"
        return f"{lead}: " + ", ".join(parts)
    if not p.fits:
        lead = "over the budget" if p.over_budget else f"likely misses the deadline (p={p.p_deadline_miss:.2f})"
        return f"ranks after the offers that fit: {lead}; " + ", ".join(parts)
    diff = p.expected_cost_usd - chosen.expected_cost_usd
    drivers = []
    if o.usd_per_hour > chosen.offer.usd_per_hour:
        drivers.append(f"${o.usd_per_hour:g}/h vs ${chosen.offer.usd_per_hour:g}/h")
    if p.expected_hours > chosen.expected_hours * 1.001:
        drivers.append(f"{p.expected_hours:.3g} h vs {chosen.expected_hours:.3g} h")
    if p.transfer_usd > chosen.transfer_usd:
        drivers.append("more checkpoint transfer")
    return f"+${diff:,.2f} vs chosen ({', '.join(drivers) or 'the head and rounding'}): " + ", ".join(parts)


def candidate_offers(spec: TaskSpec, clouds: list[str], cloud_of=None) -> list[Offer]:
    """Worker offers of ``clouds`` that fit the task (accelerators, nodes, regions, market, price).
    ``cloud_of(name)``: the Cloud instance to ask for the offers of a cloud that prices itself
    (default: a new one), so the caller can read what it skipped."""
    from spotwise.provisioner.base import cloud_class, get_cloud

    r = spec.resources
    market = None if r.market == "auto" else r.market
    out: list[Offer] = []
    real = [c for c in clouds if cloud_class(c).priced_by_catalog]
    if real:
        from spotwise.pricing.catalog import find_offers

        gpus = {k: v for k, v in r.accelerators.items() if k != "cpu"}
        if gpus:
            out += find_offers(gpus, clouds=real, regions=list(r.regions) or None,
                               market=market or ["spot", "on-demand"], max_price=r.max_price_per_hour,
                               nodes=r.nodes)
    for name in (c for c in clouds if not cloud_class(c).priced_by_catalog):
        out += [o for o in (cloud_of or get_cloud)(name).offers()
                if (market is None or o.market.value == market) and _gpu_offer_fits(o, r)
                and (r.max_price_per_hour is None or o.usd_per_hour <= r.max_price_per_hour)]
    return [o for o in out if o.market in (Market.SPOT, Market.ON_DEMAND)
            and cloud_class(o.cloud).why_unlaunchable(o.instance_type) is None]


def _gpu_offer_fits(offer: Offer, r) -> bool:
    """Whether a self-priced cloud's GPU offer (a Slurm partition's) fits the task's resources: one
    of its accelerators at its count (when one is given), in one of its regions (when it names
    any). The local cloud's CPU offers are the catalog-less demo's and pass as they are."""
    if offer.accelerator == "cpu":
        return True
    wanted = dict(r.accelerators)
    if offer.accelerator not in wanted:
        return False
    n = wanted[offer.accelerator]
    return (n is None or n == offer.accelerator_count) and (not r.regions or offer.region in r.regions)


def _expected(spec: TaskSpec, offer: Offer, head_rate: float, budget: float | None,
              store: Site | None = None, carried: tuple[float, list[dict]] = (0.0, []),
              resuming: bool = False, copy: tuple[float, str] = (0.0, "")) -> PlannedOffer:
    from spotwise.pricing.egress import checkpoint_gb, run_transfer_cost
    from spotwise.pricing.estimate import JobModel, estimate_offer, flops_per_token_from_taskspec, params_from_taskspec

    nodes = spec.resources.nodes
    params, tokens = params_from_taskspec(spec)
    notes: list[str] = []
    if offer.accelerator == "cpu":
        hours = spec.training.steps * CPU_STEP_SECONDS / 3600
        job = JobModel(hours=hours)
        notes.append(f"local CPU node: assumed {CPU_STEP_SECONDS} s per step")
    else:
        job = JobModel(model_params=params, tokens=tokens, flops_per_token=flops_per_token_from_taskspec(spec),
                       activation_checkpointing=spec.training.activation_checkpointing)
    est = estimate_offer(offer, job, nodes=nodes, deadline_hours=spec.deadline_hours, budget_usd=budget)
    hours = est.expected_hours
    carried_rate, carried_items = carried
    carried_usd = carried_rate * hours if math.isfinite(hours) else math.inf
    cost = est.expected_cost_usd + head_rate * hours + carried_usd if math.isfinite(hours) else math.inf
    transfer = 0.0
    if store is not None:
        writes = spec.training.steps / spec.training.checkpoint.interval_steps
        t = run_transfer_cost(storage=store, cluster=Site(offer.cloud, offer.region),
                              checkpoint_gb=checkpoint_gb(params), writes=writes,
                              reads=est.interruptions_expected + (1 if resuming else 0))
        transfer = t.usd
        if t.note:
            notes.append(t.note)
    if copy[0] > 0:
        transfer += copy[0]
        notes.append(copy[1])
    return PlannedOffer(offer=offer, expected_hours=hours, expected_cost_usd=cost + transfer,
                        head_usd_per_hour=head_rate, p_deadline_miss=est.p_deadline_miss,
                        transfer_usd=transfer, carried_usd_per_hour=carried_rate, carried_usd=carried_usd,
                        carried=carried_items, notes=notes + list(est.notes))


def make_plan(spec: TaskSpec, clouds: list[str], *, budget: float | None = None,
              storage: str | Mapping[str, str] | None = None, resuming: bool = False,
              resume_from: str | None = None, cloud_factory: Callable[[str], Any] | None = None) -> Plan:
    """Rank every fitting offer; raise :class:`InputError` when nothing fits.

    ``storage``: the run's checkpoint URI (default: the task's); offers away from where it lives
    are charged for the checkpoints that cross (:mod:`spotwise.pricing.egress`). ``resuming``: the
    run continues a job from its last committed checkpoint (``spotwise resume``), so it starts by
    reading that checkpoint once more: an offer on another cloud than the store's pays that
    read's egress too (a resume may land anywhere the task allows, not where the job ran).

    ``storage`` may give each cloud its own store (cloud -> URI, :mod:`spotwise.engine.run.run_stores`):
    each offer is then charged against its own cloud's store, and a resume whose newest checkpoint
    lies in another cloud's store (``resume_from``) pays for copying it across once.

    ``cloud_factory``: the cloud object of each name the plan asks (offers, reachability, heads); None:
    a new one per cloud (:func:`~spotwise.provisioner.base.get_cloud`). A run passes its own, so
    what the plan read of a cloud (AWS's subnets and route tables) is not read again at launch.
    """
    from spotwise.pricing.egress import storage_site
    from spotwise.provisioner.base import get_cloud

    from spotwise.provisioner.sites import unreachable

    from spotwise.engine.plan.ranks import refusal, why_not as task_misfit
    from spotwise.pricing.egress import checkpoint_gb, copy_usd
    from spotwise.pricing.estimate import params_from_taskspec

    given = storage or spec.training.checkpoint.storage
    by_cloud: Mapping[str, str] = given if isinstance(given, Mapping) else {}
    default = given if isinstance(given, str) else next(iter(by_cloud.values()))
    sites = {uri: storage_site(uri) for uri in {default, *by_cloud.values()}}

    def copy_in(cloud: str) -> tuple[float, str]:
        """A resume's copy of its checkpoint into ``cloud``'s store, when another store holds it."""
        dst = by_cloud.get(cloud, default)
        if not resuming or resume_from is None or resume_from == dst:
            return 0.0, ""
        usd = copy_usd(resume_from, dst, checkpoint_gb(params_from_taskspec(spec)[0]))
        return usd, f"the resume copies its checkpoint from {resume_from} to {dst}: ${usd:,.4f} of egress"

    clouds_made: dict = {}
    make_cloud = cloud_factory or get_cloud

    def cloud_of(name: str):
        if name not in clouds_made:
            clouds_made[name] = make_cloud(name)
        return clouds_made[name]

    offers = candidate_offers(spec, clouds, cloud_of)
    # a self-priced cloud's sites it could not ask (a Slurm cluster that does not answer): named in
    # the plan, and the plan's error when nothing else is left
    skipped = {f"{c}/{region}": why for c in clouds if c in clouds_made
               for region, why in clouds_made[c].skipped_regions.items()}
    if not offers and skipped:
        raise next(clouds_made[c] for c in clouds if c in clouds_made and clouds_made[c].skipped_regions
                   ).skipped_error()
    # sites a run cannot use as the clouds are configured (an AWS opt-in region nobody named, a GCP
    # region without the configured subnetwork) are not ranked: the failover would only fail there
    named = set(spec.resources.regions)
    why_not: dict[str, str | None] = {}
    for o in offers:
        site = f"{o.cloud}/{o.region}"
        if site not in why_not:
            why_not[site] = unreachable(cloud_of(o.cloud), o.region, named=named)
    not_ranked = {site: why for site, why in why_not.items() if why}
    not_ranked_extra = skipped
    if offers and len(not_ranked) == len(why_not):
        raise InputError(Problem("resources.regions", list(spec.resources.regions),
                                 "a region a run can use as the clouds are configured: "
                                 + "; ".join(not_ranked.values())), source="plan")
    offers = [o for o in offers if f"{o.cloud}/{o.region}" not in not_ranked]
    if not offers:
        r = spec.resources
        raise InputError(Problem("resources", {"accelerators": dict(r.accelerators), "clouds": clouds,
                                               "regions": list(r.regions), "market": r.market,
                                               "max_price_per_hour": r.max_price_per_hour},
                                 "a combination some cloud sells (see `spotwise prices`; the local cloud "
                                 "sells accelerators: cpu:1)"), source="plan")
    # the task at each offer's world size (nodes x GPUs per node): a batch the ranks do not divide,
    # or a rank its GPU cannot hold, is not planned (spotwise.engine.plan.ranks)
    refused = {o.key: (o, misfit) for o in offers if (misfit := task_misfit(spec, o)) is not None}
    if refused and len(refused) == len(offers):
        raise refusal(spec, refused)
    offers = [o for o in offers if o.key not in refused]
    heads: dict[tuple[str, str], float] = {}
    carried: dict[tuple[str, str, str, str], tuple[float, list[dict]]] = {}
    planned = []
    for o in offers:
        key = (o.cloud, o.region)
        cloud = cloud_of(o.cloud)
        if key not in heads:
            heads[key] = cloud.head_offer(o.region, o.zone).usd_per_hour
        ckey = (o.cloud, o.region, o.market.value, o.instance_type)   # a disk's type may follow the machine
        if ckey not in carried:
            worker = cloud.node_charges(o.region, o.market.value, instance_type=o.instance_type)
            head = cloud.node_charges(o.region, Market.ON_DEMAND.value, public_ip=head_public_ip(cloud),
                                      instance_type=cloud.head_offer(o.region, o.zone).instance_type)
            rate = spec.resources.nodes * sum(c.usd_per_hour for c in worker) + sum(c.usd_per_hour for c in head)
            carried[ckey] = (rate, [c.to_dict() for c in worker])
        planned.append(_expected(spec, o, heads[key], budget, sites[by_cloud.get(o.cloud, default)], carried[ckey],
                                 resuming, copy_in(o.cloud)))

    for p in planned:
        p.over_budget = budget is not None and p.expected_cost_usd > budget
        p.late = p.p_deadline_miss is not None and p.p_deadline_miss > 0.5
        q = cloud_of(p.offer.cloud).queue(p.offer, spec.resources.nodes)
        if q is not None:
            p.queue = q.describe()
            wait = q.wait_hours()
            if wait is not None and spec.deadline_hours is not None and wait + p.expected_hours > spec.deadline_hours:
                p.late = True
                p.notes.append(f"would start too late for the deadline: {wait:.2g} h in the queue + "
                               f"{p.expected_hours:.3g} h of training > {spec.deadline_hours:g} h")

    planned.sort(key=lambda p: (not p.fits, p.expected_cost_usd, p.offer.usd_per_hour, p.offer.key))
    best = planned[0]
    why = [f"lowest expected total cost among {len(planned)} offers on {', '.join(clouds)}: "
           f"${best.expected_cost_usd:,.4f} over {best.expected_hours:.4g} h "
           f"({spec.resources.nodes} x {best.offer.instance_type} {best.offer.market.value} in "
           f"{best.offer.zone or best.offer.region} at ${best.offer.usd_per_hour}/h + head ${best.head_usd_per_hour}/h"
           + (f" + disks and addresses ${best.carried_usd_per_hour:.4f}/h" if best.carried_usd_per_hour else "") + ")"]
    if best.offer.market is Market.SPOT:
        why.append("spot risk (interruptions, restarts, lost work) is included in the expected hours")
    nxt = next((p for p in planned[1:] if p.offer.market != best.offer.market), None)
    if nxt is not None:
        why.append(f"best {nxt.offer.market.value} alternative: ${nxt.expected_cost_usd:,.4f} "
                   f"({nxt.offer.instance_type} in {nxt.offer.zone or nxt.offer.region})")
    if not best.fits:
        why.append("no offer fits the budget and deadline: the cap still stops the run before it is passed")
    return Plan(ranked=planned, reason="; ".join(why), clouds=list(clouds), not_ranked={**not_ranked, **not_ranked_extra},
                not_planned={key: f"{o.cloud} {o.instance_type}: {why}" for key, (o, why) in refused.items()})


def head_public_ip(cloud: object) -> bool | None:
    """Whether ``cloud``'s head will have a public IPv4, for the plan's charges: True when the
    launcher reaches its heads over ssh (:func:`spotwise.provisioner.head_path.head_path`, the
    default), None (as the cloud is configured) otherwise. A launched head says it itself
    (``extra["public_ip"]``, which the ledger bills)."""
    from spotwise.provisioner.head_path import head_path

    if not getattr(cloud, "head_over_ssh", False):
        return None
    return True if head_path().ssh else None

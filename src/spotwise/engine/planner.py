"""Plan a run: every offer that fits the task, ranked by the estimator's expected total cost.

The plan is what ``spotwise launch --dry-run`` prints and what the orchestrator walks: the first
offer is where the run starts, the rest are the fallbacks (capacity errors, replacements, a move
between markets) in order. Planning needs no cloud credentials: real clouds' offers come from the
price catalog (snapshot + live cache), the local cloud prices itself.

Expected total cost of an offer = (workers x offer price + the head's price) x expected hours,
where expected hours include spot risk (interruptions, restarts, lost work; see
:mod:`spotwise.pricing.estimate`). Offers whose expected cost passes the task's budget, or whose
deadline-miss probability is over one half, rank after all that fit, and say why. An offer
away from the checkpoint store (another region or cloud) also pays for the checkpoints that cross:
every periodic checkpoint written there and one read per expected resume, at the transfer price of
the cloud the bytes leave (:mod:`spotwise.pricing.egress`) — so a move between clouds is chosen
only when it is cheaper with its traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
    notes: list[str] = field(default_factory=list)

    @property
    def site(self) -> str:
        """Where a Ray cluster on this offer lives: ``cloud/region``."""
        return f"{self.offer.cloud}/{self.offer.region}"

    def to_dict(self) -> dict:
        return {**self.offer.to_dict(), "expected_hours": self.expected_hours,
                "expected_cost_usd": self.expected_cost_usd, "head_usd_per_hour": self.head_usd_per_hour,
                "transfer_usd": round(self.transfer_usd, 6),
                "p_deadline_miss": self.p_deadline_miss, "notes": list(self.notes)}


@dataclass(slots=True, kw_only=True)
class Plan:
    ranked: list[PlannedOffer]
    reason: str
    clouds: list[str]

    @property
    def chosen(self) -> PlannedOffer:
        return self.ranked[0]

    @property
    def offers(self) -> list[Offer]:
        return [p.offer for p in self.ranked]

    def to_dict(self, limit: int | None = None) -> dict:
        fb = self.ranked[1:] if limit is None else self.ranked[1:1 + limit]
        return {"chosen": self.chosen.to_dict(), "fallbacks": [p.to_dict() for p in fb],
                "reason": self.reason, "clouds": self.clouds, "offers_considered": len(self.ranked)}


def candidate_offers(spec: TaskSpec, clouds: list[str]) -> list[Offer]:
    """Worker offers of ``clouds`` that fit the task (accelerators, nodes, regions, market, price)."""
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
        out += [o for o in get_cloud(name).offers()
                if (market is None or o.market.value == market)
                and (r.max_price_per_hour is None or o.usd_per_hour <= r.max_price_per_hour)]
    return [o for o in out if o.market in (Market.SPOT, Market.ON_DEMAND)]


def _expected(spec: TaskSpec, offer: Offer, head_rate: float, budget: float | None,
              store: Site | None = None) -> PlannedOffer:
    from spotwise.pricing.egress import checkpoint_gb, run_transfer_cost
    from spotwise.pricing.estimate import JobModel, estimate_offer, params_from_taskspec

    nodes = spec.resources.nodes
    params, tokens = params_from_taskspec(spec)
    notes: list[str] = []
    if offer.accelerator == "cpu":
        hours = spec.training.steps * CPU_STEP_SECONDS / 3600
        job = JobModel(hours=hours)
        notes.append(f"local CPU node: assumed {CPU_STEP_SECONDS} s per step")
    else:
        job = JobModel(model_params=params, tokens=tokens)
    est = estimate_offer(offer, job, nodes=nodes, deadline_hours=spec.deadline_hours, budget_usd=budget)
    hours = est.expected_hours
    cost = est.expected_cost_usd + head_rate * hours if math.isfinite(hours) else math.inf
    transfer = 0.0
    if store is not None:
        writes = spec.training.steps / spec.training.checkpoint.interval_steps
        t = run_transfer_cost(storage=store, cluster=Site(offer.cloud, offer.region),
                              checkpoint_gb=checkpoint_gb(params), writes=writes,
                              reads=est.interruptions_expected)
        transfer = t.usd
        if t.note:
            notes.append(t.note)
    return PlannedOffer(offer=offer, expected_hours=hours, expected_cost_usd=cost + transfer,
                        head_usd_per_hour=head_rate, p_deadline_miss=est.p_deadline_miss,
                        transfer_usd=transfer, notes=notes + list(est.notes))


def make_plan(spec: TaskSpec, clouds: list[str], *, budget: float | None = None,
              storage: str | None = None) -> Plan:
    """Rank every fitting offer; raise :class:`InputError` when nothing fits.

    ``storage``: the run's checkpoint URI (default: the task's); offers away from where it lives
    are charged for the checkpoints that cross (:mod:`spotwise.pricing.egress`).
    """
    from spotwise.pricing.egress import storage_site
    from spotwise.provisioner.base import get_cloud

    store = storage_site(storage or spec.training.checkpoint.storage)

    offers = candidate_offers(spec, clouds)
    if not offers:
        r = spec.resources
        raise InputError(Problem("resources", {"accelerators": dict(r.accelerators), "clouds": clouds,
                                               "regions": list(r.regions), "market": r.market,
                                               "max_price_per_hour": r.max_price_per_hour},
                                 "a combination some cloud sells (see `spotwise prices`; the local cloud "
                                 "sells accelerators: cpu:1)"), source="plan")
    heads: dict[tuple[str, str], float] = {}
    planned = []
    for o in offers:
        key = (o.cloud, o.region)
        if key not in heads:
            heads[key] = get_cloud(o.cloud).head_offer(o.region, o.zone).usd_per_hour
        planned.append(_expected(spec, o, heads[key], budget, store))

    def fits(p: PlannedOffer) -> bool:
        over = budget is not None and p.expected_cost_usd > budget
        late = p.p_deadline_miss is not None and p.p_deadline_miss > 0.5
        return not over and not late

    planned.sort(key=lambda p: (not fits(p), p.expected_cost_usd, p.offer.usd_per_hour, p.offer.key))
    best = planned[0]
    why = [f"lowest expected total cost among {len(planned)} offers on {', '.join(clouds)}: "
           f"${best.expected_cost_usd:,.4f} over {best.expected_hours:.4g} h "
           f"({spec.resources.nodes} x {best.offer.instance_type} {best.offer.market.value} in "
           f"{best.offer.zone or best.offer.region} at ${best.offer.usd_per_hour}/h + head ${best.head_usd_per_hour}/h)"]
    if best.offer.market is Market.SPOT:
        why.append("spot risk (interruptions, restarts, lost work) is included in the expected hours")
    nxt = next((p for p in planned[1:] if p.offer.market != best.offer.market), None)
    if nxt is not None:
        why.append(f"best {nxt.offer.market.value} alternative: ${nxt.expected_cost_usd:,.4f} "
                   f"({nxt.offer.instance_type} in {nxt.offer.zone or nxt.offer.region})")
    if not fits(best):
        why.append("no offer fits the budget and deadline: the cap still stops the run before it is passed")
    return Plan(ranked=planned, reason="; ".join(why), clouds=list(clouds))

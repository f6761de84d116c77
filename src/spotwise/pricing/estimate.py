"""Estimate hours, dollars and deadline risk of a training job on each matching offer.

Compute time
    ``hours = 6·P·T / (GPUs × peak × MFU)`` — 6 FLOPs per parameter per token (forward + backward),
    ``peak`` the GPU's dense BF16 TFLOPS from ``data/gpu_specs.csv`` (V100 has no BF16: its dense
    FP16 peak is used, and the row says so). Or the caller gives ``hours`` directly.

Spot
    Interruptions arrive as a Poisson process. Per node the rate comes from the AWS Spot Instance
    Advisor band of (region, instance type) (``data/spot_advisor.csv``, snapshot ≤ 2024-02-28;
    band midpoints 2.5/7.5/12.5/17.5/25 % of instances interrupted per month); where there is no
    band (GCP, Azure, newer AWS types) the ``>20%`` band is assumed and noted. A job on N nodes is
    interrupted when any node is: λ = N·λ₁. Checkpoints every τ = √(2C/λ) hours (Young/Daly) cost
    C each; each interruption loses R (restart) + τ/2 (expected lost work). Expected wall time
    ``E = T·(1 + C/τ) / (1 − λ·(R + τ/2))`` (infinite when the denominator is ≤ 0: the job would
    never finish). P(deadline miss) = P(K > k_max) with K ~ Poisson(λ·T·(1+C/τ)) interruptions and
    k_max the interruptions the deadline's slack can absorb.

On-demand is ``T`` hours at list price. Reserved is priced honestly: the commitment is the whole
term (price × 8760 h × years × nodes, due whatever this job uses); the row also gives this job's
share and the break-even utilisation (reserved ÷ on-demand price) above which a reservation beats
on-demand.
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from spotwise.errors import InputError, Problem
from spotwise.pricing.offer import Market, Offer
from spotwise.pricing.store import DATA_DIR

HOURS_PER_MONTH = 730.0
HOURS_PER_YEAR = 8760.0
BAND_MONTHLY_FRACTION = {0: 0.025, 1: 0.075, 2: 0.125, 3: 0.175, 4: 0.25}
DEFAULT_BAND = 4
EGRESS_USD_PER_GB = 0.02            # inter-region transfer, AWS/GCP/Azure list price floor
CHECKPOINT_BYTES_PER_PARAM = 16     # bf16 weights + fp32 master copy + Adam moments


@dataclass(frozen=True, slots=True)
class JobModel:
    """What is being run: compute hours on one GPU-type are derived per offer from these."""

    hours: float | None = None             # given wall-clock hours (same for every offer)
    model_params: float | None = None
    tokens: float | None = None
    mfu: float = 0.4
    checkpoint_minutes: float = 2.0
    restart_minutes: float = 10.0

    def __post_init__(self) -> None:
        probs = []
        if self.hours is None and (self.model_params is None or self.tokens is None):
            probs.append(Problem("--hours / --model-params + --tokens", None,
                                 "either --hours H, or both --model-params P and --tokens T"))
        for name, v in (("--hours", self.hours), ("--model-params", self.model_params), ("--tokens", self.tokens)):
            if v is not None and not v > 0:
                probs.append(Problem(name, v, "a number > 0"))
        if not 0 < self.mfu <= 1:
            probs.append(Problem("--mfu", self.mfu, "a fraction in (0, 1], e.g. 0.4"))
        if self.checkpoint_minutes < 0 or self.restart_minutes < 0:
            probs.append(Problem("checkpoint/restart minutes", (self.checkpoint_minutes, self.restart_minutes), ">= 0"))
        if probs:
            raise InputError(probs, source="estimate")


@dataclass(slots=True)
class Estimate:
    cloud: str
    instance_type: str
    accelerator: str
    accelerator_count: int
    region: str
    zone: str
    market: str
    payment_option: str | None
    nodes: int
    usd_per_hour: float              # the whole request: nodes × instance price
    compute_hours: float             # T: hours of useful work on this shape
    expected_hours: float            # wall clock incl. checkpoints and interruptions
    expected_cost_usd: float
    p_deadline_miss: float | None
    interruptions_expected: float = 0.0
    checkpoint_interval_hours: float | None = None
    source: str = ""
    as_of: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("usd_per_hour", "compute_hours", "expected_hours", "expected_cost_usd", "interruptions_expected"):
            if d[k] is not None and math.isfinite(d[k]):
                d[k] = round(d[k], 4)
            elif d[k] is not None:
                d[k] = None
        if d["p_deadline_miss"] is not None:
            d["p_deadline_miss"] = round(d["p_deadline_miss"], 4)
        if d["checkpoint_interval_hours"] is not None:
            d["checkpoint_interval_hours"] = round(d["checkpoint_interval_hours"], 4)
        return d


@lru_cache(maxsize=1)
def gpu_peaks() -> dict[str, tuple[float, str]]:
    """{accelerator: (dense TFLOPS used, "bf16"|"fp16")}; first row per GPU (SXM where listed)."""
    out: dict[str, tuple[float, str]] = {}
    with open(DATA_DIR / "gpu_specs.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["gpu"] in out:
                continue
            if r["bf16_dense_tflops"]:
                out[r["gpu"]] = (float(r["bf16_dense_tflops"]), "bf16")
            elif r["fp16_dense_tflops"]:
                out[r["gpu"]] = (float(r["fp16_dense_tflops"]), "fp16")
    return out


@lru_cache(maxsize=1)
def spot_bands() -> dict[tuple[str, str], int]:
    with open(DATA_DIR / "spot_advisor.csv", newline="") as f:
        return {(r["region"], r["instance_type"]): int(r["interruption_band_index"]) for r in csv.DictReader(f)}


def interruption_rate_per_hour(offer: Offer) -> tuple[float, str | None]:
    """Per-node interruption rate (1/h) and a note when it is an assumption."""
    band = spot_bands().get((offer.region, offer.instance_type)) if offer.cloud == "aws" else None
    note = None
    if band is None:
        band = DEFAULT_BAND
        note = (f"no interruption data for {offer.cloud} {offer.instance_type} {offer.region}: assumed the "
                "'>20%/month' band (AWS Spot Advisor's worst)")
    p = BAND_MONTHLY_FRACTION[band]
    return -math.log(1 - p) / HOURS_PER_MONTH, note


def compute_hours(job: JobModel, offer: Offer, nodes: int) -> tuple[float, list[str]]:
    if job.hours is not None:
        return job.hours, []
    peak = gpu_peaks().get(offer.accelerator)
    if peak is None:
        raise InputError(Problem("--gpu", offer.accelerator, "a GPU with a known peak: " + ", ".join(sorted(gpu_peaks()))))
    tflops, dtype = peak
    gpus = nodes * offer.accelerator_count
    hours = 6 * job.model_params * job.tokens / (gpus * tflops * 1e12 * job.mfu) / 3600
    notes = [f"{offer.accelerator} has no bf16: used its dense fp16 peak {tflops} TFLOPS"] if dtype == "fp16" else []
    return hours, notes


def _poisson_sf(k: int, mu: float) -> float:
    """P(K > k) for K ~ Poisson(mu)."""
    if k < 0:
        return 1.0
    term = math.exp(-mu)
    cdf = term
    for i in range(1, k + 1):
        term *= mu / i
        cdf += term
    return max(0.0, 1.0 - cdf)


def estimate_offer(offer: Offer, job: JobModel, *, nodes: int = 1, deadline_hours: float | None = None,
                   budget_usd: float | None = None, on_demand_ref: float | None = None) -> Estimate:
    """One offer's estimate (see the module docstring for the model)."""
    T, notes = compute_hours(job, offer, nodes)
    rate = offer.usd_per_hour * nodes
    est = Estimate(cloud=offer.cloud, instance_type=offer.instance_type, accelerator=offer.accelerator,
                   accelerator_count=offer.accelerator_count, region=offer.region, zone=offer.zone,
                   market=offer.market.value, payment_option=offer.payment_option, nodes=nodes,
                   usd_per_hour=rate, compute_hours=T, expected_hours=T, expected_cost_usd=T * rate,
                   p_deadline_miss=None, source=offer.source, as_of=offer.as_of, notes=notes)
    if offer.market is Market.SPOT:
        lam1, note = interruption_rate_per_hour(offer)
        if note:
            notes.append(note)
        lam = lam1 * nodes
        C = job.checkpoint_minutes / 60
        R = job.restart_minutes / 60
        tau = math.sqrt(2 * C / lam) if C > 0 else 0.0
        useful = T * (1 + (C / tau if tau > 0 else 0.0))
        loss = R + tau / 2
        denom = 1 - lam * loss
        E = useful / denom if denom > 0 else math.inf
        est.expected_hours = E
        est.expected_cost_usd = E * rate
        est.interruptions_expected = lam * E if math.isfinite(E) else math.inf
        est.checkpoint_interval_hours = tau or None
        if deadline_hours is not None:
            slack = deadline_hours - useful
            est.p_deadline_miss = 1.0 if slack < 0 else _poisson_sf(int(slack // loss) if loss > 0 else 10**6, lam * useful)
        if job.model_params:
            gb = job.model_params * CHECKPOINT_BYTES_PER_PARAM / 1e9
            notes.append(f"cross-region failover moves the checkpoint (~{gb:.1f} GB): ~${gb * EGRESS_USD_PER_GB:.2f} "
                         f"egress per move at ${EGRESS_USD_PER_GB}/GB")
        else:
            notes.append(f"cross-region failover moves the checkpoint: egress ~${EGRESS_USD_PER_GB}/GB")
    elif offer.market in (Market.RESERVED_1Y, Market.RESERVED_3Y):
        years = 1 if offer.market is Market.RESERVED_1Y else 3
        commitment = offer.usd_per_hour * HOURS_PER_YEAR * years * nodes
        share = T * rate
        est.expected_cost_usd = commitment
        notes.append(f"commitment: ${commitment:,.0f} for the {years}-year term whatever this job uses; "
                     f"this job's {T:.1f} h are ${share:,.0f} of it ({T / (HOURS_PER_YEAR * years):.2%} of the term)")
        if on_demand_ref:
            notes.append(f"break-even utilisation {offer.usd_per_hour / on_demand_ref:.0%} of the term vs on-demand "
                         f"${on_demand_ref:.2f}/h")
        if deadline_hours is not None:
            est.p_deadline_miss = 0.0 if T <= deadline_hours else 1.0
    else:
        if deadline_hours is not None:
            est.p_deadline_miss = 0.0 if T <= deadline_hours else 1.0
    if budget_usd is not None and est.expected_cost_usd > budget_usd:
        notes.append(f"over budget: expected ${est.expected_cost_usd:,.0f} > ${budget_usd:,.0f}")
    return est


def estimate(accelerators: dict[str, int], job: JobModel, *, nodes: int = 1, clouds=None, regions=None,
             market=None, deadline_hours: float | None = None, budget_usd: float | None = None,
             best_per_cloud_market: bool = True, catalog=None) -> list[Estimate]:
    """Estimates for every matching offer (or the cheapest per cloud × market), cheapest expected cost first."""
    from spotwise.pricing.catalog import default_catalog

    if deadline_hours is not None and not deadline_hours > 0:
        raise InputError(Problem("--deadline-hours", deadline_hours, "a number > 0"))
    if budget_usd is not None and not budget_usd > 0:
        raise InputError(Problem("--budget", budget_usd, "a number > 0 (USD)"))
    cat = catalog or default_catalog()
    markets = market if market is not None else [m.value for m in Market]
    offers = cat.find_offers(accelerators, clouds=clouds, regions=regions, market=markets, nodes=nodes)
    od_ref: dict[tuple, float] = {}
    for o in cat.find_offers(accelerators, clouds=clouds, regions=regions, market="on-demand", nodes=nodes):
        k = (o.cloud, o.instance_type, o.region)
        od_ref[k] = min(od_ref.get(k, o.usd_per_hour), o.usd_per_hour)
    out = [estimate_offer(o, job, nodes=nodes, deadline_hours=deadline_hours, budget_usd=budget_usd,
                          on_demand_ref=od_ref.get((o.cloud, o.instance_type, o.region))) for o in offers]
    out.sort(key=lambda e: (e.expected_cost_usd, e.expected_hours, e.cloud, e.region, e.zone))
    if best_per_cloud_market:
        seen, best = set(), []
        for e in out:
            k = (e.cloud, e.market, e.payment_option)
            if k not in seen:
                seen.add(k)
                best.append(e)
        out = best
    return out


def params_from_taskspec(spec) -> tuple[float, float]:
    """(parameters, tokens) of a task's built-in GPT: 12·L·d² + vocab·d + seq·d; steps × batch × seq."""
    m = spec.training.model
    params = 12 * m.n_layers * m.d_model ** 2 + 256 * m.d_model + m.seq_len * m.d_model
    tokens = spec.training.steps * spec.training.batch_size * m.seq_len
    return float(params), float(tokens)

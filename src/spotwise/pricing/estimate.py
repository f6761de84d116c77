"""Estimate hours, dollars and deadline risk of a training job on each matching offer.

Compute time
    ``hours = F·T / (GPUs × peak × MFU)``, ``F`` the training FLOPs per token by the one
    definition (:mod:`spotwise.utils.flops`: matmuls without the embedding, plus attention) where
    the job knows its shape (a task's built-in llama:
    :meth:`spotwise.runtime.llama_config.LlamaConfig.train_flops_per_token`), else ``6·P``;
    × 4/3 with activation checkpointing (the forward recomputed in backward),
    ``peak`` the GPU's dense BF16 TFLOPS from ``data/gpu_specs.csv`` (V100 has no BF16: its dense
    FP16 peak is used, and the row says so). Or the caller gives ``hours`` directly.

    MFU is not a constant (see :func:`model_mfu`): ``MFU = base(generation) × size(P) × scale(nodes)``.
    A newer GPU reaches less of its (higher) dense peak — published Hopper runs sit at 0.25–0.43 —
    and a small model's matmuls cannot fill it (``size = min(1, (P / P_sat)^0.24)``, ``P_sat`` per
    generation); data-parallel communication costs efficiency as nodes are added
    (``scale = 1 / (1 + 0.03·log2(nodes))``). The constants are fitted to the GPU-hours Meta
    published for Llama 2 (A100) and Llama 3 (H100) at 2,048 GPUs (``bench/bench_estimate_accuracy.py``
    prints the fit: all five within ±5 %, with the same FLOPs per token a task is priced with,
    :mod:`spotwise.utils.flops`). Activation checkpointing multiplies the time by 4/3. ``JobModel(mfu=…)`` / ``--mfu`` replaces the whole model.

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

On-demand is ``T`` hours at list price. Reserved is priced honestly: a commitment is the whole
term (price × 8760 h × years × nodes, due whatever this job uses). A job longer than the term needs
several: the cost is the cheaper of ``ceil(T / term)`` commitments and ``floor(T / term)``
commitments plus on-demand for the remainder (the row says which). The row also gives the
break-even utilisation (reserved ÷ on-demand price, and reserved ÷ same-region spot price) above
which a reservation beats on-demand, or spot.

A plan that runs for more than :data:`LONG_RUN_HOURS` gets a warning and the node count that meets
the deadline (or finishes within that time when there is no deadline).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from functools import lru_cache

from spotwise.errors import InputError, Problem
from spotwise.pricing.offer import Market, Offer
from spotwise.pricing.store import DATA_DIR
from spotwise.utils.flops import RECOMPUTE_TIME_FACTOR

HOURS_PER_MONTH = 730.0
HOURS_PER_YEAR = 8760.0
BAND_MONTHLY_FRACTION = {0: 0.025, 1: 0.075, 2: 0.125, 3: 0.175, 4: 0.25}
DEFAULT_BAND = 4
EGRESS_USD_PER_GB = 0.02            # inter-region transfer, AWS/GCP/Azure list price floor
CHECKPOINT_BYTES_PER_PARAM = 16     # bf16 weights + fp32 master copy + Adam moments
LONG_RUN_HOURS = 30 * 24.0          # a plan longer than a month gets a warning
MAX_SUGGESTED_NODES = 4096

#: GPU generation of each accelerator (decides how much of the dense peak a run reaches).
GENERATION = {"V100": "volta", "V100-32GB": "volta", "A100": "ampere", "A100-80GB": "ampere",
              "A10G": "ampere", "A10": "ampere", "L4": "ada", "L40S": "ada", "H100": "hopper",
              "H100-NVL": "hopper", "H200": "hopper"}

#: Per generation: (MFU of a saturating model on one node, P_sat: parameters needed to saturate).
#: Fitted to Llama 2 (A100, 2T tokens) and Llama 3 (H100, 15T tokens) GPU-hours at 2,048 GPUs,
#: their FLOPs counted by the one definition (:mod:`spotwise.utils.flops`: matmuls without the
#: embedding, plus attention) on each model's published shape, no activation checkpointing assumed
#: (least squares in log space over the two bases and the exponent; residuals in docs/pricing.md);
#: volta/ada are not fitted (no published run here) and borrow Ampere's values.
MFU_BASE = {"volta": (0.55, 7e9), "ampere": (0.55, 7e9), "ada": (0.55, 7e9), "hopper": (0.39, 70e9)}
MFU_SIZE_EXPONENT = 0.24
MFU_NODE_PENALTY = 0.03             # efficiency lost per doubling of nodes (data-parallel all-reduce)


@dataclass(frozen=True, slots=True)
class JobModel:
    """What is being run: compute hours on one GPU-type are derived per offer from these."""

    hours: float | None = None             # given wall-clock hours (same for every offer)
    model_params: float | None = None
    tokens: float | None = None
    mfu: float | None = None               # None: model_mfu(); a number overrides the whole model
    # training FLOPs per token when the model is known (spotwise.utils.flops: attention included,
    # the embedding not); None: 6 x model_params (no shape known: embedding and attention unseen)
    flops_per_token: float | None = None
    # each block's forward recomputed in backward: 4/3 the time (spotwise.utils.flops)
    activation_checkpointing: bool = False
    checkpoint_minutes: float = 2.0
    restart_minutes: float = 10.0

    def __post_init__(self) -> None:
        probs = []
        if self.hours is None and (self.model_params is None or self.tokens is None):
            probs.append(Problem("--hours / --model-params + --tokens", None,
                                 "either --hours H, or both --model-params P and --tokens T"))
        for name, v in (("--hours", self.hours), ("--model-params", self.model_params), ("--tokens", self.tokens),
                        ("flops per token", self.flops_per_token)):
            if v is not None and not v > 0:
                probs.append(Problem(name, v, "a number > 0"))
        if self.mfu is not None and not 0 < self.mfu <= 1:
            probs.append(Problem("--mfu", self.mfu, "a fraction in (0, 1], e.g. 0.4"))
        if self.checkpoint_minutes < 0 or self.restart_minutes < 0:
            probs.append(Problem("checkpoint/restart minutes", (self.checkpoint_minutes, self.restart_minutes), ">= 0"))
        if probs:
            raise InputError(probs, source="estimate")

    def size(self) -> tuple[float, float]:
        """(parameters, tokens) of a job whose hours are derived from them (not given)."""
        if self.model_params is None or self.tokens is None:   # __post_init__ refuses this without hours
            raise ValueError("a JobModel without hours needs model_params and tokens")
        return self.model_params, self.tokens


#: The keys of :meth:`Estimate.to_dict`, in the order ``spotwise estimate --format json`` prints them.
ROW_KEYS = ("cloud", "instance_type", "accelerator", "accelerator_count", "region", "zone", "market",
            "payment_option", "nodes", "usd_per_hour", "compute_hours", "expected_hours", "expected_cost_usd",
            "p_deadline_miss", "interruptions_expected", "checkpoint_interval_hours", "source", "as_of", "notes",
            "as_of_kind", "mfu", "gpu_hours", "warnings", "suggested_nodes", "reserved_terms", "reserved_plan",
            "break_even_vs_on_demand", "break_even_vs_spot")


@dataclass(slots=True)
class Estimate:
    """One offer's estimate for a job. What the offer is (cloud, type, place, market, price source)
    is read from ``offer``; the numbers here are this job's on it. ``usd_per_hour`` is the whole
    request's rate (nodes × the offer's instance price), not the offer's."""

    offer: Offer
    nodes: int
    usd_per_hour: float              # the whole request: nodes × instance price
    compute_hours: float             # T: hours of useful work on this shape
    expected_hours: float            # wall clock incl. checkpoints and interruptions
    expected_cost_usd: float
    p_deadline_miss: float | None
    interruptions_expected: float = 0.0
    checkpoint_interval_hours: float | None = None
    notes: list[str] = field(default_factory=list)
    mfu: float | None = None         # the MFU used (None when the caller gave hours)
    gpu_hours: float | None = None   # compute_hours × GPUs
    warnings: list[str] = field(default_factory=list)
    suggested_nodes: int | None = None
    reserved_terms: int | None = None          # commitments bought (reserved rows)
    reserved_plan: str | None = None           # "N commitments" or "N commitments + on-demand"
    break_even_vs_on_demand: float | None = None   # utilisation above which reserved wins
    break_even_vs_spot: float | None = None

    # The offer's facts, as a row of the estimate table reads them.
    @property
    def cloud(self) -> str:
        return self.offer.cloud

    @property
    def instance_type(self) -> str:
        return self.offer.instance_type

    @property
    def accelerator(self) -> str:
        return self.offer.accelerator

    @property
    def accelerator_count(self) -> int:
        return self.offer.accelerator_count

    @property
    def region(self) -> str:
        return self.offer.region

    @property
    def zone(self) -> str:
        return self.offer.zone

    @property
    def market(self) -> str:
        """The market's name (``"spot"``, ``"reserved-1y"``...)."""
        return self.offer.market.value

    @property
    def payment_option(self) -> str | None:
        return self.offer.payment_option

    @property
    def source(self) -> str:
        return self.offer.source

    @property
    def as_of(self) -> str:
        return self.offer.as_of

    @property
    def as_of_kind(self) -> str:
        return self.offer.as_of_kind

    def to_dict(self) -> dict:
        """The JSON row of ``spotwise estimate`` (and the API's estimates): the offer's facts and
        this job's numbers, flat, in :data:`ROW_KEYS` order; non-finite numbers become ``None``."""
        d = {k: getattr(self, k) for k in ROW_KEYS}
        d["notes"], d["warnings"] = list(self.notes), list(self.warnings)
        for k in ("usd_per_hour", "compute_hours", "expected_hours", "expected_cost_usd", "interruptions_expected",
                  "gpu_hours", "mfu", "break_even_vs_on_demand", "break_even_vs_spot"):
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


def model_mfu(accelerator: str, model_params: float, nodes: int) -> tuple[float, str]:
    """MFU this job is expected to reach, and the assumption spelled out (module docstring)."""
    gen = GENERATION.get(accelerator, "ampere")
    base, p_sat = MFU_BASE[gen]
    size = min(1.0, (model_params / p_sat) ** MFU_SIZE_EXPONENT)
    scale = 1.0 / (1.0 + MFU_NODE_PENALTY * math.log2(max(nodes, 1)))
    mfu = base * size * scale
    why = (f"MFU {mfu:.3f} = {base:.2f} ({gen}) × {size:.2f} (model size vs {p_sat / 1e9:.0f}B) "
           f"× {scale:.2f} ({nodes} node{'s' if nodes != 1 else ''}); --mfu overrides")
    return mfu, why


def _mfu(job: JobModel, offer: Offer, nodes: int) -> tuple[float, str]:
    if job.mfu is not None:
        return job.mfu, f"MFU {job.mfu:.3f} (given)"
    return model_mfu(offer.accelerator, job.size()[0], nodes)


def compute_hours(job: JobModel, offer: Offer, nodes: int) -> tuple[float, list[str]]:
    if job.hours is not None:
        return job.hours, []
    peak = gpu_peaks().get(offer.accelerator)
    if peak is None:
        raise InputError(Problem("--gpu", offer.accelerator, "a GPU with a known peak: " + ", ".join(sorted(gpu_peaks()))))
    tflops, dtype = peak
    gpus = nodes * offer.accelerator_count
    mfu, why = _mfu(job, offer, nodes)
    params, tokens = job.size()
    per_token = job.flops_per_token if job.flops_per_token is not None else 6 * params
    hours = per_token * tokens / (gpus * tflops * 1e12 * mfu) / 3600
    notes = [f"{why}; peak {tflops} TFLOPS dense {dtype}"]
    if job.activation_checkpointing:
        hours *= RECOMPUTE_TIME_FACTOR
        notes.append("activation checkpointing: each block's forward recomputed, 4/3 the time")
    if dtype == "fp16":
        notes.append(f"{offer.accelerator} has no bf16: used its dense fp16 peak {tflops} TFLOPS")
    return hours, notes


def suggest_nodes(job: JobModel, offer: Offer, target_hours: float) -> int | None:
    """Fewest nodes whose compute time is within ``target_hours``; None when even
    :data:`MAX_SUGGESTED_NODES` is not enough (or the job's hours are given, so nodes do not help)."""
    if job.hours is not None:
        return None
    lo, hi = 1, MAX_SUGGESTED_NODES
    if compute_hours(job, offer, hi)[0] > target_hours:
        return None
    while lo < hi:                      # compute hours fall monotonically with nodes
        mid = (lo + hi) // 2
        if compute_hours(job, offer, mid)[0] <= target_hours:
            hi = mid
        else:
            lo = mid + 1
    return lo


def reserved_cost(T: float, rate: float, term_hours: float, on_demand_rate: float | None) -> tuple[float, int, str]:
    """(cost, commitments, plan) for ``T`` hours on reserved capacity at ``rate`` $/h (all nodes).

    ``ceil(T / term)`` commitments, or ``floor(T / term)`` commitments plus on-demand for the
    remainder when that is cheaper (needs ``on_demand_rate``, all nodes). A job shorter than one
    term always buys one commitment (otherwise it is simply on-demand).
    """
    commitment = rate * term_hours
    full = max(1, math.ceil(T / term_hours - 1e-12))
    best = (full * commitment, full, f"{full} commitment{'s' if full != 1 else ''}")
    whole = math.floor(T / term_hours + 1e-12)
    if on_demand_rate is not None and whole >= 1 and whole < full:
        mixed = whole * commitment + (T - whole * term_hours) * on_demand_rate
        if mixed < best[0]:
            best = (mixed, whole, f"{whole} commitment{'s' if whole != 1 else ''} + "
                                  f"{T - whole * term_hours:,.0f} h on-demand")
    return best


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
                   budget_usd: float | None = None, on_demand_ref: float | None = None,
                   spot_ref: float | None = None) -> Estimate:
    """One offer's estimate (see the module docstring for the model).

    ``on_demand_ref`` / ``spot_ref``: the same instance's on-demand and spot price per hour in
    that region (one instance), for a reserved row's break-even and remainder.
    """
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise InputError(Problem("--nodes", nodes, "a whole number >= 1"))
    T, notes = compute_hours(job, offer, nodes)
    rate = offer.usd_per_hour * nodes
    mfu = None if job.hours is not None else _mfu(job, offer, nodes)[0]
    est = Estimate(offer=offer, nodes=nodes, usd_per_hour=rate, compute_hours=T, expected_hours=T,
                   expected_cost_usd=T * rate, p_deadline_miss=None, notes=notes, mfu=mfu,
                   gpu_hours=T * nodes * offer.accelerator_count)
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
        term = HOURS_PER_YEAR * years
        od_rate = on_demand_ref * nodes if on_demand_ref else None
        cost, terms, plan = reserved_cost(T, rate, term, od_rate)
        est.expected_cost_usd = cost
        est.reserved_terms = terms
        est.reserved_plan = plan
        notes.append(f"{plan}: ${cost:,.0f} for {T:,.0f} h ({T / term:.2%} of a {years}-year term; "
                     f"each commitment ${rate * term:,.0f}, due whatever this job uses)")
        if on_demand_ref:
            est.break_even_vs_on_demand = offer.usd_per_hour / on_demand_ref
            notes.append(f"break-even utilisation {est.break_even_vs_on_demand:.0%} of the term vs on-demand "
                         f"${on_demand_ref:.2f}/h")
        if spot_ref:
            est.break_even_vs_spot = offer.usd_per_hour / spot_ref
            be = est.break_even_vs_spot
            notes.append(f"break-even utilisation {be:.0%} vs same-region spot ${spot_ref:.2f}/h"
                         if be <= 1 else f"never beats same-region spot ${spot_ref:.2f}/h (reserved costs {be:.2f}× spot)")
        if deadline_hours is not None:
            est.p_deadline_miss = 0.0 if T <= deadline_hours else 1.0
    else:
        if deadline_hours is not None:
            est.p_deadline_miss = 0.0 if T <= deadline_hours else 1.0
    _long_run_warning(est, job, offer, deadline_hours)
    if budget_usd is not None and est.expected_cost_usd > budget_usd:
        notes.append(f"over budget: expected ${est.expected_cost_usd:,.0f} > ${budget_usd:,.0f}")
    return est


def _long_run_warning(est: Estimate, job: JobModel, offer: Offer, deadline_hours: float | None) -> None:
    """Warn when the plan runs for months (or misses the deadline) and name the nodes that fix it."""
    from spotwise.output import fmt_duration

    E = est.expected_hours
    target = deadline_hours if deadline_hours is not None else LONG_RUN_HOURS
    if E <= target and E <= LONG_RUN_HOURS:
        return
    msg = f"runs {fmt_duration(E)} on {est.nodes} node{'s' if est.nodes != 1 else ''}"
    if deadline_hours is not None and E > deadline_hours:
        msg += f", past the {fmt_duration(deadline_hours)} deadline"
    # Spot adds overhead on top of compute time; aim the compute time a little under the target.
    slack = est.compute_hours / E if math.isfinite(E) and E > 0 else 0.8
    n = suggest_nodes(job, offer, target * slack)
    if n is not None and n != est.nodes:
        est.suggested_nodes = n
        goal = "meet the deadline" if deadline_hours is not None else f"finish within {fmt_duration(target)}"
        msg += f"; {n} nodes would {goal}"
    elif job.hours is not None:
        msg += " (hours given: more nodes are not modelled)"
    est.warnings.append(msg)


def estimate(accelerators: dict[str, int], job: JobModel, *, nodes: int = 1, clouds=None, regions=None,
             market=None, deadline_hours: float | None = None, budget_usd: float | None = None,
             best_per_cloud_market: bool = True, catalog=None) -> list[Estimate]:
    """Estimates for every matching offer (or the cheapest per cloud × market), cheapest expected cost first."""
    from spotwise.pricing.catalog import default_catalog

    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise InputError(Problem("--nodes", nodes, "a whole number >= 1"))
    if deadline_hours is not None and not deadline_hours > 0:
        raise InputError(Problem("--deadline-hours", deadline_hours, "a number > 0"))
    if budget_usd is not None and not budget_usd > 0:
        raise InputError(Problem("--budget", budget_usd, "a number > 0 (USD)"))
    cat = catalog or default_catalog()
    markets = market if market is not None else [m.value for m in Market]
    offers = cat.find_offers(accelerators, clouds=clouds, regions=regions, market=markets, nodes=nodes)
    refs: dict[str, dict[tuple, float]] = {"on-demand": {}, "spot": {}}
    for o in cat.find_offers(accelerators, clouds=clouds, regions=regions, market=["on-demand", "spot"], nodes=nodes):
        ref = refs[o.market.value]
        k = (o.cloud, o.instance_type, o.region)
        ref[k] = min(ref.get(k, o.usd_per_hour), o.usd_per_hour)
    out = []
    for o in offers:
        k = (o.cloud, o.instance_type, o.region)
        out.append(estimate_offer(o, job, nodes=nodes, deadline_hours=deadline_hours, budget_usd=budget_usd,
                                  on_demand_ref=refs["on-demand"].get(k), spot_ref=refs["spot"].get(k)))
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
    """(parameters, tokens) of a task's built-in model. The llama: its exact parameter count; the
    GPT: 12·L·d² + vocab·d + seq·d. Tokens: steps × batch × seq."""
    llama = spec.training.llama
    if llama is not None:
        tokens = spec.training.steps * spec.training.batch_size * llama.seq_len
        return float(llama.n_params()), float(tokens)
    m = spec.training.model
    params = 12 * m.n_layers * m.d_model ** 2 + 256 * m.d_model + m.seq_len * m.d_model
    tokens = spec.training.steps * spec.training.batch_size * m.seq_len
    return float(params), float(tokens)


def flops_per_token_from_taskspec(spec) -> float | None:
    """Training FLOPs per token of a task's built-in llama (matmuls + attention); None for the GPT,
    which is priced at 6 FLOPs per parameter per token as before."""
    llama = spec.training.llama
    return llama.train_flops_per_token() if llama is not None else None

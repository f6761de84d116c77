"""The run as its readers see it: the policy (:func:`observation`), :class:`~spotwise.engine.run.steering.Steering`
(:func:`steering_view`) and the live display (:func:`progress`).

Each is a snapshot built from what the parts already hold — the driver's last snapshot, the
ledger, the fleet's nodes, the market watch — so building one asks no cloud and no job. They
are pure reads: a view never changes a part, which is why the orchestrator can build one at any
point of a tick and a test can build one from parts it made itself.
"""

from __future__ import annotations

import time
from typing import Iterable

from spotwise.engine.display.progress import Pace, Progress, last_eval, nodes_by_place
from spotwise.engine.plan.planner import Plan
from spotwise.engine.run.driver import Driver
from spotwise.engine.run.fleet import Fleet
from spotwise.engine.run.journal import Journal
from spotwise.engine.run.market_watch import MarketWatch
from spotwise.engine.run.purse import Purse
from spotwise.engine.run.steering import View, cluster_prices
from spotwise.policies.base import ON_DEMAND, SPOT, Observation
from spotwise.provisioner.base import Node
from spotwise.taskspec import TaskSpec


def fixed_market(spec: TaskSpec) -> str | None:
    """The task's market when it fixes one (spot or on-demand); None when the policy chooses."""
    m = spec.resources.market
    return m if m in (SPOT, ON_DEMAND) else None


def observation(*, spec: TaskSpec, plan: Plan, sites: list[str], tick_s: float, driver: Driver, fleet: Fleet,
                watch: MarketWatch, journal: Journal, purse: Purse) -> Observation:
    """What the policy knows: work measured in hours at the pace training has shown so far (its
    own pace since its first step, not the cluster's boot time; before a step, the plan's
    estimate), the prices of one site or of every site of the plan when it allows several (the
    policy's multi-region mode: it answers with a site, and another site means a migration)."""
    now = time.time()
    elapsed_h = (now - driver.started) / 3600 if driver.started else 0.0
    frac = min(1.0, driver.step / max(1, spec.training.steps))
    t0 = driver.snapshot.get("started_at")
    train_h = (now - float(t0)) / 3600 if t0 else 0.0
    task_h = train_h / frac if frac > 0 and train_h > 0 else plan.chosen.expected_hours
    restart_s = driver.restart_s
    site = fleet.site()
    shown = sites if len(sites) > 1 else [site]
    prices = cluster_prices(plan.offers, shown, fleet.num_workers)
    return Observation(elapsed_h=elapsed_h, deadline_h=spec.deadline_hours or float("inf"), task_h=task_h,
                       work_done_h=frac * task_h,
                       restart_h=sum(restart_s) / len(restart_s) / 3600 if restart_s else 0.0,
                       tick_h=tick_s / 3600, current=fleet.current_market(), region=site,
                       spot_available=watch.availability(shown, now, spot_running=fleet.spot_running()),
                       spot_price=prices[SPOT], on_demand_price=prices[ON_DEMAND],
                       preemptions=journal.preemptions, spent_usd=purse.ledger.spend(), budget_usd=purse.budget_usd)


def steering_view(obs: Observation, *, now: float, spec: TaskSpec, sites: list[str], fleet: Fleet,
                  watch: MarketWatch, journal: Journal, stopping: bool) -> View:
    """The run as :class:`~spotwise.engine.run.steering.Steering` sees it (blocked sites as of ``now``)."""
    here = fleet.site()
    return View(obs=obs, here=here, sites=tuple(sites), missing=fleet.missing(), current=fleet.current_market(),
                worker_markets=tuple(w.market for w in fleet.workers()), fixed_market=fixed_market(spec),
                blocked=watch.blocked_pairs({*sites, here}, now), spot_refused=watch.spot_refused(now),
                stopping=stopping, draining=bool(fleet.draining), migrations=len(journal.migrations),
                cluster_up=fleet.head is not None, noticed=len(fleet.noticed))


def gpu_peak_tflops(workers: Iterable[Node]) -> float | None:
    """One GPU's dense peak (TFLOPS, bf16 or else fp16: :func:`spotwise.pricing.estimate.gpu_peaks`)
    of the workers' instance type, the first worker's (a cluster is one type); None on CPU, for an
    instance type the table does not know (the local cloud's), or a GPU without a published peak."""
    from spotwise.pricing.estimate import gpu_peaks
    from spotwise.provisioner.instance_types import lookup

    for w in workers:
        it = lookup(w.cloud, w.instance_type)
        if it is not None and it.accelerator != "cpu":
            peak = gpu_peaks().get(it.accelerator)
            return peak[0] if peak else None
    return None


def speed(snapshot: dict, workers: Iterable[Node]) -> dict:
    """The run's speed as the display, curves and ``/metrics`` show it: ``tokens_per_s`` and
    ``peak_memory_bytes`` as training measured them (:class:`spotwise.runtime.training.loop.StepMeter`),
    and ``mfu``: the model FLOPs per second over ``ranks x`` one GPU's peak (:func:`gpu_peak_tflops`).
    A figure training could not give, or MFU without a GPU peak, is absent."""
    raw = snapshot.get("perf")
    perf: dict = raw if isinstance(raw, dict) else {}
    out = {k: float(perf[k]) for k in ("tokens_per_s", "peak_memory_bytes")
           if isinstance(perf.get(k), (int, float))}
    flops, world = perf.get("model_flops_per_s"), perf.get("world")
    if isinstance(flops, (int, float)) and isinstance(world, (int, float)) and world > 0:
        peak = gpu_peak_tflops(workers)
        if peak:
            out["mfu"] = float(flops) / (world * peak * 1e12)
    return out


def progress(now: float, *, spec: TaskSpec, begun: float, pace: Pace, driver: Driver, purse: Purse,
             fleet: Fleet, fast: dict | None = None) -> Progress:
    """The run as the live display shows it (:mod:`spotwise.engine.display.progress`). The deadline
    counts from ``begun`` (when the run was set up); a step counts once training has started."""
    snap = driver.snapshot
    step = snap.get("step") if isinstance(snap.get("step"), int) and snap.get("started_at") else None
    loss = snap.get("loss")
    deadline_h = spec.deadline_hours
    return Progress(t=now, steps_total=spec.training.steps, spend_usd=purse.ledger.spend(now),
                    step=step, loss=float(loss) if isinstance(loss, (int, float)) else None, eval_loss=last_eval(snap),
                    steps_per_s=pace.add(now, step), budget_usd=purse.budget_usd,
                    deadline_at=begun + deadline_h * 3600 if deadline_h else None,
                    nodes=nodes_by_place(fleet.nodes.values()),
                    tokens_per_s=(fast or {}).get("tokens_per_s"), mfu=(fast or {}).get("mfu"),
                    peak_memory_bytes=(fast or {}).get("peak_memory_bytes"))

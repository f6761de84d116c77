"""Prometheus metrics, read from the database at scrape time (so several servers agree).

``spotwise_jobs{status}``, ``spotwise_spend_usd_total{cloud,market}``,
``spotwise_preemptions_total``, ``spotwise_checkpoint_age_seconds{job_id}`` (running jobs: since
their newest checkpoint event, else since they started), ``spotwise_budget_remaining_usd{budget}``
and ``spotwise_budget_cap_usd{budget}``; per running job, from its newest curve point
(:mod:`spotwise.engine.run.curves`): ``spotwise_job_step{job_id}``, ``spotwise_job_loss{job_id}`` (absent
until a finite loss is reported) and ``spotwise_job_spend_usd{job_id}``, and ``spotwise_job_eval_loss{job_id}`` (the newest held-out loss,
absent without ``training.eval``), and the run's speed: ``spotwise_job_tokens_per_second``,
``spotwise_job_mfu`` (0..1, against the workers' GPU peak; absent on CPU) and
``spotwise_job_peak_memory_bytes`` (each absent when training could not say).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from spotwise.engine.work import budgets
from spotwise.engine.state import reports

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class DatabaseCollector:
    def collect(self):
        now = time.time()
        t = reports.totals(now)
        jobs = GaugeMetricFamily("spotwise_jobs", "Jobs by status", labels=["status"])
        for status, n in t.jobs_by_status.items():
            jobs.add_metric([status], n)
        yield jobs
        spend = CounterMetricFamily("spotwise_spend_usd", "Ledger spend by cloud and market (USD)",
                                    labels=["cloud", "market"])
        for (cloud, market), usd in t.spend_by_cloud_market.items():
            spend.add_metric([cloud, market], usd)
        yield spend
        pre = CounterMetricFamily("spotwise_preemptions", "Spot preemptions over all jobs")
        pre.add_metric([], float(t.preemptions))
        yield pre
        age = GaugeMetricFamily("spotwise_checkpoint_age_seconds",
                                "Running jobs: seconds since the newest checkpoint (or start)", labels=["job_id"])
        for job_id, seconds in t.checkpoint_age_s.items():
            age.add_metric([job_id], seconds)
        yield age
        rem = GaugeMetricFamily("spotwise_budget_remaining_usd", "Budget left this period (USD)", labels=["budget"])
        cap = GaugeMetricFamily("spotwise_budget_cap_usd", "Budget cap (USD)", labels=["budget"])
        for b in budgets.list_budgets(at=now):
            rem.add_metric([b.id], b.remaining_usd)
            cap.add_metric([b.id], b.cap_usd)
        yield rem
        yield cap
        yield from running_jobs()


def running_jobs():
    """Step, loss and spend of each running job, as its newest curve point has them."""
    from sqlalchemy import select

    from spotwise.engine.run import curves
    from spotwise.engine.state import db

    with db.session() as s:
        ids = list(s.scalars(select(db.Job.id).where(db.Job.status == "running")))
    pts = curves.latest(ids)
    step = GaugeMetricFamily("spotwise_job_step", "Running jobs: the step training last reported", labels=["job_id"])
    loss = GaugeMetricFamily("spotwise_job_loss", "Running jobs: the loss training last reported (averaged over the ranks)",
                             labels=["job_id"])
    spend = GaugeMetricFamily("spotwise_job_spend_usd", "Running jobs: spend so far (USD)", labels=["job_id"])
    held_out = GaugeMetricFamily("spotwise_job_eval_loss", "Running jobs: the newest held-out loss (training.eval)",
                                 labels=["job_id"])
    for job_id, v in sorted(curves.latest_eval(ids).items()):
        held_out.add_metric([job_id], v)
    fast = {k: GaugeMetricFamily(f"spotwise_job_{name}", f"Running jobs: {what}", labels=["job_id"])
            for k, name, what in (("tokens_per_s", "tokens_per_second", "global training tokens per second"),
                                  ("mfu", "mfu", "model FLOPs utilisation against the workers' GPU peak (0..1)"),
                                  ("peak_memory_bytes", "peak_memory_bytes",
                                   "a rank's peak memory (CUDA allocated, or the process's peak RSS on CPU)"))}
    for job_id, p in sorted(pts.items()):
        for k, g in fast.items():
            if p.get(k) is not None:
                g.add_metric([job_id], float(p[k]))
        if p["step"] is not None:
            step.add_metric([job_id], float(p["step"]))
        if p["loss"] is not None:
            loss.add_metric([job_id], p["loss"])
        spend.add_metric([job_id], p["spend_usd"])
    yield step
    yield loss
    yield spend
    yield held_out
    yield from fast.values()


def render() -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DatabaseCollector())
    return generate_latest(reg)

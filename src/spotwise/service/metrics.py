"""Prometheus metrics, read from the database at scrape time (so several servers agree).

``spotwise_jobs{status}``, ``spotwise_spend_usd_total{cloud,market}``,
``spotwise_preemptions_total``, ``spotwise_checkpoint_age_seconds{job_id}`` (running jobs: since
their newest checkpoint event, else since they started), ``spotwise_budget_remaining_usd{budget}``
and ``spotwise_budget_cap_usd{budget}``.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy import func, select

from spotwise.engine import budgets, db

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class DatabaseCollector:
    def collect(self):
        now = time.time()
        with db.session() as s:
            jobs = GaugeMetricFamily("spotwise_jobs", "Jobs by status", labels=["status"])
            for status, n in s.execute(select(db.Job.status, func.count()).group_by(db.Job.status)):
                jobs.add_metric([status], n)
            yield jobs
            spend = CounterMetricFamily("spotwise_spend_usd", "Ledger spend by cloud and market (USD)",
                                        labels=["cloud", "market"])
            for cloud, market, usd in s.execute(select(db.LedgerEntry.cloud, db.LedgerEntry.market,
                                                       func.sum(db.LedgerEntry.usd))
                                                .group_by(db.LedgerEntry.cloud, db.LedgerEntry.market)):
                spend.add_metric([cloud, market], float(usd or 0.0))
            yield spend
            pre = CounterMetricFamily("spotwise_preemptions", "Spot preemptions over all jobs")
            pre.add_metric([], float(s.scalar(select(func.count()).select_from(db.Event)
                                              .where(db.Event.kind == "preempted")) or 0))
            yield pre
            age = GaugeMetricFamily("spotwise_checkpoint_age_seconds",
                                    "Running jobs: seconds since the newest checkpoint (or start)", labels=["job_id"])
            for j in s.scalars(select(db.Job).where(db.Job.status == "running")):
                last = s.scalar(select(func.max(db.Event.t)).where(db.Event.job_id == j.id,
                                                                   db.Event.kind.like("%checkpoint%")))
                ref = last or j.started_at or j.created_at
                age.add_metric([j.id], max(0.0, now - ref))
            yield age
        rem = GaugeMetricFamily("spotwise_budget_remaining_usd", "Budget left this period (USD)", labels=["budget"])
        cap = GaugeMetricFamily("spotwise_budget_cap_usd", "Budget cap (USD)", labels=["budget"])
        for b in budgets.list_budgets(at=now):
            rem.add_metric([b.id], b.remaining_usd)
            cap.add_metric([b.id], b.cap_usd)
        yield rem
        yield cap


def render() -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DatabaseCollector())
    return generate_latest(reg)

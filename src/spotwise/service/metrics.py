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

from spotwise.engine import budgets, reports

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


def render() -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DatabaseCollector())
    return generate_latest(reg)

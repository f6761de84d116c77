"""Billing: every second of every node at the price in force when it was launched.

A node opens an account when it launches (price, source and date copied from its Offer) and is
billed in whole seconds as time passes; on termination the last partial second is billed as a
full one. Entries are append-only rows of :class:`~spotwise.engine.db.LedgerEntry`; spend is their
sum, so a report can always be re-derived from the ledger.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from sqlalchemy.orm import Session

from spotwise.provisioner.base import Node
from spotwise.engine import db


class Ledger:
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self._open: dict[str, db.NodeRecord] = {}
        self._lock = threading.Lock()
        self._billed_usd = 0.0
        self._hours: dict[str, float] = {}

    # -- accounts ------------------------------------------------------------------------------
    def open(self, node: Node) -> None:
        with self._lock:
            rec = db.NodeRecord(
                instance_id=node.instance_id, job_id=self.job_id, cluster_id=node.cluster_id,
                cloud=node.cloud, instance_type=node.instance_type, region=node.region,
                zone=node.zone, market=node.market, role=node.role,
                usd_per_hour=node.usd_per_hour,
                price_source=str(node.extra.get("price_source", "unknown")),
                price_as_of=str(node.extra.get("price_as_of", "unknown")),
                launched_at=node.launched_at or time.time(),
                billed_until=node.launched_at or time.time())
            db.write(lambda s: s.add(_copy(rec)))
            self._open[node.instance_id] = rec

    def close(self, instance_id: str, *, at: float | None = None, reason: str = "terminated") -> None:
        with self._lock:
            rec = self._open.pop(instance_id, None)
            if rec is None:
                return
            end = at or time.time()
            self._bill_one(rec, end, final=True)

            def do(s: Session) -> None:
                row = db.lock_row(s, db.NodeRecord, instance_id)
                if row is not None:
                    row.billed_until = rec.billed_until
                    row.terminated_at = end
                    row.end_reason = reason
            db.write(do)

    def close_all(self, reason: str = "teardown") -> None:
        for iid in list(self._open):
            self.close(iid, reason=reason)

    # -- billing -------------------------------------------------------------------------------
    def bill(self, now: float | None = None) -> None:
        """Bill every open node up to ``now`` in whole seconds."""
        now = now or time.time()
        with self._lock:
            for rec in self._open.values():
                self._bill_one(rec, now, final=False)

    def _bill_one(self, rec: db.NodeRecord, end: float, *, final: bool) -> None:
        span = end - rec.billed_until
        seconds = math.ceil(span - 1e-9) if final else math.floor(span)
        if seconds <= 0:
            return
        start = rec.billed_until
        until = start + seconds
        usd = seconds * rec.usd_per_hour / 3600.0

        def do(s: Session) -> None:   # the entry and the node's billed_until move together, or not at all
            s.add(db.LedgerEntry(job_id=self.job_id, instance_id=rec.instance_id, cloud=rec.cloud,
                                 market=rec.market, start=start, end=until,
                                 seconds=seconds, usd_per_hour=rec.usd_per_hour, usd=usd,
                                 price_source=rec.price_source, price_as_of=rec.price_as_of))
            row = db.lock_row(s, db.NodeRecord, rec.instance_id)
            if row is not None:
                row.billed_until = until
        db.write(do)
        rec.billed_until = until
        self._billed_usd += usd
        self._hours[rec.market] = self._hours.get(rec.market, 0.0) + seconds / 3600.0

    # -- queries -------------------------------------------------------------------------------
    def rate_usd_per_hour(self) -> float:
        with self._lock:
            return sum(r.usd_per_hour for r in self._open.values())

    def spend(self, now: float | None = None) -> float:
        """Billed so far plus what open nodes have accrued (rounded up to whole seconds)."""
        now = now or time.time()
        with self._lock:
            accrued = sum(math.ceil(max(0.0, now - r.billed_until)) * r.usd_per_hour / 3600.0
                          for r in self._open.values())
            return self._billed_usd + accrued

    def hours_by_market(self) -> dict[str, float]:
        return dict(self._hours)

    def open_ids(self) -> list[str]:
        with self._lock:
            return list(self._open)


def _copy(rec: db.NodeRecord) -> db.NodeRecord:
    """A detached copy to insert (the ledger keeps ``rec`` as its in-memory account)."""
    cols = [c.key for c in db.NodeRecord.__table__.columns]
    return db.NodeRecord(**{k: getattr(rec, k) for k in cols})


def cost_report(job_id: str | None = None) -> dict[str, Any]:
    """Aggregate the append-only ledger. Every figure is a sum of ledger rows, each billed per
    second at the price (with its source and date) in force when the node launched.

    The one cost query: ``spotwise cost-report`` and ``GET /api/v1/cost-report`` both answer with
    this dict: ``total_usd``, ``by_market`` (USD per market) and ``rows`` (one per job, cloud,
    market and price, with ``hours`` and ``cost_usd``)."""
    from sqlalchemy import func, select

    L = db.LedgerEntry
    with db.session() as s:
        q = select(L.job_id, L.cloud, L.market, L.usd_per_hour, L.price_source, L.price_as_of,
                   func.sum(L.seconds), func.sum(L.usd)).group_by(
            L.job_id, L.cloud, L.market, L.usd_per_hour, L.price_source, L.price_as_of)
        if job_id:
            q = q.where(L.job_id == job_id)
        rows: list[dict[str, Any]] = []
        by_market: dict[str, float] = {}
        for j, c, m, p, src, asof, secs, usd in s.execute(q):
            cost = round(usd or 0.0, 6)
            rows.append({"job_id": j, "cloud": c, "market": m, "usd_per_hour": p, "price_source": src,
                         "price_as_of": asof, "hours": round((secs or 0) / 3600, 6), "cost_usd": cost})
            by_market[m] = round(by_market.get(m, 0.0) + cost, 6)
    total = round(sum(r["cost_usd"] for r in rows), 6)
    return {"total_usd": total, "by_market": by_market, "rows": rows}

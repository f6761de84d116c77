"""Billing: every second of every node at the price in force when it was launched.

A node opens an account when it launches (price, source and date copied from its Offer) and is
billed in whole seconds as time passes; on termination the last partial second is billed as a
full one. Entries are append-only rows of :class:`~spotwise.engine.state.db.LedgerEntry`; spend is their
sum, so a report can always be re-derived from the ledger.

What the cloud bills for a node besides the instance (its boot disk, its public IPv4 address:
:mod:`spotwise.pricing.attached`) opens an account of its own with the node (``charges``), id
``<instance id>/<kind>``, market ``disk`` or ``ipv4`` (an instance's is ``spot`` or ``on-demand``),
each at its published price with that price's source and date; it is billed the same way and
closed with its node. Spend and the burn rate — what the budget cap and the lease read — include them.

A one-off charge (:meth:`Ledger.charge`: the egress of copying a checkpoint between two clouds'
stores) is one row of 0 seconds carrying its amount, its price per GB's source and date, market
``egress``; spend includes it from the moment it is recorded.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from spotwise.provisioner.base import Node
from spotwise.engine.state import db

#: the markets of an instance's account; any other (``disk``, ``ipv4``) is what a node carries
INSTANCE_MARKETS = ("spot", "on-demand")


class Ledger:
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self._open: dict[str, db.NodeRecord] = {}
        self._lock = threading.Lock()
        self._billed_usd = 0.0
        self._hours: dict[str, float] = {}
        self._carried: dict[str, list[str]] = {}     # instance id -> the account ids of what it carries

    def carry_over(self) -> float:
        """Start from what the job has already billed (a resumed job: its earlier legs' rows), so
        :meth:`spend` — what the cap, the lease and the policy read — is the whole job's, and the
        hours by market too. Returns that spend. Nothing is billed again: the rows stay as they are."""
        from sqlalchemy import func, select

        L = db.LedgerEntry
        with db.session() as s:
            rows = s.execute(select(L.market, func.sum(L.usd), func.sum(L.seconds)).where(L.job_id == self.job_id)
                             .group_by(L.market)).all()
        with self._lock:
            self._billed_usd = sum(float(usd or 0.0) for _, usd, _ in rows)
            self._hours = {m: float(secs or 0) / 3600.0 for m, _, secs in rows if m in INSTANCE_MARKETS}
            return self._billed_usd

    # -- accounts ------------------------------------------------------------------------------
    def open(self, node: Node, charges: Sequence[Any] = ()) -> None:
        """Open the node's account, and one for each of ``charges`` (what it carries:
        :class:`spotwise.pricing.attached.Charge`), all from the node's launch."""
        start = node.launched_at or time.time()
        recs = [db.NodeRecord(
            instance_id=node.instance_id, job_id=self.job_id, cluster_id=node.cluster_id,
            cloud=node.cloud, instance_type=node.instance_type, region=node.region,
            zone=node.zone, market=node.market, role=node.role,
            usd_per_hour=node.usd_per_hour,
            price_source=str(node.extra.get("price_source", "unknown")),
            price_as_of=str(node.extra.get("price_as_of", "unknown")),
            launched_at=start, billed_until=start)]
        recs += [db.NodeRecord(
            instance_id=f"{node.instance_id}/{c.kind}", job_id=self.job_id, cluster_id=node.cluster_id,
            cloud=node.cloud, instance_type=c.what[:64], region=node.region, zone=node.zone, market=c.kind,
            role=node.role, usd_per_hour=c.usd_per_hour, price_source=c.source, price_as_of=c.as_of[:32],
            launched_at=start, billed_until=start) for c in charges]
        with self._lock:
            db.write(lambda s: s.add_all([_copy(r) for r in recs]))
            for r in recs:
                self._open[r.instance_id] = r
            if charges:
                self._carried[node.instance_id] = [r.instance_id for r in recs[1:]]

    def close(self, instance_id: str, *, at: float | None = None, reason: str = "terminated") -> None:
        """Close the account of ``instance_id`` and of what it carries, billed to ``at`` (else now)
        with the last partial second as a whole one, in one transaction."""
        with self._lock:
            ids = [instance_id, *self._carried.pop(instance_id, [])]
            recs = [r for r in (self._open.pop(i, None) for i in ids) if r is not None]
            if recs:
                self._settle(recs, at or time.time(), final=True, reason=reason)

    def close_all(self, reason: str = "teardown") -> None:
        with self._lock:
            recs = list(self._open.values())
            self._open.clear()
            self._carried.clear()
            if recs:
                self._settle(recs, time.time(), final=True, reason=reason)

    def charge(self, what: str, *, cloud: str, market: str, usd: float, source: str, as_of: str,
               at: float | None = None) -> None:
        """Record a one-off charge of ``usd`` (not a price per hour: ``what`` names the item, e.g.
        ``egress/step-40/gcp->aws``) as one append-only row of 0 seconds at ``at`` (else now)."""
        if not math.isfinite(usd) or usd < 0:
            raise ValueError(f"a charge must be a finite amount >= 0, not {usd!r}")
        t = at or time.time()
        fields = dict(job_id=self.job_id, instance_id=what[:128], cloud=cloud, market=market, start=t, end=t,
                      seconds=0, usd_per_hour=0.0, usd=usd, price_source=source or "unknown",
                      price_as_of=(as_of or "unknown")[:32])
        with self._lock:
            db.write(lambda s: s.add(db.LedgerEntry(**fields)))   # a fresh row on each try
            self._billed_usd += usd

    # -- billing -------------------------------------------------------------------------------
    def bill(self, now: float | None = None) -> None:
        """Bill every open account up to ``now`` in whole seconds (one transaction for all of them)."""
        now = now or time.time()
        with self._lock:
            self._settle(list(self._open.values()), now, final=False)

    def _settle(self, recs: list[db.NodeRecord], end: float, *, final: bool, reason: str = "") -> None:
        """Bill ``recs`` up to ``end`` in whole seconds — ``final``: the last partial second as a
        whole one, and mark them ended with ``reason`` — in one transaction: each entry and its
        account's ``billed_until`` move together, or not at all."""
        due: dict[str, int] = {}
        for rec in recs:
            span = end - rec.billed_until
            seconds = math.ceil(span - 1e-9) if final else math.floor(span)
            if seconds > 0:
                due[rec.instance_id] = seconds
        if not due and not final:
            return

        def do(s: Session) -> None:   # re-run whole on a lost race: reads ``recs`` only, changes them after
            for rec in recs:
                seconds = due.get(rec.instance_id, 0)
                if seconds:
                    s.add(db.LedgerEntry(job_id=self.job_id, instance_id=rec.instance_id, cloud=rec.cloud,
                                         market=rec.market, start=rec.billed_until, end=rec.billed_until + seconds,
                                         seconds=seconds, usd_per_hour=rec.usd_per_hour,
                                         usd=seconds * rec.usd_per_hour / 3600.0,
                                         price_source=rec.price_source, price_as_of=rec.price_as_of))
                if seconds or final:
                    row = db.lock_row(s, db.NodeRecord, rec.instance_id)
                    if row is not None:
                        row.billed_until = rec.billed_until + seconds
                        if final:
                            row.terminated_at, row.end_reason = end, reason
        db.write(do)
        for rec in recs:
            seconds = due.get(rec.instance_id, 0)
            rec.billed_until += seconds
            self._billed_usd += seconds * rec.usd_per_hour / 3600.0
            if seconds and rec.market in INSTANCE_MARKETS:
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
        """Instance-hours billed per market (``spot``, ``on-demand``; not disks or addresses)."""
        return dict(self._hours)

    def open_ids(self) -> list[str]:
        """Open accounts: instances and what they carry."""
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
    this dict: ``total_usd``, ``by_market`` (USD per market: ``spot``, ``on-demand``, and ``disk`` /
    ``ipv4`` for what nodes carried, ``egress`` for checkpoints copied between clouds) and ``rows`` (one per job, cloud, market and price, with
    ``hours`` and ``cost_usd``)."""
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

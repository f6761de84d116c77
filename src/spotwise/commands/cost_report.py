"""``spotwise cost-report``: spend from the ledger, by job, cloud and market, with price provenance."""

from __future__ import annotations

from typing import Optional

import typer

from spotwise.output import Format, print_json, print_table


def cost_report(job_id: str | None = None) -> dict:
    """Aggregate the append-only ledger. Every figure is a sum of ledger rows, each billed per
    second at the price (with its source and date) in force when the node launched."""
    from sqlalchemy import func, select

    from spotwise.service import db

    L = db.LedgerEntry
    with db.session() as s:
        q = select(L.job_id, L.cloud, L.market, L.usd_per_hour, L.price_source, L.price_as_of,
                   func.sum(L.seconds), func.sum(L.usd)).group_by(
            L.job_id, L.cloud, L.market, L.usd_per_hour, L.price_source, L.price_as_of)
        if job_id:
            q = q.where(L.job_id == job_id)
        rows = [{"job_id": j, "cloud": c, "market": m, "usd_per_hour": p, "price_source": src,
                 "price_as_of": asof, "hours": round((secs or 0) / 3600, 6), "cost_usd": round(usd or 0.0, 6)}
                for j, c, m, p, src, asof, secs, usd in s.execute(q)]
    total = round(sum(r["cost_usd"] for r in rows), 6)
    by_market: dict[str, float] = {}
    for r in rows:
        by_market[r["market"]] = round(by_market.get(r["market"], 0.0) + r["cost_usd"], 6)
    return {"total_usd": total, "by_market": by_market, "rows": rows}


def register(app: typer.Typer) -> None:
    @app.command("cost-report", help="What was spent, by job, cloud and market, from the ledger.")
    def cost_report_cmd(
        job: Optional[str] = typer.Option(None, "--job", help="one job id (default: all jobs)"),
        fmt: Format = typer.Option(Format.table, "--format", help="table or json"),
    ) -> None:
        from spotwise.errors import InputError, Problem
        from spotwise.service import db

        if job:
            with db.session() as s:
                if s.get(db.Job, job) is None:
                    raise InputError(Problem("--job", job, "the id of a job shown by `spotwise status`"))
        rep = cost_report(job)
        if fmt is Format.json:
            print_json(rep)
            return
        print_table(rep["rows"], ["job_id", "cloud", "market", "usd_per_hour", "hours", "cost_usd",
                                  "price_source", "price_as_of"], title="cost report")
        print(f"total: ${rep['total_usd']:.6f}  " + "  ".join(f"{k}: ${v:.6f}" for k, v in rep["by_market"].items()))

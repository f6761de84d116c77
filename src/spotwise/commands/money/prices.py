"""``spotwise prices``: list GPU offers cheapest first, from the snapshot or the live cache.

Fast path: only typer and :mod:`spotwise.output` (stdlib only) are imported at module load (the
CLI imports every command module); the catalog is read with the stdlib ``csv`` module and Rich is
imported only for ``--format table``.
"""

from __future__ import annotations

from typing import Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option, print_json, print_table

JSON_FIELDS = ("cloud", "instance_type", "accelerator", "accelerator_count", "region", "zone", "market",
               "payment_option", "usd_per_hour", "usd_per_gpu_hour", "vcpus", "memory_gib",
               "gpu_memory_gib", "source", "as_of", "as_of_kind", "flags")
TABLE_COLUMNS = ("cloud", "type", "gpus", "market", "$/h", "$/gpu-h", "region", "zone", "as_of", "source",
                 "flags")
#: Dropped, last first, when the table would be wider than the console.
OPTIONAL_COLUMNS = ("cloud", "gpus", "source", "$/gpu-h", "zone", "flags")
SORTS = ("price", "per-gpu")


def list_prices(*, gpu: str | None, count: int | None, cloud: str | None, region: str | None,
                market: str | None, max_price: float | None, limit: int | None, sort: str,
                include_flagged: bool, nodes: int = 1, include_stale: bool = False,
                collapse: bool = True) -> list[dict]:
    """The rows ``spotwise prices`` prints (JSON shape). Raises InputError naming the flag.

    ``collapse`` keeps one row per offer that differs only by zone or a ``-nolssd`` twin (the
    cheapest, first in rank order) and says in ``rows_collapsed`` how many rows it stands for.
    """
    from spotwise.errors import InputError, Problem
    from spotwise.pricing.accelerators import parse_request
    from spotwise.pricing.catalog import collapse_offers, default_catalog, parse_clouds, parse_markets

    if count is not None and not 1 <= count <= 16:
        raise InputError(Problem("--count", count, "a whole number 1..16"))
    if max_price is not None and max_price < 0:
        raise InputError(Problem("--max-price", max_price, "a number >= 0 (USD per hour)"))
    if limit is not None and limit < 1:
        raise InputError(Problem("--limit", limit, "a whole number >= 1"))
    if nodes < 1:
        raise InputError(Problem("--nodes", nodes, "a whole number >= 1"))
    if sort not in SORTS:
        raise InputError(Problem("--sort", sort, ", ".join(SORTS)))
    request = parse_request(gpu, count=count, field="--gpu") if gpu else None
    named = [c.strip().lower() for c in (cloud or "").split(",") if c.strip()]
    own = [c for c in named if c in SELF_PRICED]          # clouds that price themselves (Slurm)
    clouds = parse_clouds([c for c in named if c not in own], field="--cloud") if cloud else None
    markets = parse_markets(market, field="--market")
    regions = [r.strip() for r in region.split(",") if r.strip()] if region else None
    offers = []
    if clouds or not own:
        cat = default_catalog()
        if regions and not own:
            known = set(cat.regions()) | {o.zone for o in cat if o.zone}
            bad = [r for r in regions if r not in known]
            if bad:
                raise InputError(Problem("--region", bad[0], "a region (or zone) in the catalog: "
                                         + ", ".join(cat.regions())))
        offers = cat.select(request, clouds=clouds, regions=regions, market=markets, max_price=max_price,
                            nodes=nodes, include_flagged=include_flagged, include_stale=include_stale)
    if own:
        offers = sorted(offers + _self_priced(own, request, regions, markets, max_price, nodes),
                        key=lambda o: (o.usd_per_hour, o.cloud, o.region, o.zone, o.instance_type))
    if sort == "per-gpu":
        offers.sort(key=lambda o: (o.usd_per_gpu_hour, o.usd_per_hour, o.cloud, o.region, o.zone))
    grouped = collapse_offers(offers) if collapse else [(o, 1) for o in offers]
    if limit is not None:
        grouped = grouped[:limit]
    rows = []
    for o, n in grouped:
        d = o.to_dict()
        row = {k: d[k] for k in JSON_FIELDS}
        row["rows_collapsed"] = n
        rows.append(row)
    return rows


#: clouds whose offers come from the cloud itself, not the catalog, that ``--cloud`` may name
SELF_PRICED = ("slurm",)


def _self_priced(names: list[str], request, regions, markets, max_price, nodes) -> list:
    """The offers of the self-priced clouds ``names`` that match the flags; a cloud none of whose
    sites could be asked is an InputError (exit 2) with one line per site."""
    from spotwise.provisioner.base import get_cloud

    out = []
    for name in names:
        c = get_cloud(name)
        got = c.offers()
        if not got and c.skipped_regions:
            raise c.skipped_error()
        out += [o for o in got
                if (request is None or (o.accelerator in request
                                        and request[o.accelerator] in (None, o.accelerator_count)))
                and (not regions or o.region in regions or o.zone in regions)
                and (not markets or o.market in markets)
                and (max_price is None or o.usd_per_hour * nodes <= max_price)]
    return out


def short_source(source: str) -> str:
    """A table-sized name for a price source (the full one is in JSON and under the table)."""
    if "skypilot-catalog:catalogs/" in source:
        return "skypilot " + source.split("catalogs/")[1].split("/")[0]
    if source.startswith("config "):
        return "config file"
    if source.startswith("Cyclenerd"):
        return "cyclenerd"
    known = (("price-list verification", "aws price list"), ("dstack", "dstack PR"),
             ("compute-price-tracker", "azure retail api"), ("data-receipts", "data-receipts"),
             ("research appendix", "research appendix"))
    for needle, name in known:
        if needle in source:
            return name
    return source.removeprefix("reference:")[:24]


def commitment_notes(clouds, gpu_request) -> list[str]:
    """What is known about AWS commitments that are not 1y/3y hourly prices (shipped notes)."""
    import csv

    from spotwise.pricing.store import DATA_DIR

    path = DATA_DIR / "commitment_notes.csv"
    if clouds is not None and "aws" not in clouds or not path.is_file():
        return []
    out = ["AWS: no 1-year or 3-year reserved rate for p4d/p5 is known offline (only p5en 3-year "
           "EC2 Instance Savings Plan). What AWS sells instead:"]
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["kind"] == "capacity_block":
                out.append(f"  Capacity Block {r['instance_type']} {r['region']}: ${float(r['usd_per_hour']):.2f}/h "
                           f"for 1-day to multi-week blocks ({r['as_of']}; pre-2025 rate, not a 1y/3y term)")
            elif r["kind"] == "discount_pct_max":
                out.append(f"  {r['offer']}: up to {r['discount_pct_max']} % off on-demand, no per-instance "
                           f"GPU rate published ({r['source']})")
    out.append("  For live RI prices run: spotwise catalog refresh --cloud aws")
    return out


@COMMANDS.register("prices")
def register(app: typer.Typer) -> None:
    @app.command("prices", help="List GPU offers cheapest first (snapshot, or the live cache when present).")
    def prices(
        gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU name, NAME:COUNT, or alternatives "
                                          "'H100:8,A100-80GB:8'."),
        count: Optional[int] = typer.Option(None, "--count", help="GPUs per instance (for names without :COUNT)."),
        cloud: Optional[str] = typer.Option(None, "--cloud", help="Comma-separated: aws,gcp,azure,slurm (slurm: the "
                                          "config file's clusters)."),
        region: Optional[str] = typer.Option(None, "--region", help="Region(s) or zone(s), comma-separated."),
        market: Optional[str] = typer.Option(None, "--market", help="spot, on-demand, reserved-1y, reserved-3y "
                                             "(comma-separated; default: spot,on-demand)."),
        max_price: Optional[float] = typer.Option(None, "--max-price", help="Max USD/hour for the request "
                                                  "(nodes x instance price)."),
        nodes: int = typer.Option(1, "--nodes", help="Instances in the request (scales --max-price)."),
        limit: Optional[int] = typer.Option(None, "--limit", help="Show at most N offers."),
        sort: str = typer.Option("price", "--sort", help="price (USD/h per instance) or per-gpu."),
        include_flagged: bool = typer.Option(False, "--include-flagged",
                                             help="Also show rows whose price failed a data-quality check."),
        include_stale: bool = typer.Option(False, "--include-stale",
                                           help="Also show prices no current source confirms (with a warning)."),
        all_rows: bool = typer.Option(False, "--all", help="One row per zone and -nolssd variant (default: "
                                      "rows that differ only by those are collapsed)."),
        fmt: Format = format_option(),
    ) -> None:
        rows = list_prices(gpu=gpu, count=count, cloud=cloud, region=region, market=market,
                           max_price=max_price, limit=limit, sort=sort, include_flagged=include_flagged,
                           nodes=nodes, include_stale=include_stale, collapse=not all_rows)
        from spotwise.pricing.catalog import parse_clouds, parse_markets

        markets = {m.value for m in parse_markets(market, field="--market")}
        clouds = parse_clouds([c for c in (cloud or "").split(",") if c.strip().lower() not in SELF_PRICED],
                              field="--cloud") if cloud else None
        notes: list[str] = []
        if markets & {"reserved-1y", "reserved-3y"} and not any(r["cloud"] == "aws" for r in rows):
            notes = commitment_notes(clouds, gpu)
        stale = [r for r in rows if any(f.startswith("stale") or f == "on_demand_predates_2025_06_cut"
                                         for f in r["flags"])]
        if fmt is Format.json:
            if stale or notes:
                import sys

                for line in ([f"warning: {len(stale)} row(s) are stale: no current source confirms their price"]
                             if stale else []) + notes:
                    print(line, file=sys.stderr)
            print_json(rows)
            return
        from spotwise.pricing.offer import AS_OF_SYMBOL

        sources: dict[str, str] = {}
        payments: set[str] = set()
        for r in rows:
            r["gpus"] = f"{r['accelerator']}:{r['accelerator_count']}"
            r["type"] = r["instance_type"]
            r["$/h"] = f"${r['usd_per_hour']:,.2f}"
            r["$/gpu-h"] = f"${r['usd_per_gpu_hour']:,.2f}"
            r["flags"] = ",".join(r["flags"])
            r["as_of"] = AS_OF_SYMBOL.get(r["as_of_kind"], "") + r["as_of"]
            sources.setdefault(short_source(r["source"]), r["source"])
            r["source"] = short_source(r["source"])
            if r["rows_collapsed"] > 1:
                r["region"] = f"{r['region']} +{r['rows_collapsed'] - 1}"
            if r["payment_option"]:
                payments.add(r["payment_option"])
        title = f"{len(rows)} offer(s)" + (f" for {gpu}" if gpu else "") + ", cheapest first"
        if not rows:
            title += " — none match; try --include-flagged, another --market or fewer filters"
        foot = []
        if stale:
            foot.append(f"WARNING: {len(stale)} row(s) are stale (--include-stale): no current source confirms "
                        "their price; it may be far from today's")
        foot += notes
        if payments:
            foot.append("reserved rows are the effective hourly rate; payment: " + ", ".join(sorted(payments)))
        if rows:
            foot.append("as_of: ≤ no later than, ≥ no earlier than, ~ approximate; '+N' after a region: N more zones or "
                        "variants at this price (--all lists them)")
            foot += [f"source {k}: {v}" for k, v in sources.items() if k != v]
        print_table(rows, TABLE_COLUMNS, title=title, optional=OPTIONAL_COLUMNS, footnotes=foot)

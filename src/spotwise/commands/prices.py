"""``spotwise prices``: list GPU offers cheapest first, from the snapshot or the live cache.

Fast path: only typer is imported at module load (the CLI imports every command module); the
catalog is read with the stdlib ``csv`` module and Rich is imported only for ``--format table``.
"""

from __future__ import annotations

from typing import Optional

import typer

JSON_FIELDS = ("cloud", "instance_type", "accelerator", "accelerator_count", "region", "zone", "market",
               "payment_option", "usd_per_hour", "usd_per_gpu_hour", "vcpus", "memory_gib",
               "gpu_memory_gib", "source", "as_of", "flags")
TABLE_COLUMNS = ("cloud", "instance_type", "gpus", "region", "zone", "market", "usd_per_hour",
                 "usd_per_gpu_hour", "as_of", "flags")
SORTS = ("price", "per-gpu")
FORMATS = ("table", "json")


def list_prices(*, gpu: str | None, count: int | None, cloud: str | None, region: str | None,
                market: str | None, max_price: float | None, limit: int | None, sort: str,
                include_flagged: bool, nodes: int = 1) -> list[dict]:
    """The rows ``spotwise prices`` prints (JSON shape). Raises InputError naming the flag."""
    from spotwise.errors import InputError, Problem
    from spotwise.pricing.accelerators import parse_request
    from spotwise.pricing.catalog import default_catalog, parse_clouds, parse_markets

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
    clouds = parse_clouds(cloud, field="--cloud")
    markets = parse_markets(market, field="--market")
    cat = default_catalog()
    regions = None
    if region:
        regions = [r.strip() for r in region.split(",") if r.strip()]
        known = set(cat.regions()) | {o.zone for o in cat if o.zone}
        bad = [r for r in regions if r not in known]
        if bad:
            raise InputError(Problem("--region", bad[0], "a region (or zone) in the catalog: "
                                     + ", ".join(cat.regions())))
    offers = cat.select(request, clouds=clouds, regions=regions, market=markets, max_price=max_price,
                        nodes=nodes, include_flagged=include_flagged)
    if sort == "per-gpu":
        offers.sort(key=lambda o: (o.usd_per_gpu_hour, o.usd_per_hour, o.cloud, o.region, o.zone))
    if limit is not None:
        offers = offers[:limit]
    rows = []
    for o in offers:
        d = o.to_dict()
        rows.append({k: d[k] for k in JSON_FIELDS})
    return rows


def register(app: typer.Typer) -> None:
    @app.command("prices", help="List GPU offers cheapest first (snapshot, or the live cache when present).")
    def prices(
        gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU name, NAME:COUNT, or alternatives "
                                          "'H100:8,A100-80GB:8'."),
        count: Optional[int] = typer.Option(None, "--count", help="GPUs per instance (for names without :COUNT)."),
        cloud: Optional[str] = typer.Option(None, "--cloud", help="Comma-separated: aws,gcp,azure."),
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
        fmt: str = typer.Option("table", "--format", help="table or json."),
    ) -> None:
        from spotwise.errors import InputError, Problem

        if fmt not in FORMATS:
            raise InputError(Problem("--format", fmt, ", ".join(FORMATS)))
        rows = list_prices(gpu=gpu, count=count, cloud=cloud, region=region, market=market,
                           max_price=max_price, limit=limit, sort=sort, include_flagged=include_flagged,
                           nodes=nodes)
        if fmt == "json":
            from spotwise.output import print_json

            print_json(rows)
            return
        from spotwise.output import print_table

        for r in rows:
            r["gpus"] = f"{r['accelerator']}:{r['accelerator_count']}"
            r["usd_per_hour"] = f"{r['usd_per_hour']:.4f}"
            r["usd_per_gpu_hour"] = f"{r['usd_per_gpu_hour']:.4f}"
            r["flags"] = ",".join(r["flags"])
            if r["payment_option"]:
                r["market"] = f"{r['market']} ({r['payment_option']})"
        title = f"{len(rows)} offer(s)" + (f" for {gpu}" if gpu else "") + ", cheapest first"
        if not rows:
            title += " — none match; try --include-flagged, another --market or fewer filters"
        print_table(rows, TABLE_COLUMNS, title=title)

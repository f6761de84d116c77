"""``spotwise catalog refresh|info``: fetch live prices into the local cache; describe the catalog."""

from __future__ import annotations

from typing import Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option, print_json, print_table

def catalog_info() -> list[dict]:
    """Per cloud: rows, where they come from, as_of range, age of the cache, integrity findings."""
    import time

    from spotwise.pricing.catalog import Catalog, blocking_flags, is_stale
    from spotwise.pricing.integrity import check_offers

    cat = Catalog.load()
    findings = check_offers(list(cat))
    out = []
    for src in cat.sources:
        offers = [o for o in cat if o.cloud == src.cloud]
        keys = {o.key for o in offers}
        mine = [f for f in findings if f.key in keys]
        dates = sorted(o.as_of for o in offers)
        by_source: dict[str, dict] = {}
        for o in offers:
            d = by_source.setdefault(o.source, {"source": o.source, "rows": 0, "stale_rows": 0, "as_of_min": o.as_of,
                                                "as_of_max": o.as_of, "as_of_kinds": set()})
            d["rows"] += 1
            d["stale_rows"] += is_stale(o)
            d["as_of_min"], d["as_of_max"] = min(d["as_of_min"], o.as_of), max(d["as_of_max"], o.as_of)
            d["as_of_kinds"].add(o.as_of_kind)
        detail = [dict(d, as_of_kinds=sorted(d["as_of_kinds"])) for _, d in sorted(by_source.items())]
        stale = [o for o in offers if is_stale(o)]
        notes = []
        if stale:
            notes.append(f"{len(stale)} row(s) have no current source (stale: "
                         f"{', '.join(sorted({f for o in stale for f in o.flags if f.startswith(('stale', 'on_demand_predates'))}))}); "
                         "they are not ranked; `prices --include-stale` shows them with a warning")
        age_h = None
        if src.kind == "cache" and src.meta.get("fetched_at_unix"):
            age_h = round((time.time() - float(src.meta["fetched_at_unix"])) / 3600, 2)
        out.append({
            "cloud": src.cloud, "rows": len(offers),
            "flagged_rows": sum(1 for o in offers if blocking_flags(o)),
            "stale_rows": len(stale),
            "source": src.kind, "path": src.path,
            "sources": sorted({o.source for o in offers}),
            "source_detail": detail,
            "as_of_kinds": {k: sum(1 for o in offers if o.as_of_kind == k) for k in sorted({o.as_of_kind for o in offers})},
            "notes": notes,
            "as_of_min": dates[0] if dates else None, "as_of_max": dates[-1] if dates else None,
            "cache_age_hours": age_h,
            "markets": sorted({o.market.value for o in offers}),
            "accelerators": sorted({o.accelerator for o in offers}),
            "regions": len({o.region for o in offers}),
            "integrity_known": sum(1 for f in mine if f.known),
            "integrity_new": [f.to_dict() for f in mine if not f.known][:20],
        })
    return out


@COMMANDS.register("catalog")
def register(app: typer.Typer) -> None:
    group = typer.Typer(help="The price catalog: refresh live prices, show what is loaded.", no_args_is_help=True)

    @group.command("refresh", help="Fetch live prices into $SPOTWISE_HOME/prices (atomic; old cache kept on failure).")
    def refresh(
        cloud: Optional[str] = typer.Option(None, "--cloud", help="aws, azure or gcp (comma-separated; default all)."),
        region: Optional[str] = typer.Option(None, "--region", help="Region(s), comma-separated (default: "
                                             "the snapshot's regions for that cloud)."),
        fmt: Format = format_option(),
    ) -> None:
        from rich.progress import Progress, TaskID

        from spotwise.pricing.live import FETCHERS, FetchQuery
        from spotwise.pricing.live.cache import write_cloud_cache

        names = [c.strip().lower() for c in (cloud or ",".join(FETCHERS.names())).split(",") if c.strip()]
        fetchers = [FETCHERS.get(c) for c in names]       # an unknown cloud: InputError on --cloud
        regions = tuple(r.strip() for r in region.split(",") if r.strip()) if region else None
        results = []
        with Progress(transient=True) as bar:
            for f in fetchers:
                c = f.cloud
                todo = list(regions or f.default_regions())
                task = bar.add_task(f"{c}", total=len(todo))

                def progress(msg: str, _t: TaskID = task) -> None:
                    bar.update(_t, description=msg)

                offers = []
                if f.all_regions_at_once:
                    offers = f.fetch(FetchQuery(regions=tuple(todo), progress=progress))
                    bar.advance(task, len(todo))
                else:
                    for r in todo:
                        offers.extend(f.fetch(FetchQuery(regions=(r,), progress=progress)))
                        bar.advance(task)
                meta = write_cloud_cache(c, offers, source=f"{c} live", regions=todo)
                results.append({"cloud": c, "rows_fetched": len(offers), "rows_in_cache": meta["rows"],
                                "regions": len(todo), "new_findings": len(meta["findings"]),
                                "fetched_at": meta["fetched_at"]})
        if fmt is Format.json:
            print_json(results)
        else:
            print_table(results, list(results[0]) if results else ["cloud"], title="catalog refresh")

    @group.command("info", help="Per cloud: rows, source, as_of, cache age, integrity findings.")
    def info(fmt: Format = format_option()) -> None:
        from spotwise.pricing.offer import AS_OF_SYMBOL

        rows = catalog_info()
        if fmt is Format.json:
            print_json(rows)
            return

        foot = []
        for r in rows:
            r["as_of"] = f"{r['as_of_min']} .. {r['as_of_max']}"
            r["integrity"] = f"{r['integrity_known']} known, {len(r['integrity_new'])} new"
            r["age_h"] = r["cache_age_hours"]
            r["flagged"] = r["flagged_rows"]
            r["stale"] = r["stale_rows"]
            foot.append(f"{r['cloud']} ({r['source']}):")
            for d in r["source_detail"]:
                kinds = "/".join(AS_OF_SYMBOL[k] + k for k in d["as_of_kinds"])
                rng = d["as_of_min"] if d["as_of_min"] == d["as_of_max"] else f"{d['as_of_min']}..{d['as_of_max']}"
                foot.append(f"  {d['rows']:>5} rows  as_of {rng} ({kinds})  {d['source']}"
                            + (f"  [{d['stale_rows']} stale]" if d["stale_rows"] else ""))
            foot += [f"  note: {n}" for n in r["notes"]]
        foot.append("as_of kinds: exact = the price's date; upper_bound (≤) = no later than; lower_bound (≥) = "
                    "no earlier than; approximate (~)")
        print_table(rows, ["cloud", "rows", "flagged", "stale", "source", "as_of", "age_h", "regions", "integrity"],
                    title="price catalog", optional=["integrity", "regions", "age_h"], footnotes=foot)

    app.add_typer(group, name="catalog")

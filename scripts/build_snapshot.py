#!/usr/bin/env python3
"""Build the price snapshot shipped in ``src/spotwise/pricing/data/`` (dev-time only).

Reads the curated price data in ``/work/shared/data/prices/`` (or ``--src DIR``) and writes

* ``offers.csv``  — long format, one row per (cloud, instance_type, region, zone, market
  [, payment_option]) with ``usd_per_hour``, ``source``, ``as_of`` (ISO date), GPU facts and a
  ``flags`` column (``;``-separated). Read with the stdlib ``csv`` module at run time, so the CLI
  never has to import pandas to list prices.
* ``gpu_specs.csv`` — dense BF16/FP16 peaks per GPU (estimator), copied verbatim.
* ``spot_advisor.csv`` — AWS Spot Instance Advisor interruption bands (Linux rows only).

The product never reads the shared data directory at run time; this script is the only bridge.
The choices it makes (which source wins, which rows are flagged, how dates are bounded) are
documented in ``src/spotwise/pricing/data/README.md``; keep the two in step.

Run:  .venv/bin/python scripts/build_snapshot.py [--src /work/shared/data]
"""

from __future__ import annotations

import argparse
import csv
import shutil
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "spotwise" / "pricing" / "data"

COLUMNS = ["cloud", "instance_type", "accelerator", "accelerator_count", "gpu_memory_gib", "vcpus",
           "memory_gib", "region", "zone", "market", "payment_option", "usd_per_hour", "source",
           "as_of", "flags"]

# Dates: the SkyPilot catalogs carry no date. These are the documented bounds (see README).
AS_OF = {
    "aws": "2025-05-31",    # upper bound: on-demand equals the pre-June-2025 price list (p5 98.32)
    "gcp": "2025-01-01",    # lower bound: the file lists H200 (a3-ultragpu), GA in 2025
    "azure": "2024-01-01",  # approximate: v6 file lists NC H100 v5 sizes (introduced late 2023)
}
# Families whose on-demand price AWS cut in June 2025; rows from the older catalog keep the
# old (higher) price, marked with an informational flag.
AWS_CUT_FAMILIES = ("p4d.", "p4de.", "p5.", "p5en.")

# Flags from gpu_offers_snapshot_flags.csv -> (market the flag applies to, our flag name).
FLAG_MAP = {
    "on_demand_mismatch_vs_list": ("on-demand", "on_demand_understated"),
    "on_demand_suspect_via_sibling": ("on-demand", "on_demand_understated"),
    "gpu_rate_uniform_across_regions": ("on-demand", "on_demand_understated"),
    "spot_ge_on_demand": ("spot", "spot_ge_on_demand"),
    "no_on_demand_price": ("spot", "no_on_demand_price"),
    "merged_duplicate_rows": ("*", "merged_duplicate_rows"),
    "accelerator_count_corrected": ("*", "accelerator_count_corrected"),
}

# GPU facts for instance types that appear only in reserved_pricing.csv.
EXTRA_TYPES = {
    # Microsoft docs, ND H200 v5 series: 8x H200 141GB, 96 vCPU, 1850 GiB.
    ("azure", "Standard_ND96isr_H200_v5"): ("H200", 8, 141, 96.0, 1850.0),
}


def _short_source(source: str, commit: str) -> str:
    return f"{source}@{commit[:8]}" if commit else source


def _iso(as_of: str) -> str:
    """'2026-10' -> '2026-10-01', '2026' -> '2026-01-01' (period start; README says so)."""
    parts = as_of.strip().split("-")
    while len(parts) < 3:
        parts.append("01")
    return "-".join(parts[:3])


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.6f}".rstrip("0").rstrip(".")


def _read(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def build(src: Path) -> list[dict]:
    prices = src / "prices"
    snap = _read(prices / "gpu_offers_snapshot.csv")
    flags_in = _read(prices / "gpu_offers_snapshot_flags.csv")
    cyclenerd = {(r["instance_type"], r["region"]): r for r in _read(prices / "gcp_list_prices_cyclenerd.csv")}
    refs = _read(prices / "current_reference_prices.csv")
    reserved = _read(prices / "reserved_pricing.csv")

    # (cloud, type, region, zone) -> {market: {flag}}; '*' wildcards in region/zone.
    flagged: dict[tuple, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for f in flags_in:
        if f["flag"] not in FLAG_MAP:
            continue  # dropped_no_gpu_row: those rows are not in the snapshot at all
        market, name = FLAG_MAP[f["flag"]]
        flagged[(f["cloud"], f["instance_type"], f["region"], f["zone"])][market].add(name)

    def flags_for(cloud, itype, region, zone, market) -> set:
        out: set = set()
        for key in ((cloud, itype, region, zone), (cloud, itype, region, "*"), (cloud, itype, "*", "*"),
                    (cloud, itype, "*", "")):
            for m in (market, "*"):
                out |= flagged.get(key, {}).get(m, set())
        return out

    # Newer on-demand / spot reference points (per region) that override the older catalog.
    ref_price: dict[tuple, dict] = {}
    for r in refs:
        kind = {"on_demand": "on-demand", "spot": "spot"}.get(r["price_kind"])
        if kind and r["unit"] == "instance-hour":
            ref_price[(r["cloud"], r["instance_type"], r["region"], kind)] = r

    facts: dict[tuple, tuple] = dict(EXTRA_TYPES)
    out: list[dict] = []
    for s in snap:
        cloud, itype, region, zone = s["cloud"], s["instance_type"], s["region"], s["zone"]
        facts.setdefault((cloud, itype), (s["accelerator"], int(s["accelerator_count"]),
                                          float(s["gpu_memory_gib"]), float(s["vcpus"]),
                                          float(s["memory_gib"])))
        base_source = _short_source(s["source"], s["source_commit"])
        od = float(s["on_demand_usd_per_hour"]) if s["on_demand_usd_per_hour"] else None
        sp = float(s["spot_usd_per_hour"]) if s["spot_usd_per_hour"] else None
        od_src = sp_src = base_source
        od_asof = sp_asof = AS_OF[cloud]
        od_flags = flags_for(cloud, itype, region, zone, "on-demand")
        sp_flags = flags_for(cloud, itype, region, zone, "spot")

        if cloud == "gcp" and (itype, region) in cyclenerd:
            # Full-VM list price (GPU included) from the Cloud Billing Catalog, dated; it fixes
            # the understated composed on-demand price. GCP prices per region: same in each zone.
            c = cyclenerd[(itype, region)]
            csrc = _short_source(c["source"], c["source_commit"])
            od, od_src, od_asof = float(c["on_demand_usd_per_hour"]), csrc, c["as_of"]
            od_flags.discard("on_demand_understated")
            if c["spot_usd_per_hour"]:
                sp, sp_src, sp_asof = float(c["spot_usd_per_hour"]), csrc, c["as_of"]
                sp_flags.discard("spot_ge_on_demand")
        for market, target in (("on-demand", "od"), ("spot", "sp")):
            ref = ref_price.get((cloud, itype, region, market))
            if ref is None:
                continue
            src_txt = ref["source"].split(" (")[0][:60].strip()
            if target == "od":
                od, od_src, od_asof = float(ref["usd_per_hour"]), f"reference:{src_txt}", ref["as_of"]
            else:
                sp, sp_src, sp_asof = float(ref["usd_per_hour"]), f"reference:{src_txt}", ref["as_of"]
                sp_flags.discard("spot_ge_on_demand")
        if cloud == "aws" and itype.startswith(AWS_CUT_FAMILIES) and od is not None and od_src == base_source:
            od_flags.add("on_demand_predates_2025_06_cut")
        if od is not None and sp is not None and sp >= od:
            sp_flags.add("spot_ge_on_demand")
        if od is None and sp is not None:
            sp_flags.add("no_on_demand_price")

        common = dict(cloud=cloud, instance_type=itype, accelerator=s["accelerator"],
                      accelerator_count=s["accelerator_count"], gpu_memory_gib=s["gpu_memory_gib"],
                      vcpus=s["vcpus"], memory_gib=s["memory_gib"], region=region, zone=zone,
                      payment_option="")
        if od is not None:
            out.append(dict(common, market="on-demand", usd_per_hour=_fmt(od), source=od_src,
                            as_of=od_asof, flags=";".join(sorted(od_flags))))
        if sp is not None:
            out.append(dict(common, market="spot", usd_per_hour=_fmt(sp), source=sp_src,
                            as_of=sp_asof, flags=";".join(sorted(sp_flags))))

    # Reserved / committed prices: only rows with an actual effective hourly price. Capacity
    # Blocks are not 1y/3y terms and "up to N%" maxima are not prices; both are left out.
    for r in reserved:
        if r["kind"] != "price" or not r["effective_usd_per_hour"]:
            continue
        cloud, itype = r["cloud"], r["instance_type"]
        if (cloud, itype) not in facts:
            raise SystemExit(f"no GPU facts for reserved row {cloud} {itype}; add it to EXTRA_TYPES")
        acc, n, gmem, vcpus, mem = facts[(cloud, itype)]
        po = r["payment_option"].lower()
        payment = ("all-upfront" if "all upfront" in po else
                   "no-upfront" if "no upfront" in po else
                   "upfront-or-monthly" if "upfront or monthly" in po else "unspecified")
        src = r["source_url_or_repo"].split(" (")[0].strip()
        out.append(dict(cloud=cloud, instance_type=itype, accelerator=acc, accelerator_count=str(n),
                        gpu_memory_gib=_fmt(gmem), vcpus=_fmt(vcpus), memory_gib=_fmt(mem),
                        region=r["region"], zone="", market=f"reserved-{r['term_years']}y",
                        payment_option=payment, usd_per_hour=_fmt(float(r["effective_usd_per_hour"])),
                        source=src, as_of=_iso(r["as_of"]), flags=""))
    # Normalise numeric text so the file is stable under rebuilds.
    for row in out:
        for k in ("gpu_memory_gib", "vcpus", "memory_gib"):
            row[k] = _fmt(float(row[k])) if row[k] else ""
    out.sort(key=lambda r: (r["cloud"], r["accelerator"], r["instance_type"], r["region"], r["zone"], r["market"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=Path("/work/shared/data"))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rows = build(args.src)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "offers.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    shutil.copyfile(args.src / "prices" / "gpu_specs.csv", args.out / "gpu_specs.csv")
    adv = _read(args.src / "spot-advisor" / "aws-spot-advisor-gpu-snapshot-2024-02.csv")
    with (args.out / "spot_advisor.csv").open("w", newline="") as f:
        cols = ["region", "instance_type", "interruption_band_index", "interruption_band",
                "savings_vs_on_demand_pct"]
        w = csv.DictWriter(f, fieldnames=cols, lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        w.writerows(r for r in adv if r["os"] == "Linux")
    flagged = sum(1 for r in rows if r["flags"])
    print(f"wrote {len(rows)} offers ({flagged} flagged) to {args.out}")


if __name__ == "__main__":
    main()

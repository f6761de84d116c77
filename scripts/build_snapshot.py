#!/usr/bin/env python3
"""Build the price snapshot shipped in ``src/spotwise/pricing/data/`` (dev-time only).

Reads the curated price data in ``/work/shared/data/prices/`` (or ``--src DIR``) and writes

* ``offers.csv``  — long format, one row per (cloud, instance_type, region, zone, market
  [, payment_option]) with ``usd_per_hour``, ``source``, ``as_of`` (ISO date), GPU facts and a
  ``flags`` column (``;``-separated). Read with the stdlib ``csv`` module at run time, so the CLI
  never has to import pandas to list prices.
* ``gpu_specs.csv`` — dense BF16/FP16 peaks per GPU (estimator), copied verbatim.
* ``spot_advisor.csv`` — AWS Spot Instance Advisor interruption bands (Linux rows only).
* ``commitment_notes.csv`` — AWS commitments that are not 1y/3y hourly prices (Capacity Blocks,
  Savings Plans maxima, explicit gaps), printed by ``prices --market reserved-*``.

AWS rows come from ``prices/aws_skypilot_v8_gpu.csv`` (the post-June-2025-cut SkyPilot v8
catalog); older v7 rows it lacks are kept, flagged stale.

The product never reads the shared data directory at run time; this script is the only bridge.
The choices it makes (which source wins, which rows are flagged, how dates are bounded) are
documented in ``src/spotwise/pricing/data/README.md``; keep the two in step.

Run:  .venv/bin/python scripts/build_snapshot.py [--src /work/shared/data]
"""

from __future__ import annotations

import argparse
import csv
import re
import shutil
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "spotwise" / "pricing" / "data"

COLUMNS = ["cloud", "instance_type", "accelerator", "accelerator_count", "gpu_memory_gib", "vcpus",
           "memory_gib", "region", "zone", "market", "payment_option", "usd_per_hour", "source",
           "as_of", "as_of_kind", "flags"]

# Dates: the SkyPilot catalogs carry no date. These are the documented bounds (see README).
AS_OF = {
    "aws": "2025-05-31",    # upper bound: on-demand equals the pre-June-2025 price list (p5 98.32)
    "gcp": "2025-01-01",    # lower bound: the file lists H200 (a3-ultragpu), GA in 2025
    "azure": "2024-01-01",  # approximate: v6 file lists NC H100 v5 sizes (introduced late 2023)
}
AS_OF_KIND = {"aws": "upper_bound", "gcp": "lower_bound", "azure": "approximate"}
# SkyPilot v8 AWS catalog: has the June-2025 cut (p5 55.04 in us-east-1/us-east-2/us-west-2), so
# its prices date from June 2025 or later; the commit date is unknown -> a lower bound.
AWS_V8 = "aws_skypilot_v8_gpu.csv"
AWS_V8_SOURCE = "skypilot-org/skypilot-catalog:catalogs/v8/aws/vms.csv@e385a0d3"
AWS_V8_AS_OF = ("2025-06-01", "lower_bound")
# Types in the v8 extract we do not ship: B200 has no spec row (gpu_specs.csv) and no canonical name.
AWS_V8_SKIP = ("p6-b200.",)
# Nominal GPU memory (vendor GB) for v8 rows (its GpuInfo gives MiB as reported by EC2).
GPU_MEM = {"A100": 40, "A100-80GB": 80, "H100": 80, "H200": 141, "L4": 24, "L40S": 48, "A10G": 24,
           "V100": 16, "V100-32GB": 32}
# A spot price below this fraction of on-demand from a single source is not ranked unless a
# second source agrees (within SECOND_SOURCE_TOLERANCE).
LOW_SPOT_FRACTION = 0.15
SECOND_SOURCE_TOLERANCE = 0.25

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
    return _canon_source(f"{source}@{commit[:8]}" if commit else source)


_REPO_FILE_AT_COMMIT = re.compile(r"^(\S+/\S+)\s+(\S+)\s+@\s*([0-9a-f]{8,40})$")


def _canon_source(text: str, *, reference: bool = False) -> str:
    """One spelling per source: ``owner/repo:path@commit8`` for a repository file (however the
    shared CSVs wrote it), else the text before any parenthesis, untruncated; ``reference:`` marks
    a newer point that overrides the catalog (dropped for repository files, which name themselves)."""
    text = text.split(" (")[0].strip()
    m = _REPO_FILE_AT_COMMIT.match(text)
    if m:
        return f"{m.group(1)}:{m.group(2)}@{m.group(3)[:8]}"
    if ":" in text and "@" in text and " " not in text:
        return text
    return f"reference:{text}" if reference else text


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
    aws_v7: dict[tuple, dict] = {}
    stats = defaultdict(int)

    def emit(common: dict, market: str, price: float, source: str, as_of: str, kind: str, flags: set) -> None:
        out.append(dict(common, market=market, usd_per_hour=_fmt(price), source=source, as_of=as_of,
                        as_of_kind=kind, flags=";".join(sorted(flags))))

    for s in snap:
        cloud, itype, region, zone = s["cloud"], s["instance_type"], s["region"], s["zone"]
        facts.setdefault((cloud, itype), (s["accelerator"], int(s["accelerator_count"]),
                                          float(s["gpu_memory_gib"]), float(s["vcpus"]),
                                          float(s["memory_gib"])))
        if cloud == "aws":
            aws_v7[(itype, region, zone)] = s   # rebuilt from the v8 catalog below
            continue
        base_source = _short_source(s["source"], s["source_commit"])
        od = float(s["on_demand_usd_per_hour"]) if s["on_demand_usd_per_hour"] else None
        sp = float(s["spot_usd_per_hour"]) if s["spot_usd_per_hour"] else None
        sp_catalog = sp
        od_src = sp_src = base_source
        od_asof = sp_asof = AS_OF[cloud]
        od_kind = sp_kind = AS_OF_KIND[cloud]
        od_flags = flags_for(cloud, itype, region, zone, "on-demand")
        sp_flags = flags_for(cloud, itype, region, zone, "spot")

        if cloud == "gcp" and (itype, region) in cyclenerd:
            # Full-VM list price (GPU included) from the Cloud Billing Catalog, dated; it fixes
            # the understated composed on-demand price. GCP prices per region: same in each zone.
            c = cyclenerd[(itype, region)]
            csrc = _short_source(c["source"], c["source_commit"])
            od, od_src, od_asof, od_kind = float(c["on_demand_usd_per_hour"]), csrc, c["as_of"], "exact"
            od_flags.discard("on_demand_understated")
            if c["spot_usd_per_hour"]:
                sp, sp_src, sp_asof, sp_kind = float(c["spot_usd_per_hour"]), csrc, c["as_of"], "exact"
                sp_flags.discard("spot_ge_on_demand")
                # A very deep spot discount from one source is only ranked when the other source
                # (SkyPilot's composed spot) agrees; europe-north1 a3-highgpu-8g at 9 % does not.
                if sp < LOW_SPOT_FRACTION * od and not (
                        sp_catalog and abs(sp_catalog / sp - 1) <= SECOND_SOURCE_TOLERANCE):
                    sp_flags.add("spot_unconfirmed_low")
        sp_from_ref = False
        for market, target in (("on-demand", "od"), ("spot", "sp")):
            ref = ref_price.get((cloud, itype, region, market))
            if ref is None:
                continue
            src_txt = _canon_source(ref["source"], reference=True)
            if target == "od":
                od, od_src, od_asof, od_kind = float(ref["usd_per_hour"]), src_txt, ref["as_of"], "exact"
            else:
                sp, sp_src, sp_asof, sp_kind = float(ref["usd_per_hour"]), src_txt, ref["as_of"], "exact"
                sp_flags.discard("spot_ge_on_demand")
                sp_from_ref = True
        if cloud == "azure" and sp is not None and not sp_from_ref:
            # v6 (≈2024) spot: ND96asr_v4 eastus doubled (2.99 -> 5.98) by 2026, ND96amsr_A100_v4
            # eastus low-priority is 6.55 vs 3.60 here. No current Azure spot source for these rows.
            sp_flags.add("stale_spot_2024")
        if od is not None and sp is not None and sp >= od:
            sp_flags.add("spot_ge_on_demand")
        if od is None and sp is not None:
            sp_flags.add("no_on_demand_price")

        common = dict(cloud=cloud, instance_type=itype, accelerator=s["accelerator"],
                      accelerator_count=s["accelerator_count"], gpu_memory_gib=s["gpu_memory_gib"],
                      vcpus=s["vcpus"], memory_gib=s["memory_gib"], region=region, zone=zone,
                      payment_option="")
        if od is not None:
            emit(common, "on-demand", od, od_src, od_asof, od_kind, od_flags)
        if sp is not None:
            emit(common, "spot", sp, sp_src, sp_asof, sp_kind, sp_flags)

    # AWS: every row of the post-cut v8 catalog; newer dated references override on-demand.
    seen_v8: set = set()
    for r in _read(prices / AWS_V8):
        itype, region, zone = r["InstanceType"], r["Region"], r["AvailabilityZone"]
        if itype.startswith(AWS_V8_SKIP):
            stats["aws_v8_skipped"] += 1
            continue
        seen_v8.add((itype, region, zone))
        acc, n = r["AcceleratorName"], int(float(r["AcceleratorCount"]))
        facts.setdefault(("aws", itype), (acc, n, float(GPU_MEM[acc]), float(r["vCPUs"]), float(r["MemoryGiB"])))
        acc, n, gmem, vcpus, mem = facts[("aws", itype)]
        od_v8 = float(r["Price"]) if r["Price"] else None
        sp = float(r["SpotPrice"]) if r["SpotPrice"] else None
        od, od_src, (od_asof, od_kind) = od_v8, AWS_V8_SOURCE, AWS_V8_AS_OF
        od_flags, sp_flags = set(), set()
        ref = ref_price.get(("aws", itype, region, "on-demand"))
        if ref is not None:
            od, od_src, od_asof, od_kind = (float(ref["usd_per_hour"]), _canon_source(ref["source"], reference=True),
                                            ref["as_of"], "exact")
            if od_v8 and abs(od_v8 / od - 1) > 0.02:
                print(f"note: v8 on-demand {itype} {region} {od_v8} vs reference {od}")
        if sp is not None:
            if od_v8 and abs(sp / od_v8 - 1) < 1e-3:
                sp_flags.add("spot_placeholder")          # v8 quirk: spot = on-demand (to 4 decimals): unknown
            elif od_v8 and abs(sp / od_v8 - 0.10) < 5e-4:
                sp_flags.add("spot_suspect_10pct")        # v8 quirk: exactly 10 % of on-demand
            if od is not None and sp >= od:
                sp_flags.add("spot_ge_on_demand")
            if od is None:
                sp_flags.add("no_on_demand_price")
        common = dict(cloud="aws", instance_type=itype, accelerator=acc, accelerator_count=str(n),
                      gpu_memory_gib=_fmt(gmem), vcpus=_fmt(vcpus), memory_gib=_fmt(mem), region=region,
                      zone=zone, payment_option="")
        if od is not None:
            emit(common, "on-demand", od, od_src, od_asof, od_kind, od_flags)
            stats["aws_on_demand"] += 1
        if sp is not None:
            emit(common, "spot", sp, AWS_V8_SOURCE, *AWS_V8_AS_OF, sp_flags)
            stats["aws_spot"] += 1
            stats["aws_spot_flagged"] += bool(sp_flags)
    # Older (v7, pre-cut) AWS rows the v8 catalog does not have: kept for --include-stale only.
    for (itype, region, zone), s in sorted(aws_v7.items()):
        if (itype, region, zone) in seen_v8:
            stats["aws_v7_replaced"] += 1
            continue
        stats["aws_v7_stale"] += 1
        common = dict(cloud="aws", instance_type=itype, accelerator=s["accelerator"],
                      accelerator_count=s["accelerator_count"], gpu_memory_gib=s["gpu_memory_gib"],
                      vcpus=s["vcpus"], memory_gib=s["memory_gib"], region=region, zone=zone, payment_option="")
        src = _short_source(s["source"], s["source_commit"])
        for market, col in (("on-demand", "on_demand_usd_per_hour"), ("spot", "spot_usd_per_hour")):
            if s[col]:
                fl = flags_for("aws", itype, region, zone, market) | {"stale_no_current_source"}
                emit(common, market, float(s[col]), src, AS_OF["aws"], AS_OF_KIND["aws"], fl)
    print("aws:", dict(stats))

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
        src = _canon_source(r["source_url_or_repo"])
        out.append(dict(cloud=cloud, instance_type=itype, accelerator=acc, accelerator_count=str(n),
                        gpu_memory_gib=_fmt(gmem), vcpus=_fmt(vcpus), memory_gib=_fmt(mem),
                        region=r["region"], zone="", market=f"reserved-{r['term_years']}y",
                        payment_option=payment, usd_per_hour=_fmt(float(r["effective_usd_per_hour"])),
                        source=src, as_of=_iso(r["as_of"]),
                        as_of_kind="exact" if len(r["as_of"].strip()) == 10 else "approximate", flags=""))
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
    # Commitments that are not 1y/3y hourly prices (AWS Capacity Blocks, "up to N %" Savings
    # Plans maxima, explicit gaps): shipped as notes so `prices --market reserved-*` can say what
    # AWS offers instead of printing an empty table.
    notes_cols = ["cloud", "instance_type", "region", "term_years", "kind", "offer", "usd_per_hour",
                  "discount_pct_max", "source", "as_of", "notes"]
    with (args.out / "commitment_notes.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=notes_cols, lineterminator="\n")
        w.writeheader()
        for r in _read(args.src / "prices" / "reserved_pricing.csv"):
            if r["kind"] == "price" or r["cloud"] != "aws":
                continue
            w.writerow({"cloud": r["cloud"], "instance_type": r["instance_type"], "region": r["region"],
                        "term_years": r["term_years"], "kind": r["kind"], "offer": r["payment_option"],
                        "usd_per_hour": r["effective_usd_per_hour"], "discount_pct_max": r["discount_pct"],
                        "source": r["source_url_or_repo"].split(" (")[0].strip(), "as_of": r["as_of"],
                        "notes": r["notes"]})
    flagged = sum(1 for r in rows if r["flags"])
    print(f"wrote {len(rows)} offers ({flagged} flagged) to {args.out}")


if __name__ == "__main__":
    main()

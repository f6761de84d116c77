#!/usr/bin/env python3
"""In-process ranking speed: ``Catalog.find_offers`` on a generated 50,000-row catalog.

Request: {"H100": 8, "A100-80GB": 8}, spot + on-demand, every cloud (the orchestrator's usual
call). Baseline measured in the same run: the same filter + sort as a pandas DataFrame query
(what scripting against ``load_catalog()`` does). Prints medians and the ratio; target < 20 ms.

    .venv/bin/python bench/bench_pricing_rank.py [--rows 50000] [--reps 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from spotwise.pricing.catalog import Catalog
from spotwise.pricing.offer import Market, Offer

SHAPES = [("H100", 8), ("H100", 1), ("A100-80GB", 8), ("A100", 8), ("L4", 1), ("L4", 4), ("L40S", 8),
          ("A10G", 1), ("V100", 8), ("H200", 8)]
MARKETS = [Market.SPOT, Market.ON_DEMAND, Market.RESERVED_1Y, Market.RESERVED_3Y]


def generate(n: int, seed: int = 0) -> list[Offer]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        acc, count = rng.choice(SHAPES)
        out.append(Offer(cloud=rng.choice(("aws", "gcp", "azure")), instance_type=f"{acc.lower()}-{count}x-{i % 7}",
                         accelerator=acc, accelerator_count=count, region=f"region-{rng.randrange(60)}",
                         zone=f"zone-{rng.randrange(200)}", market=rng.choice(MARKETS),
                         usd_per_hour=round(rng.uniform(0.5, 120), 4), source="generated", as_of="2026-01-01",
                         flags=("spot_ge_on_demand",) if rng.random() < 0.05 else ()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    offers = generate(args.rows)
    t0 = time.perf_counter()
    cat = Catalog(offers)
    build_ms = (time.perf_counter() - t0) * 1000
    req = {"H100": 8, "A100-80GB": 8}

    import pandas as pd

    df = pd.DataFrame([o.to_dict() for o in offers])
    df["flagged"] = df["flags"].map(bool)

    def ours():
        return cat.find_offers(req, market=["spot", "on-demand"])

    def pandas_query():
        m = (((df.accelerator == "H100") & (df.accelerator_count == 8))
             | ((df.accelerator == "A100-80GB") & (df.accelerator_count == 8)))
        m &= df.market.isin(["spot", "on-demand"]) & ~df.flagged
        return df[m].sort_values(["usd_per_hour", "cloud", "region", "zone"])

    n_ours, n_pd = len(ours()), len(pandas_query())
    assert n_ours == n_pd, (n_ours, n_pd)
    t_ours, t_pd = [], []
    for _ in range(args.reps):
        t = time.perf_counter()
        ours()
        t_ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        pandas_query()
        t_pd.append(time.perf_counter() - t)
    mo, mp = statistics.median(t_ours) * 1000, statistics.median(t_pd) * 1000
    print(f"catalog rows {args.rows}, matching offers {n_ours}, index build {build_ms:.1f} ms (once per load)")
    print(f"Catalog.find_offers      median {mo:7.2f} ms  (n={args.reps})  target < 20 ms: {'OK' if mo < 20 else 'MISSED'}")
    print(f"pandas filter+sort       median {mp:7.2f} ms  (baseline)")
    print(f"ratio find_offers / pandas: {mo / mp:.2f}x")


if __name__ == "__main__":
    main()

"""Estimator vs published training runs: GPU-hours side by side, with the ratio.

For each run in :mod:`spotwise.pricing.published_runs` (Llama 2 7B/13B/70B on A100-80GB, Llama 3
8B/70B on H100) this prints the GPU-hours the authors published, the estimator's figure on
8-GPU nodes at the assumed node count, the MFU it used, and estimate ÷ published. The old
constant-MFU (0.4) figure is printed too, to show what the model changed. No prices involved:
this checks hours only. Deterministic, runs in well under a second.

    .venv/bin/python bench/bench_estimate_accuracy.py [--nodes 256]
"""

from __future__ import annotations

import argparse

from spotwise.pricing.estimate import JobModel, compute_hours, model_mfu
from spotwise.pricing.offer import Market, Offer
from spotwise.pricing.published_runs import ASSUMED_NODES, RUNS


def shape(accelerator: str) -> Offer:
    """An 8-GPU node of ``accelerator`` (price irrelevant here)."""
    return Offer(cloud="bench", instance_type=f"{accelerator}x8", accelerator=accelerator, accelerator_count=8,
                 region="-", zone="", market=Market.ON_DEMAND, usd_per_hour=1.0, source="bench", as_of="2026-01-01")


def rows(nodes: int) -> list[dict]:
    out = []
    for run in RUNS:
        offer = shape(run.accelerator)
        job = JobModel(model_params=run.params, tokens=run.tokens, flops_per_token=run.flops_per_token())
        hours, _ = compute_hours(job, offer, nodes)
        gpu_h = hours * nodes * 8
        flat, _ = compute_hours(JobModel(model_params=run.params, tokens=run.tokens, mfu=0.4,
                                              flops_per_token=run.flops_per_token()), offer, nodes)
        out.append({"run": run.name, "gpu": run.accelerator, "published": run.gpu_hours, "alt": run.gpu_hours_alt,
                    "estimate": gpu_h, "mfu": model_mfu(run.accelerator, run.params, nodes)[0],
                    "ratio": gpu_h / run.gpu_hours,
                    "ratio_alt": gpu_h / run.gpu_hours_alt if run.gpu_hours_alt else None,
                    "old_ratio": flat * nodes * 8 / run.gpu_hours})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=ASSUMED_NODES, help="8-GPU nodes per run (default: the fit's)")
    args = ap.parse_args()
    print(f"estimate vs published GPU-hours, {args.nodes} nodes x 8 GPUs")
    print(f"{'run':<12} {'gpu':<10} {'published':>11} {'estimate':>11} {'mfu':>6} {'ratio':>6} "
          f"{'alt ratio':>9} {'mfu=0.4':>8}")
    for r in rows(args.nodes):
        alt = f"{r['ratio_alt']:.2f}" if r["ratio_alt"] else "-"
        print(f"{r['run']:<12} {r['gpu']:<10} {r['published']:>11,.0f} {r['estimate']:>11,.0f} {r['mfu']:>6.3f} "
              f"{r['ratio']:>6.2f} {alt:>9} {r['old_ratio']:>8.2f}")
    worst = max(abs(r["ratio"] - 1) for r in rows(args.nodes))
    print(f"worst |ratio - 1| = {worst:.1%} (goal: within 20 %)")


if __name__ == "__main__":
    main()

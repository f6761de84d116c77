"""``spotwise estimate``: hours, dollars and deadline risk per offer (see :mod:`spotwise.pricing.estimate`)."""

from __future__ import annotations

from typing import Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option, print_json


def run_estimate(*, task: str | None, gpu: str | None, nodes: int | None, hours: float | None,
                 model_params: float | None, tokens: float | None, mfu: float | None, deadline_hours: float | None,
                 budget: float | None, cloud: str | None, market: str | None, all_offers: bool,
                 limit: int | None) -> list[dict]:
    from spotwise.errors import InputError, Problem
    from spotwise.pricing.accelerators import parse_request
    from spotwise.pricing.estimate import JobModel, estimate, flops_per_token_from_taskspec, params_from_taskspec

    accelerators: dict[str, int] | None = None
    clouds: str | list[str] | None = cloud
    regions = None
    flops_per_token = None
    activation_checkpointing = False
    if task:
        from spotwise.taskspec import load_taskspec

        spec = load_taskspec(task)
        accelerators = {k: v for k, v in spec.resources.accelerators.items() if k != "cpu"}
        nodes = nodes if nodes is not None else spec.resources.nodes
        from spotwise.provisioner.base import cloud_class

        clouds = clouds or (spec.resources.clouds
                            and [c for c in spec.resources.clouds if cloud_class(c).priced_by_catalog]) or None
        regions = spec.resources.regions or None
        if market is None and spec.resources.market != "auto":
            market = spec.resources.market
        deadline_hours = deadline_hours if deadline_hours is not None else spec.deadline_hours
        budget = budget if budget is not None else spec.budget_usd
        if hours is None and model_params is None and tokens is None:
            model_params, tokens = params_from_taskspec(spec)
            flops_per_token = flops_per_token_from_taskspec(spec)
            activation_checkpointing = spec.training.activation_checkpointing
    if gpu:
        req = parse_request(gpu, field="--gpu")
        missing = [k for k, v in req.items() if v is None]
        if missing:
            raise InputError(Problem("--gpu", gpu, "NAME:COUNT, e.g. H100:8 (GPUs per node)"))
        accelerators = {k: v for k, v in req.items() if v is not None}
    if not accelerators:
        raise InputError(Problem("--gpu", gpu, "NAME:COUNT (or a TASK.yaml with resources.accelerators)"))
    nodes = 1 if nodes is None else nodes
    if nodes < 1:
        raise InputError(Problem("--nodes", nodes, "a whole number >= 1"))
    if task:
        # the batch over the ranks each accelerator's nodes would give, as the plan checks it
        from spotwise.engine.plan.ranks import batch_error, batch_problem

        worlds = [nodes * max(1, n) for n in accelerators.values()]
        if all(batch_problem(spec, w) for w in worlds):
            raise batch_error(spec, worlds, source=task)
    if limit is not None and limit < 1:
        raise InputError(Problem("--limit", limit, "a whole number >= 1"))
    job = JobModel(hours=hours, model_params=model_params, tokens=tokens, mfu=mfu, flops_per_token=flops_per_token,
                   activation_checkpointing=activation_checkpointing)
    from spotwise.pricing.catalog import parse_markets

    markets = [m.value for m in parse_markets(market, field="--market")] if market else None
    rows = estimate(accelerators, job, nodes=nodes, clouds=clouds, regions=regions, market=markets,
                    deadline_hours=deadline_hours, budget_usd=budget, best_per_cloud_market=not all_offers)
    out = [e.to_dict() for e in rows]
    return out[:limit] if limit else out


PLOT_FORMATS = (".png", ".svg", ".pdf")


def check_plot_path(path: str, source: str = "estimate") -> str:
    """``--plot`` names a file to write: a .png, .svg or .pdf in an existing, writable directory.
    Checked before the estimate runs, so a typo costs nothing and never ends in a traceback."""
    import os
    from pathlib import Path

    from spotwise.errors import InputError, Problem

    p = Path(path)
    allowed = f"a file path ending in {', '.join(PLOT_FORMATS)} in an existing, writable directory"
    if p.suffix.lower() not in PLOT_FORMATS or p.is_dir() or "\x00" in path:
        raise InputError(Problem("--plot", path, allowed), source=source)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise InputError(Problem("--plot", path, allowed + f" ({parent} is not one)"), source=source)
    return path


def plot(rows: list[dict], path: str) -> None:
    """Scatter of expected cost vs expected finish time, one colour per market (matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for market in sorted({r["market"] for r in rows}):
        pts = [r for r in rows if r["market"] == market and r["expected_hours"] is not None]
        ax.scatter([r["expected_hours"] for r in pts], [r["expected_cost_usd"] for r in pts], label=market)
        for r in pts[:3]:
            ax.annotate(f"{r['cloud']} {r['region']}", (r["expected_hours"], r["expected_cost_usd"]), fontsize=7)
    ax.set_xlabel("expected finish time (hours)")
    ax.set_ylabel("expected cost (USD)")
    ax.set_yscale("log")
    ax.set_title("cost vs finish time per offer")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@COMMANDS.register("estimate")
def register(app: typer.Typer) -> None:
    @app.command("estimate", help="Expected hours, cost and deadline risk per offer (spot, on-demand, reserved).")
    def estimate_cmd(
        task: Optional[str] = typer.Argument(None, help="TASK.yaml (resources, deadline, budget, model)."),
        gpu: Optional[str] = typer.Option(None, "--gpu", help="NAME:COUNT per node, or alternatives 'H100:8,A100-80GB:8'."),
        nodes: Optional[int] = typer.Option(None, "--nodes", help="Nodes (default 1, or the task's)."),
        hours: Optional[float] = typer.Option(None, "--hours", help="Compute hours (skips the FLOPs model)."),
        model_params: Optional[float] = typer.Option(None, "--model-params", help="Parameters, e.g. 7e9."),
        tokens: Optional[float] = typer.Option(None, "--tokens", help="Training tokens, e.g. 1e12."),
        mfu: Optional[float] = typer.Option(None, "--mfu", help="Model FLOPs utilisation (0..1]; default: "
                                            "modelled from GPU generation, model size and nodes."),
        deadline_hours: Optional[float] = typer.Option(None, "--deadline-hours", help="Deadline in hours."),
        budget: Optional[float] = typer.Option(None, "--budget", help="Budget in USD."),
        cloud: Optional[str] = typer.Option(None, "--cloud", help="aws,gcp,azure."),
        market: Optional[str] = typer.Option(None, "--market", help="spot, on-demand, reserved-1y, reserved-3y (default all)."),
        all_offers: bool = typer.Option(False, "--all", help="Every offer, not just the cheapest per cloud x market."),
        limit: Optional[int] = typer.Option(None, "--limit", help="At most N rows."),
        plot_file: Optional[str] = typer.Option(None, "--plot", help="Write a PNG of cost vs finish time."),
        fmt: Format = format_option(),
    ) -> None:
        from spotwise.errors import InputError, Problem

        if plot_file:
            check_plot_path(plot_file)
        rows = run_estimate(task=task, gpu=gpu, nodes=nodes, hours=hours, model_params=model_params, tokens=tokens,
                            mfu=mfu, deadline_hours=deadline_hours, budget=budget, cloud=cloud, market=market,
                            all_offers=all_offers, limit=limit)
        if plot_file:
            try:
                plot(rows, plot_file)
            except OSError as e:     # the directory went away or filled up since the check
                raise InputError(Problem("--plot", plot_file, f"a writable file path ({e.strerror})"),
                                 source="estimate") from None
        if fmt is Format.json:
            print_json(rows)
            return
        print_estimate_table(rows)


def print_estimate_table(rows: list[dict]) -> None:
    """Money as ``$1,234,567``, durations in h/days/years, one short row per offer; each row's notes
    and warnings go under the table, keyed by row number (assumptions shared by all rows once)."""
    from spotwise.output import fmt_duration, fmt_money, print_table

    shared = None
    for r in rows:
        mine = {n for n in r["notes"] if n.startswith("MFU ")}
        shared = mine if shared is None else shared & mine
    shared = shared or set()
    foot: list[str] = [f"assumption: {n}" for n in sorted(shared)]
    for i, r in enumerate(rows, 1):
        r["#"] = i
        r["gpus"] = f"{r['accelerator']}:{r['accelerator_count']}x{r['nodes']}"
        r["where"] = r["region"] + (f"/{r['zone']}" if r["zone"] else "")
        r["offer"] = f"{r['cloud']} {r['instance_type']}"
        if r.get("payment_option"):
            foot.append(f"[{i}] payment: {r['payment_option']}")
        r["$/h"] = fmt_money(r["usd_per_hour"])
        r["time"] = fmt_duration(r["expected_hours"])
        r["cost"] = fmt_money(r["expected_cost_usd"])
        r["p_miss"] = "" if r["p_deadline_miss"] is None else f"{r['p_deadline_miss']:.0%}"
        r["as_of"] = {"exact": "", "upper_bound": "≤", "lower_bound": "≥", "approximate": "~"}.get(
            r.get("as_of_kind", "exact"), "") + r["as_of"]
        for w in r.get("warnings", []):
            foot.append(f"[{i}] WARNING: {w}")
        for n in r["notes"]:
            if n not in shared:
                foot.append(f"[{i}] {n}")
        foot.append(f"[{i}] price: {r['source']} ({r['as_of']})")
    print_table(rows, ["#", "offer", "market", "cost", "time", "p_miss", "gpus", "$/h", "where", "as_of"],
                optional=["p_miss", "gpus", "$/h", "where", "as_of"],
                title="estimate, cheapest expected cost first", footnotes=foot)

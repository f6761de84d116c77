"""``spotwise simulate``: replay a policy over spot traces from many random start points."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option, print_json, print_table


@COMMANDS.register("simulate")
def register(app: typer.Typer) -> None:
    @app.command("simulate", help="Simulate a spot/on-demand policy over spot traces (files or directories).")
    def simulate(
        trace: List[str] = typer.Option(..., "--trace", help="Trace file(s) or directory(ies); 'builtin' for the shipped ones."),
        policy: str = typer.Option(..., "--policy", help="Policy name (see spotwise.policies)."),
        task_hours: float = typer.Option(..., "--task-hours", help="Work in hours (C)."),
        deadline_hours: float = typer.Option(..., "--deadline-hours", help="Deadline in hours after start (R)."),
        restart_hours: float = typer.Option(..., "--restart-hours", help="Changeover delay in hours (d)."),
        starts: int = typer.Option(300, "--starts", help="Random start points per trace."),
        seed: int = typer.Option(0, "--seed"),
        spot_price: float = typer.Option(0.9731, "--spot-price", help="$/h on spot."),
        on_demand_price: float = typer.Option(3.06, "--on-demand-price", help="$/h on on-demand."),
        max_ticks: Optional[int] = typer.Option(None, "--max-ticks", help="Use only the first K ticks of each trace."),
        nodes: int = typer.Option(1, "--nodes", help="Gang size: spot counts as available only where N nodes are."),
        multi_region: bool = typer.Option(False, "--multi-region",
                                          help="One job across all given traces (one region each, same timeline)."),
        history_hours: float = typer.Option(0.0, "--history-hours",
                                            help="Show the policy up to H hours of the zone's availability before each "
                                                 "start (policies that learn from spells use it: spotwise)."),
        fmt: Format = format_option(),
        more: Optional[List[str]] = typer.Argument(None, metavar="[PATH ...]",
                                                   help="More trace paths (so that --trace A B C works)."),
    ) -> None:
        from spotwise.errors import InputError, Problem
        from spotwise.policies.base import get_policy
        from spotwise.policies.sim.evaluate import evaluate, evaluate_multi_region, summarise
        from spotwise.policies.sim.simulator import SimConfig
        from spotwise.policies.traces import builtin_traces_dir, load_traces

        problems = []
        if starts < 1:
            problems.append(Problem("--starts", starts, "a whole number >= 1"))
        if max_ticks is not None and max_ticks < 1:
            problems.append(Problem("--max-ticks", max_ticks, "a whole number >= 1"))
        if not history_hours >= 0.0:
            problems.append(Problem("--history-hours", history_hours, "a number of hours >= 0"))
        elif multi_region and history_hours > 0:
            problems.append(Problem("--history-hours", history_hours,
                                    "0 with --multi-region (history is shown to single-zone runs only)"))
        if problems:
            raise InputError(problems, source="simulate")
        cfg = SimConfig(task_h=task_hours, deadline_h=deadline_hours, restart_h=restart_hours,
                        spot_price=spot_price, on_demand_price=on_demand_price, nodes=nodes)
        pol = get_policy(policy)
        paths: list[str | Path] = [str(builtin_traces_dir()) if t == "builtin" else t for t in [*trace, *(more or [])]]
        traces = load_traces(paths)
        if max_ticks is not None:
            traces = [t.head(max_ticks) for t in traces]
        if multi_region:
            doc = summarise(policy, [evaluate_multi_region(pol, traces, cfg, starts=starts, seed=seed)], cfg)
            if fmt is Format.json:
                print_json(doc)
            else:
                print_table(doc["per_trace"], ["trace", "runs", "mean_cost_usd", "mean_on_demand_hours",
                                                "mean_spot_hours", "deadline_misses"], title=f"{policy}, multi-region")
            return
        results = evaluate(pol, traces, cfg, starts=starts, seed=seed, history_h=history_hours)
        doc = summarise(policy, results, cfg)
        if history_hours > 0:
            doc["history_hours"] = history_hours
        if fmt is Format.json:
            print_json(doc)
            return
        cols = ["trace", "runs", "mean_cost_usd", "mean_cost_vs_on_demand", "mean_on_demand_hours",
                "mean_spot_hours", "deadline_misses"]
        rows = list(doc["per_trace"])
        rows.append({"trace": "ALL", **{k: doc[k] for k in cols[1:]}})
        seen = f", {history_hours} h of history" if history_hours > 0 else ""
        print_table(rows, cols,
                    title=f"policy {policy}: C={task_hours} h, R={deadline_hours} h, d={restart_hours} h{seen}")

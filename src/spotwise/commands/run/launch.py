"""``spotwise launch TASK.yaml``: run a task end to end and print its report."""

from __future__ import annotations

import time
from typing import List, Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option, print_json


def _parse_times(value: str | None) -> list[float] | None:
    from spotwise.errors import InputError, Problem

    if value is None:
        return None
    out = []
    for part in value.split(","):
        part = part.strip()
        try:
            t = float(part)
        except ValueError:
            raise InputError(Problem("--preempt-at", value, "comma-separated seconds, e.g. 20,45")) from None
        if t < 0:
            raise InputError(Problem("--preempt-at", value, "seconds >= 0 after training starts"))
        out.append(t)
    return sorted(out)


def check_flags(*, storage: list[str] | None, trace: str | None) -> str | dict[str, str] | None:
    """``--storage`` and ``--trace`` as the task file's fields are checked (before anything runs);
    returns ``--storage`` parsed: one URI, each cloud's (``CLOUD=URI``, repeated), or None."""
    from spotwise.engine.run.run_stores import parse_storage_flags
    from spotwise.taskspec import check_trace_file

    stores = parse_storage_flags(storage)
    if trace is not None:
        check_trace_file(trace, field="--trace")
    return stores


def _reap_dead_jobs() -> None:
    """Before launching, end what earlier runs left behind when their runner died (nodes, bills,
    status ``lost``; see :func:`spotwise.engine.work.jobs.reconcile`). A failure here never stops the
    launch: ``spotwise gc`` and ``serve`` do the same."""
    import logging
    import sys

    from spotwise.engine.work import jobs

    try:
        for r in jobs.reconcile():
            print(f"[spotwise] job {r['job_id']} marked {r['status']}: {r['why']}", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - reaping is housekeeping: any failure is logged, never stops the launch
        logging.getLogger("spotwise.launch").warning("could not reap dead jobs before launching: %s", e)


def print_summary(orch, report: dict, *, wall_s: float) -> None:
    """The end of a run in the table format: a summary of at most 15 lines of 80 columns
    (:func:`spotwise.engine.display.summary.summary_lines`), with the on-demand comparison from the run's
    plan. The full report is ``--format json``'s and ``spotwise status JOB --details``'s."""
    from spotwise.engine.display.summary import on_demand_reference, summary_lines

    ref = on_demand_reference(orch.spec, orch.plan, clouds=orch.clouds, storage=orch.stores.by_cloud)
    print("\n".join(summary_lines(report, on_demand=ref, wall_s=wall_s)))


def run_and_report(orch, fmt: Format) -> None:
    """Run ``orch`` here and print its end (the JSON report, or the summary); exit 1 when the run
    failed, 130 when it was cancelled (``launch`` and ``resume`` end the same way). On a terminal,
    the run's progress stays redrawn on stderr while it runs (:mod:`spotwise.commands.run.live`)."""
    from spotwise.commands.run.live import live_progress

    started = time.monotonic()
    with live_progress(lambda: orch.progress):
        report = orch.run()
    if fmt is Format.json:
        print_json(report)
    else:
        print_summary(orch, report, wall_s=time.monotonic() - started)
    if report["status"] == "failed":
        raise typer.Exit(1)
    if report["status"] == "cancelled":
        raise typer.Exit(130)


@COMMANDS.register("launch")
def register(app: typer.Typer) -> None:
    @app.command("launch", help="Run a task end to end: pick the cheapest offer, start the cluster, "
                                "train with checkpoints, survive preemptions, tear down, report.")
    def launch(
        task: str = typer.Argument(..., help="YAML task file"),
        cloud: Optional[str] = typer.Option(None, "--cloud", help="where to run: aws, gcp, azure, local, or several "
                                                                 "comma-separated (default: the task's resources.clouds, else local)"),
        dry_run: bool = typer.Option(False, "--dry-run", help="print the plan (chosen offer, why, fallbacks) and "
                                                             "launch nothing; needs no cloud credentials"),
        budget: Optional[float] = typer.Option(None, "--budget", help="budget cap in USD (overrides the task)"),
        preempt_at: Optional[str] = typer.Option(None, "--preempt-at",
                                                 help="local cloud: preempt a spot node at these seconds after training starts "
                                                      "(a time given N times: N nodes noticed at once)"),
        no_preempt: bool = typer.Option(False, "--no-preempt", help="local cloud: no simulated preemptions"),
        storage: Optional[List[str]] = typer.Option(
            None, "--storage", help="checkpoint storage URI (file://, s3://, gs://), or CLOUD=URI once per cloud "
                                    "for a run over several (aws=s3://b/p gcp=gs://b/p): each cloud's nodes use their own"),
        trace: Optional[str] = typer.Option(None, "--trace", help="local cloud: spot trace JSON to replay"),
        notice_seconds: Optional[float] = typer.Option(None, "--notice-seconds", help="local cloud: notice period"),
        fmt: Format = format_option(),
    ) -> None:
        from spotwise.errors import InputError, Problem
        from spotwise.engine.plan.options import check_training_data, identity_deferred
        from spotwise.engine.run.orchestrator import LaunchOptions, Orchestrator, parse_clouds
        from spotwise.engine.run.run_stores import run_stores
        from spotwise.taskspec import load_taskspec

        spec = load_taskspec(task)
        stores = check_flags(storage=storage, trace=trace)
        if dry_run:
            from spotwise.engine.plan.planner import make_plan

            opts = LaunchOptions(cloud=cloud, budget_usd=budget, storage=stores)
            clouds = parse_clouds(cloud, spec)
            with identity_deferred() as needs:        # unset node identities: listed at the end, not refused
                where = run_stores(spec, opts, clouds)    # refuse what no node could reach, as a launch would
                check_training_data(spec, clouds)         # the token file too, as a launch would
            plan = make_plan(spec, clouds, budget=budget if budget is not None else spec.budget_usd,
                             storage=where.by_cloud)
            doc = plan.to_dict(limit=20)
            doc["launch_needs"] = [{"field": p.field, "allowed": p.allowed} for p in needs]
            from spotwise.taskspec import user_code

            workdir = user_code(spec).summary()
            if workdir is not None:
                doc["workdir"] = workdir
            if fmt is Format.json:
                print_json(doc)
            else:   # lines that fit 80 columns (issue 30); the JSON keeps every field whole
                print("\n".join(plan.lines(title=f"plan for {spec.name}")))
                if workdir is not None:
                    print(f"workdir: {workdir['path']} ({workdir['files']} files, {workdir['bytes']} bytes)")
                    print(f"  sha256 {workdir['sha256']}")
                if needs:
                    import textwrap

                    print("a real launch still needs:")
                    for p in needs:
                        print(textwrap.fill(f"{p.field}: {p.allowed}", 80, initial_indent="  ",
                                            subsequent_indent="    "))
            return
        times = _parse_times(preempt_at)
        if no_preempt and times:
            raise InputError(Problem("--preempt-at", preempt_at, "not together with --no-preempt"))
        if notice_seconds is not None and not (0 <= notice_seconds <= 120):
            raise InputError(Problem("--notice-seconds", notice_seconds, "0..120 seconds"))
        opts = LaunchOptions(cloud=cloud, budget_usd=budget, preempt_at=times, no_preempt=no_preempt,
                             storage=stores, trace=trace, notice_seconds=notice_seconds,
                             progress=fmt is Format.table)
        _reap_dead_jobs()
        orch = Orchestrator(spec, opts)
        run_and_report(orch, fmt)

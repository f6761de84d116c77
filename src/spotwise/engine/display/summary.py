"""The end of a run as a person reads it: at most :data:`MAX_LINES` lines of at most 80 columns
(``spotwise launch``'s table format).

What a person asks when a run ends, in order: did it work and if not why, how far it got, how long
it took, what it cost against the budget, what it saved against the same run on on-demand only,
what spot cost in preemptions and steps trained twice, and where the model is. Everything else
in the report (the plan, every attempt, every checkpoint, the events) stays in ``--format json``
and ``spotwise status JOB --details``; the summary says so on its last line.

The on-demand comparison is an estimate and says where it comes from: the planner's expected cost
of the same task on on-demand workers (:func:`on_demand_reference`: the chosen instance type's
on-demand offer in the plan, else the plan's best on-demand offer, else a plan of the task with
``market: on-demand``), for the whole run — pro rata to the steps done when the run stopped early.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping

from spotwise.engine.plan.planner import Plan, PlannedOffer, make_plan
from spotwise.taskspec import TaskSpec

MAX_LINES = 15
WIDTH = 80
_LABEL = 12                       # "checkpoint: " and the like; continuation lines are indented as much


def on_demand_reference(spec: TaskSpec, plan: Plan, *, clouds: list[str],
                        storage: str | Mapping[str, str] | None) -> dict | None:
    """The planner's expected cost of this task on on-demand workers only, as
    ``{"cost_usd", "hours", "offer", "source"}``, or None when no cloud sells it on-demand (or
    planning it fails: a comparison must never fail a run that has ended).

    The chosen instance type's on-demand offer in the same region when the plan has it (the same
    run without spot), else the plan's cheapest on-demand offer; a plan that has none (a task with
    ``market: spot``) is planned again with ``market: on-demand`` and no price cap."""
    def pick(ranked: list[PlannedOffer], source: str) -> dict | None:
        od = [p for p in ranked if p.offer.market.value == "on-demand" and math.isfinite(p.expected_cost_usd)]
        if not od:
            return None
        c = plan.chosen.offer
        same = [p for p in od if (p.offer.cloud, p.offer.region, p.offer.instance_type)
                == (c.cloud, c.region, c.instance_type)]
        best = min(same or od, key=lambda p: p.expected_cost_usd)
        o = best.offer
        return {"cost_usd": best.expected_cost_usd, "hours": best.expected_hours, "source": source,
                "offer": f"{spec.resources.nodes} x {o.instance_type} on-demand in {o.zone or o.region}"}

    try:
        got = pick(plan.ranked, "the run's plan")
        if got is None:
            res = spec.resources.model_copy(update={"market": "on-demand", "max_price_per_hour": None})
            again = make_plan(spec.model_copy(update={"resources": res}), clouds, storage=storage)
            got = pick(again.ranked, "planning the task on on-demand only")
        return got
    except Exception:  # noqa: BLE001 - a missing comparison is said as such; the run has already ended
        return None


def usd(value: float) -> str:
    """``$0.0123`` below a dollar (local runs cost fractions of a cent), ``$12.34`` above."""
    return f"${value:,.4f}" if abs(value) < 1 else f"${value:,.2f}"


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 12 s``, ``2 h 05 min``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _wall_s(report: dict) -> float | None:
    """The run's span from its events' times (first to last), when the caller did not time it."""
    ts = [e["t"] for e in report.get("events") or [] if isinstance(e.get("t"), (int, float))]
    return max(ts) - min(ts) if len(ts) >= 2 else None


def _field(label: str, text: str, *, max_lines: int = 2) -> list[str]:
    """``label:`` then ``text`` wrapped to :data:`WIDTH` (continuations under the text), at most
    ``max_lines`` lines (the last one cut with ``...``)."""
    head = f"{label}:".ljust(_LABEL)
    lines = textwrap.wrap(text, WIDTH, initial_indent=head, subsequent_indent=" " * _LABEL,
                          break_long_words=True, break_on_hyphens=False) or [head.rstrip()]
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][:WIDTH - 3] + "..."
    return lines


def _saving(report: dict, ref: dict | None) -> list[str]:
    """The on-demand figure and the saving against it (see the module's docstring)."""
    cost = float(report.get("cost_usd") or 0.0)
    plan = report.get("plan") or {}
    if ref is None and str(plan.get("chosen", "")).endswith("/on-demand") \
            and isinstance(plan.get("expected_cost_usd"), (int, float)) and math.isfinite(plan["expected_cost_usd"]):
        ref = {"cost_usd": float(plan["expected_cost_usd"]), "hours": plan.get("expected_hours"),
               "source": "the run's plan", "offer": str(plan["chosen"])}
    if ref is None:
        return _field("on-demand", "no on-demand offer to compare with")
    done, total = int(report.get("steps_completed") or 0), int(report.get("steps_total") or 0)
    full = float(ref["cost_usd"])
    part = full * done / total if total and done < total else full
    hours = f" over {ref['hours']:.3g} h" if isinstance(ref.get("hours"), (int, float)) else ""
    out = _field("on-demand", f"{usd(full)} expected for the same run on on-demand only: {ref['offer']}"
                              f"{hours}, as estimated by {ref['source']}", max_lines=3)
    if done == 0 or total == 0:
        return out + _field("saving", "none to speak of: no step was trained")
    hours_used = report.get("hours_by_market") or {}
    if hours_used.get("on_demand") and not hours_used.get("spot"):
        return out + _field("saving", "none: the run used on-demand nodes only")
    prorata = f" (on-demand pro rata for {done}/{total} steps: {usd(part)})" if part != full else ""
    if part <= 0:
        return out + _field("saving", "n/a: the on-demand estimate is zero")
    if cost <= part:
        return out + _field("saving", f"{usd(part - cost)} ({(part - cost) / part:.0%}) against on-demand "
                                      f"only{prorata}")
    return out + _field("saving", f"none: {usd(cost - part)} more than on-demand only would have cost{prorata}")


def summary_lines(report: dict, *, on_demand: dict | None = None, wall_s: float | None = None) -> list[str]:
    """The run's report (:func:`spotwise.engine.run.journal.report`, or a report read back from the
    database) as at most :data:`MAX_LINES` lines, none wider than :data:`WIDTH` columns.

    ``on_demand``: :func:`on_demand_reference`'s figure (without one, a run whose plan chose
    on-demand compares with the plan's own expected cost, and any other says it has nothing to
    compare with); ``wall_s``: the run's wall time as the caller measured it (default: the span of
    its events)."""
    job = report.get("job_id", "?")
    status = str(report.get("status", "?"))
    out = _field("job", f"{job}: {status}", max_lines=1)
    msg = report.get("message")
    if msg:
        out += _field("why", str(msg))
    done, total = report.get("steps_completed") or 0, report.get("steps_total")
    loss = report.get("loss")
    loss_txt = f", last loss {loss:.4g}" if isinstance(loss, (int, float)) and math.isfinite(loss) else ""
    legs = report.get("resumed") or []
    resumed = (f"; resumed from step {legs[-1].get('from_step')} (was {legs[-1].get('from_status')})"
               + (f", {len(legs)} resumes in all" if len(legs) > 1 else "")) if legs else ""
    out += _field("steps", f"{done}/{total if total is not None else '?'} trained{loss_txt}{resumed}")
    wall = wall_s if wall_s is not None else _wall_s(report)
    evals = [e for e in report.get("eval_loss") or [] if isinstance(e.get("loss"), (int, float))]
    if evals:
        first, last = evals[0], evals[-1]
        out += _field("eval loss", f"{last['loss']:.4g} at step {last['step']}"
                      + (f" (from {first['loss']:.4g} at step {first['step']})" if len(evals) > 1 else ""))
    out += _field("wall time", duration(wall) if wall is not None else "unknown")
    cost = float(report.get("cost_usd") or 0.0)
    budget = report.get("budget_usd")
    out += _field("cost", f"{usd(cost)} of the {usd(float(budget))} budget ({cost / budget:.0%})"
                  if isinstance(budget, (int, float)) and budget > 0 else f"{usd(cost)} (no budget)")
    out += _saving(report, on_demand)
    pre, res, lost = (report.get(k) or 0 for k in ("preemptions", "resumes", "lost_steps"))
    out += _field("spot", f"{pre} preemption{'' if pre == 1 else 's'}, {res} resume{'' if res == 1 else 's'}, "
                          f"{lost} step{'' if lost == 1 else 's'} trained twice")
    out += _field("checkpoint", str(report.get("final_checkpoint") or "none committed"))
    tail = [str(x) for x in report.get("output_tail") or [] if str(x).strip()]
    if tail:     # a failed run: where its traceback is (the user's own output first)
        out += _field("output", f"spotwise logs {job}; its last line: {tail[-1].strip()}")
    out += _field("details", f"spotwise status {job} --details", max_lines=1)
    return out[:MAX_LINES]

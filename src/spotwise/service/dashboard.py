"""The dashboard at ``/``: server-rendered pages, no JavaScript, no CDN (the service may run
with no internet). Jobs with status and spend against budget, cumulative spend over time (inline
SVG), the cheapest offers for a GPU, schedules with their next run; and a page per job
(``/jobs/{id}``): its state, its curves (loss against step; spend against time with the budget
line; preemptions and moves marked: :func:`spotwise.engine.run.curves.curves`, the same series as
``spotwise status JOB --plot`` and the API), its events in words and the last lines the job
printed (:func:`spotwise.engine.run.joblogs.lines`, as ``spotwise logs`` shows them), HTML-escaped.
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from datetime import datetime, timezone

from spotwise.engine.state import reports
from spotwise.engine.work import schedules

W, H, PAD = 720, 220, 40
#: the job's output lines its page shows (the newest), escaped: a job's output is untrusted text
OUTPUT_LINES = 200


def _e(v) -> str:
    return html.escape("" if v is None else str(v))


def _ts(t: float | None) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M") if t else ""


def _thin(pts: list[tuple[float, float]], most: int = 2000) -> list[tuple[float, float]]:
    """At most about ``most`` points, to keep a page small: every k-th one, always the last."""
    if len(pts) <= most:
        return pts
    k = len(pts) // most + 1
    return pts[::k] + [pts[-1]]


def spend_svg(series: list[tuple[float, float]]) -> str:
    if not series:
        return f'<svg id="spend-chart" width="{W}" height="{H}" role="img"><text x="{PAD}" y="{H // 2}">no spend yet</text></svg>'
    series = _thin(series)
    t0, t1 = series[0][0], series[-1][0]
    ymax = max(v for _, v in series) or 1.0
    span = (t1 - t0) or 1.0

    def xy(t, v):
        return PAD + (t - t0) / span * (W - 2 * PAD), H - PAD - v / ymax * (H - 2 * PAD)

    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(t, v) for t, v in series))
    return (f'<svg id="spend-chart" width="{W}" height="{H}" role="img" aria-label="cumulative spend">'
            f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#8c959f"/>'
            f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#8c959f"/>'
            f'<polyline fill="none" stroke="#0969da" stroke-width="2" points="{pts}"/>'
            f'<text x="{PAD + 4}" y="{PAD - 6}">${ymax:.4f}</text>'
            f'<text x="{PAD}" y="{H - PAD + 16}">{_ts(t0)} UTC</text>'
            f'<text x="{W - PAD}" y="{H - PAD + 16}" text-anchor="end">{_ts(t1)} UTC</text></svg>')


def curve_svg(svg_id: str, pts: list[tuple[float, float]], *, label: str, x_label: str, y_fmt: str = "{:.4g}",
              hline: tuple[float, str] | None = None, marks: Sequence[tuple[float, str]] = (),
              second: Sequence[tuple[float, float]] = (), second_label: str = "") -> str:
    """One curve as inline SVG: ``pts`` (x, y), an optional horizontal line (the budget),
    vertical marks (preemptions, moves), each with a ``<title>`` a browser shows on hover, and an
    optional ``second`` series on the same axes (the held-out loss: ``class="second"``)."""
    if not pts and second:
        pts, second = list(second), ()
    if not pts:
        return (f'<svg id="{svg_id}" width="{W}" height="{H}" role="img" aria-label="{_e(label)}">'
                f'<text x="{PAD}" y="{H // 2}">no {_e(label)} yet</text></svg>')
    pts = _thin(pts)
    xs = [x for x, _ in pts] + [x for x, _ in marks] + [x for x, _ in second]
    x0, x1 = min(xs), max(xs)
    ys = [y for _, y in pts] + ([hline[0]] if hline else []) + [y for _, y in second]
    y0, y1 = min(0.0, min(ys)), max(ys) or 1.0
    xspan, yspan = (x1 - x0) or 1.0, (y1 - y0) or 1.0

    def px(x: float) -> float:
        return PAD + (x - x0) / xspan * (W - 2 * PAD)

    def py(y: float) -> float:
        return H - PAD - (y - y0) / yspan * (H - 2 * PAD)

    line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
    extra = ""
    if hline:
        extra += (f'<line class="budget" x1="{PAD}" y1="{py(hline[0]):.1f}" x2="{W - PAD}" y2="{py(hline[0]):.1f}" '
                  f'stroke="#cf222e" stroke-dasharray="6 4"><title>{_e(hline[1])}</title></line>')
    if second:
        extra += ('<polyline class="second" fill="none" stroke="#cf222e" stroke-width="2" points="'
                  + " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in second)
                  + f'"><title>{_e(second_label)}</title></polyline>')
    for x, what in marks:
        extra += (f'<line class="mark" x1="{px(x):.1f}" y1="{PAD}" x2="{px(x):.1f}" y2="{H - PAD}" stroke="#bf8700" '
                  f'stroke-dasharray="2 3"><title>{_e(what)}</title></line>')
    return (f'<svg id="{svg_id}" width="{W}" height="{H}" role="img" aria-label="{_e(label)}">'
            f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#8c959f"/>'
            f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#8c959f"/>'
            f'<polyline fill="none" stroke="#0969da" stroke-width="2" points="{line}"/>{extra}'
            f'<text x="{PAD + 4}" y="{PAD - 6}">{_e(label)} (max {y_fmt.format(y1)})</text>'
            f'<text x="{W - PAD}" y="{H - PAD + 16}" text-anchor="end">{_e(x_label)}</text></svg>')


def render_job(job_id: str) -> str | None:
    """The job's page, or ``None`` when there is no such job."""
    from spotwise.curveplot import series
    from spotwise.engine.state import store
    from spotwise.engine.run.curves import curves
    from spotwise.engine.run.joblogs import lines, tagged
    from spotwise.engine.display.sentences import sentence

    row = store.get_job(job_id)
    if row is None:
        return None
    s = series(curves(job_id))
    budget = s["budget_usd"]
    loss = curve_svg("loss-chart", s["loss"], label="loss", x_label="step",
                     marks=[(x, w) for x, w in s["loss_marks"]], second=s["eval_loss"], second_label="held-out loss")
    spend = curve_svg("job-spend-chart", s["spend"], label="spend (USD)", x_label="minutes", y_fmt="${:.4f}",
                      hline=(budget, f"budget ${budget:.2f}") if budget else None,
                      marks=[(x, w) for x, w in s["spend_marks"]])
    keys = ("status", "message", "steps_completed", "preemptions", "resumes", "cost_usd", "budget_usd", "cloud",
            "created_at")
    facts = "".join(f"<tr><th>{_e(k)}</th><td>{_e(row.get(k))}</td></tr>" for k in keys if k in row)
    events = "".join(f"<li><span class=muted>{_ts(e['t'])}</span> {_e(sentence(e))}</li>"
                     for e in store.job_events(job_id))
    output = "\n".join(_e(tagged(r)) for r in lines(job_id, last=OUTPUT_LINES))
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>spotwise — {_e(job_id)}</title>
<link rel="stylesheet" href="/static/dashboard.css"></head><body>
<h1><a href="/">spotwise</a> <span class="muted">— job {_e(job_id)}</span></h1>
<section id="job"><table>{facts}</table></section>
<section id="curves"><h2>Loss</h2>{loss}<h2>Spend</h2>{spend}</section>
<section id="events"><h2>Events</h2><ul>{events or '<li class=muted>none yet</li>'}</ul></section>
<section id="output"><h2>Output <span class="muted">(the last {OUTPUT_LINES} lines; all of them:
<code>spotwise logs {_e(job_id)}</code>)</span></h2><pre id="output-lines">{output or '<span class=muted>nothing printed yet</span>'}</pre></section>
</body></html>"""


def _bar(spent: float, cap: float | None) -> str:
    if not cap:
        return f"${spent:.4f}"
    frac = spent / cap
    cls = "bar over" if frac > 1 else "bar"
    return (f'<span class="{cls}" title="{frac:.0%}"><span style="width:{min(100, frac * 100):.0f}%"></span></span> '
            f'${spent:.4f} / ${cap:.2f}')


def render(*, gpu: str = "H100", limit_jobs: int = 50) -> str:
    from spotwise.pricing.catalog import find_offers

    job_rows = "".join(
        f'<tr><td><a href="/jobs/{_e(j.job_id)}">{_e(j.job_id)}</a></td><td class="status-{_e(j.status)}">{_e(j.status)}</td>'
        f'<td>{_bar(j.spend_usd, j.budget_usd)}</td><td>{j.steps_completed}</td>'
        f'<td>{j.preemptions}</td><td>{_ts(j.created_at)}</td></tr>' for j in reports.recent_jobs(limit_jobs))
    chart = spend_svg(reports.spend_series())
    try:
        offers = find_offers({gpu: 1})[:10]
        price_rows = "".join(
            f"<tr><td>{_e(o.cloud)}</td><td>{_e(o.instance_type)}</td><td>{_e(o.region)}</td>"
            f"<td>{_e(o.market.value)}</td><td>${o.usd_per_hour:.4f}</td><td class=muted>{_e(o.as_of)}</td></tr>"
            for o in offers)
    except Exception as e:  # noqa: BLE001 - an unknown GPU name in the query string, or a catalog that
        # cannot be read: say so on the page, which still shows the jobs and schedules
        price_rows = f'<tr><td colspan=6>{_e(e)}</td></tr>'
    sched_rows = "".join(
        f"<tr><td>{_e(x['name'])}</td><td><code>{_e(x['cron'])}</code> {_e(x['timezone'])}</td>"
        f"<td>{'paused' if x['paused'] else _e(x['next_run_at'])}</td>"
        f"<td>{_e(x['budget_per_run'])}</td>"
        f"<td>{_bar(x['month_budget']['spent_usd'] + x['month_budget']['reserved_usd'], x['budget_per_month']) if x['month_budget'] else ''}</td></tr>"
        for x in schedules.list_schedules())
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>spotwise</title>
<link rel="stylesheet" href="/static/dashboard.css"></head><body>
<h1>spotwise <span class="muted">— {_ts(time.time())} UTC</span></h1>
<section id="jobs"><h2>Jobs</h2><table><tr><th>job</th><th>status</th><th>spend / budget</th><th>steps</th>
<th>preemptions</th><th>created (UTC)</th></tr>{job_rows or '<tr><td colspan=6 class=muted>no jobs yet</td></tr>'}</table></section>
<section id="spend"><h2>Spend over time</h2>{chart}</section>
<section id="prices"><h2>Cheapest {_e(gpu)} offers (per hour, 1 GPU)</h2><table><tr><th>cloud</th><th>instance</th>
<th>region</th><th>market</th><th>USD/h</th><th>as of</th></tr>{price_rows}</table></section>
<section id="schedules"><h2>Schedules</h2><table><tr><th>name</th><th>cron</th><th>next run (UTC)</th>
<th>per run</th><th>month</th></tr>{sched_rows or '<tr><td colspan=5 class=muted>no schedules</td></tr>'}</table></section>
</body></html>"""


LOGIN = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>spotwise — sign in</title>
<link rel="stylesheet" href="/static/dashboard.css"></head><body><h1>spotwise</h1><section>
<form method="post" action="/signin"><label>API token (from <code>spotwise token create</code>):
<input name="token" type="password" size="50"></label> <button type="submit">open dashboard</button></form>
</section></body></html>"""

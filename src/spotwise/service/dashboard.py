"""The dashboard at ``/``: one server-rendered page, no JavaScript, no CDN (the service may run
with no internet). Jobs with status and spend against budget, cumulative spend over time (inline
SVG), the cheapest offers for a GPU, schedules with their next run.
"""

from __future__ import annotations

import html
import time
from datetime import datetime, timezone

from spotwise.engine import reports, schedules

W, H, PAD = 720, 220, 40


def _e(v) -> str:
    return html.escape("" if v is None else str(v))


def _ts(t: float | None) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M") if t else ""


def spend_svg(series: list[tuple[float, float]]) -> str:
    if not series:
        return f'<svg id="spend-chart" width="{W}" height="{H}" role="img"><text x="{PAD}" y="{H // 2}">no spend yet</text></svg>'
    if len(series) > 2000:        # keep the page small: every k-th point, always the last
        k = len(series) // 2000 + 1
        series = series[::k] + [series[-1]]
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
        f'<tr><td>{_e(j.job_id)}</td><td class="status-{_e(j.status)}">{_e(j.status)}</td>'
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

"""The dashboard in headless Chromium (Debian's, driven by Playwright) from a live uvicorn.

Skips, with the reason, only when no Chromium binary or no playwright package is installed
(``scripts/install.sh --test`` installs both where apt is available). Saves a screenshot to
``artifacts/dashboard.png``.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from spotwise.utils.net import free_port

CHROMIUM = os.environ.get("SPOTWISE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@pytest.fixture
def live_server(sqlite_db):
    import uvicorn

    from spotwise.engine.state import db
    from spotwise.engine.work import schedules
    from spotwise.service import auth
    from spotwise.service.app import create_app
    from spotwise.service.scheduler import Scheduler

    token = auth.create_token("browser")
    now = time.time()
    with db.session() as s:
        for i, (status, budget) in enumerate((("succeeded", 1.0), ("running", 0.5), ("budget_exhausted", 0.2))):
            s.add(db.Job(id=f"demo-{i}", name="demo", status=status, cloud="local", spec={}, budget_usd=budget,
                         created_at=now - 3600 + i * 600))
        s.flush()
        for k in range(30):
            s.add(db.LedgerEntry(job_id=f"demo-{k % 3}", instance_id=f"i{k % 3}", cloud="local",
                                 market="spot" if k % 4 else "on-demand", start=now - 3000 + k * 90,
                                 end=now - 2910 + k * 90, seconds=90, usd_per_hour=0.2, usd=0.005,
                                 price_source="t", price_as_of="t"))
        for k in range(8):                                   # demo-1's curves, a preemption at the 5th point
            s.add(db.CurvePoint(job_id="demo-1", t=now - 600 + k * 10, step=k * 5, loss=4.0 - k * 0.3,
                                spend_usd=0.01 * k))
        for k, (rank, line) in enumerate((("driver", "spotwise build b1"), ("0", "step 10 loss 2.1"),
                                          ("1", "step 10 loss 2.1"), ("1", "<b>not bold</b> & <script>x=1</script>"))):
            s.add(db.JobLog(job_id="demo-1", seq=k + 1, t=now - 600 + k, rank=rank, node=f"sw-node-{rank}",
                            stream="stdout", line=line))
        s.add(db.Event(job_id="demo-1", t=now - 600 + 45, kind="preempted",
                       detail={"instance_id": "w1", "market": "spot", "zone": "local-a"}))
        s.commit()
    schedules.create_schedule({"name": "nightly"}, cron="0 2 * * *", timezone="Europe/Berlin",
                              budget_per_run=0.5, budget_per_month=10)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(Scheduler(launcher=lambda j: None)), host="127.0.0.1",
                                           port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}", token
    finally:
        server.should_exit = True
        th.join(timeout=30)
        assert not th.is_alive()


def test_dashboard_renders_in_chromium(live_server):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (scripts/install.sh --test installs Debian's chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    base, token = live_server
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 1200})
            page.goto(f"{base}/")
            assert page.locator("input[name=token]").is_visible()          # sign-in first
            page.fill("input[name=token]", token)
            page.click("button[type=submit]")
            page.wait_for_selector("#spend-chart polyline")
            assert page.locator("#jobs tr").count() == 4                  # header + 3 jobs
            assert "budget_exhausted" in page.inner_text("#jobs")
            assert page.locator("#prices tr").count() > 1
            assert "nightly" in page.inner_text("#schedules")
            color = page.eval_on_selector("#jobs .status-succeeded", "e => getComputedStyle(e).color")
            assert color == "rgb(26, 127, 55)"                           # the stylesheet was served
            page.screenshot(path=str(shot), full_page=True)
            page.click("a[href='/jobs/demo-1']")                         # the job's own page, same cookie
            page.wait_for_selector("#loss-chart polyline")
            assert len(page.get_attribute("#loss-chart polyline", "points").split()) == 8
            assert page.locator("#job-spend-chart line.budget").count() == 1
            assert page.locator("#loss-chart line.mark").count() == 1
            assert "preempted" in page.inner_text("#events")
            out = page.inner_text("#output-lines").splitlines()     # the job's output, as `spotwise logs` prints it
            assert out == ["[driver node sw-node-driver] spotwise build b1", "[rank 0 node sw-node-0] step 10 loss 2.1",
                           "[rank 1 node sw-node-1] step 10 loss 2.1",
                           "[rank 1 node sw-node-1] <b>not bold</b> & <script>x=1</script>"]   # text, not markup
            assert page.locator("#output-lines b, #output-lines script").count() == 0
            page.screenshot(path=str(ARTIFACTS / "dashboard-job.png"), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000

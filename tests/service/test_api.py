"""The HTTP API through FastAPI's TestClient, on SQLite and PostgreSQL."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from spotwise.engine.state import db
from spotwise.service import auth
from spotwise.service.app import create_app
from spotwise.service.scheduler import Scheduler

TASK = {"name": "api-run", "resources": {"nodes": 1, "market": "spot"}, "training": {"steps": 10}}


class Recorder:
    def __init__(self):
        self.started = []

    def __call__(self, job_id):
        self.started.append(job_id)


@pytest.fixture
def client(database):
    rec = Recorder()
    app = create_app(Scheduler(launcher=rec))
    app.state.recorder = rec
    token = auth.create_token("test")
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as c:
        c.recorder = rec
        c.token = token
        yield c


def test_requests_without_a_valid_token_get_401(client):
    bare = TestClient(client.app)
    for path in ("/api/v1/jobs", "/api/v1/prices?accelerator=H100", "/metrics"):
        assert bare.get(path).status_code == 401
        assert bare.get(path, headers={"Authorization": "Bearer sw_nope"}).status_code == 401
    assert bare.get("/").status_code == 401           # the sign-in page
    assert bare.get("/healthz").status_code == 200
    with db.session() as s:                            # only the hash is stored
        [row] = s.query(db.ApiToken).all()
        assert row.sha256 == auth.digest(client.token) and client.token not in row.sha256


def test_revoked_token_is_refused(client):
    auth.revoke(auth.list_tokens()[0]["id"])
    assert client.get("/api/v1/jobs").status_code == 401


def test_prices_and_estimates(client):
    r = client.get("/api/v1/prices", params={"accelerator": "H100", "market": "spot", "limit": 3})
    assert r.status_code == 200
    offers = r.json()["offers"]
    assert len(offers) == 3 and all(o["market"] == "spot" for o in offers)
    assert [o["usd_per_hour"] for o in offers] == sorted(o["usd_per_hour"] for o in offers)
    r = client.get("/api/v1/estimates", params={"accelerator": "H100", "hours": 10})
    assert r.status_code == 200 and r.json()["count"] > 0


def test_422s_name_the_field(client):
    r = client.get("/api/v1/prices", params={"accelerator": "H999"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "accelerators"
    r = client.get("/api/v1/prices", params={"accelerator": "H100", "count": 99})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "count"
    r = client.post("/api/v1/jobs", json={"task": {"name": "Bad Name!"}})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "name"
    r = client.post("/api/v1/schedules", json={"task": TASK, "cron": "nope"})
    assert r.status_code == 422 and r.json()["detail"][0] == {
        "field": "cron", "given": "nope",
        "allowed": "a 5-field cron line 'minute hour day month weekday', e.g. '0 2 * * *'"}
    r = client.post("/api/v1/budgets", json={"id": "b", "cap_usd": -1})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "cap_usd"


def test_launch_records_then_starts_and_budget_reservation(client):
    assert client.post("/api/v1/budgets", json={"id": "team", "cap_usd": 1.0}).status_code == 201
    r = client.post("/api/v1/jobs", json={"task": TASK, "budget_usd": 0.6, "budget_id": "team"})
    assert r.status_code == 202
    job_id = r.json()["job_id"]
    assert client.recorder.started == [job_id]
    j = client.get(f"/api/v1/jobs/{job_id}").json()
    assert j["status"] == "pending" and j["budget_usd"] == 0.6
    assert client.get("/api/v1/budgets/team").json()["reserved_usd"] == 0.6
    r = client.post("/api/v1/jobs", json={"task": TASK, "budget_usd": 0.6, "budget_id": "team"})
    assert r.status_code == 409 and "would exceed" in r.json()["detail"]
    assert client.get("/api/v1/jobs").json()[0]["job_id"] == job_id
    assert client.get(f"/api/v1/jobs/{job_id}/events").json() == []
    assert client.get("/api/v1/jobs/nope").status_code == 404
    # cancel: its runner never started here, so it is cancelled at once and its money freed
    assert client.post(f"/api/v1/jobs/{job_id}/cancel").json()["result"] == "cancelled"
    assert client.get("/api/v1/budgets/team").json()["remaining_usd"] == 1.0
    assert client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 422


def test_resume_a_budget_stopped_job_over_the_api(client, home):
    """``POST /jobs/{id}/resume`` is ``spotwise resume``: the job is taken (pending again, started by
    the launcher), its new money reserved against the job's budget, and each refusal is a 404/409
    with the one-line reason."""
    import json

    assert client.post("/api/v1/budgets", json={"id": "team", "cap_usd": 2.0}).status_code == 201
    job_id = client.post("/api/v1/jobs", json={"task": TASK, "budget_usd": 0.5, "budget_id": "team"}).json()["job_id"]
    assert client.post(f"/api/v1/jobs/{job_id}/resume").status_code == 409       # pending: not twice
    with db.session() as s:                           # its run: $0.49 spent, stopped by its budget at step 4
        j = s.get(db.Job, job_id)
        j.status, j.started_at = "budget_exhausted", time.time()
        s.add(db.LedgerEntry(job_id=job_id, instance_id="i-1", cloud="local", market="spot", start=0, end=49,
                             seconds=49, usd_per_hour=36.0, usd=0.49, price_source="t", price_as_of="t"))
        s.commit()
    from spotwise.engine.work.budgets import settle_job

    settle_job(job_id)
    r = client.post(f"/api/v1/jobs/{job_id}/resume", json={"budget_usd": 1.0})
    assert r.status_code == 409 and "nothing to resume from" in r.json()["detail"]
    d = home / "checkpoints" / job_id / "checkpoints" / "step_000000004"
    d.mkdir(parents=True)
    (d / "COMMITTED").write_text(json.dumps({"kind": "stop", "world_size": 1}))
    r = client.post(f"/api/v1/jobs/{job_id}/resume")
    assert r.status_code == 409 and "--budget USD (API: budget_usd)" in r.json()["detail"]
    assert client.post(f"/api/v1/jobs/{job_id}/resume", json={"budget_usd": -1}).status_code == 422
    assert client.post(f"/api/v1/jobs/{job_id}/resume", json={"budget_usd": 5.0}).status_code == 409  # > the budget
    r = client.post(f"/api/v1/jobs/{job_id}/resume", json={"budget_usd": 1.0, "deadline_hours": 3})
    assert r.status_code == 202, r.text
    assert r.json() == {"job_id": job_id, "status": "pending", "from_step": 4, "from_status": "budget_exhausted",
                        "budget_usd": 1.49, "spent_usd": 0.49}
    assert client.recorder.started == [job_id, job_id]
    b = client.get("/api/v1/budgets/team").json()
    assert (b["spent_usd"], b["reserved_usd"]) == (0.49, 1.0)
    j = client.get(f"/api/v1/jobs/{job_id}").json()
    assert j["status"] == "pending" and j["budget_usd"] == 1.49 and j["deadline_hours"] == 3
    r = client.post(f"/api/v1/jobs/{job_id}/resume", json={"budget_usd": 0.1})
    assert r.status_code == 409 and r.json()["detail"] == f"cannot resume job {job_id}: it is pending: a job runs " \
        "one runner at a time (if its runner died, `spotwise gc` marks it lost first)"
    r = client.post("/api/v1/jobs/nope/resume", json={"budget_usd": 1.0})
    assert r.status_code == 404 and "no such job" in r.json()["detail"]


def test_schedules_crud(client):
    r = client.post("/api/v1/schedules", json={"task": TASK, "cron": "0 2 * * *", "timezone": "Europe/Berlin",
                                               "budget_per_run": 0.5, "budget_per_month": 5, "name": "nightly"})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert [s["name"] for s in client.get("/api/v1/schedules").json()] == ["nightly"]
    assert client.post("/api/v1/schedules/nightly/pause").json()["paused"] is True
    assert client.post(f"/api/v1/schedules/{sid}/resume").json()["paused"] is False
    assert client.patch("/api/v1/schedules/nightly", json={"cron": "30 3 * * *"}).json()["cron"] == "30 3 * * *"
    assert client.get("/api/v1/schedules/nightly").json()["month_budget"]["cap_usd"] == 5
    assert any(b["id"] == f"schedule:{sid}" for b in client.get("/api/v1/budgets").json())
    assert client.delete("/api/v1/schedules/nightly").json() == {"removed": sid}
    assert client.get("/api/v1/schedules/nightly").status_code == 404


def test_cost_report_metrics_and_dashboard(client):
    with db.session() as s:
        s.add(db.Job(id="j1", name="n", status="succeeded", cloud="local", spec={}, created_at=time.time(),
                     budget_usd=1.0))
        s.flush()
        s.add(db.Event(job_id="j1", t=time.time(), kind="preempted", detail={}))
        t = time.time() - 100
        for i, market in enumerate(("spot", "spot", "on-demand")):
            s.add(db.LedgerEntry(job_id="j1", instance_id=f"i{i}", cloud="local", market=market, start=t + i,
                                 end=t + i + 10, seconds=10, usd_per_hour=0.36, usd=0.001, price_source="t",
                                 price_as_of="t"))
        s.commit()
    rep = client.get("/api/v1/cost-report", params={"job_id": "j1"}).json()
    assert rep["total_usd"] == pytest.approx(0.003) and rep["by_market"] == {"spot": 0.002, "on-demand": 0.001}
    m = client.get("/metrics").text
    assert 'spotwise_jobs{status="succeeded"} 1.0' in m
    assert 'spotwise_spend_usd_total{cloud="local",market="spot"} 0.002' in m
    assert "spotwise_preemptions_total 1.0" in m
    page = client.get("/")
    assert page.status_code == 200 and "j1" in page.text and "<polyline" in page.text
    # the browser path: the sign-in form posts the token, which sets a cookie, then the page
    # opens without a header
    bare = TestClient(client.app)
    r = bare.post("/signin", data={"token": client.token}, follow_redirects=False)
    assert r.status_code == 303 and "spotwise_token" in r.headers["set-cookie"]
    assert bare.get("/").status_code == 200

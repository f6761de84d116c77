"""Hostile and careless API input: never a 500, always valid JSON, and a token holder cannot make
the server touch files outside its roots. On SQLite and PostgreSQL (``database`` fixture)."""

from __future__ import annotations

import json
import threading

import pytest
from fastapi.testclient import TestClient

from spotwise.engine.work import budgets, schedules
from spotwise.engine.state import db
from spotwise.service import auth
from spotwise.service.app import create_app
from spotwise.service.scheduler import Scheduler

TASK = {"name": "sec-run", "training": {"steps": 5}}


def strict_json(text: str):
    """Parse as a strict JSON parser would: NaN/Infinity literals are errors."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def client(database):
    started = []
    app = create_app(Scheduler(launcher=started.append))
    token = auth.create_token("sec")
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as c:
        c.started, c.token = started, token
        yield c


def post_raw(client, path, text):
    return client.post(path, content=text.encode("utf-8", "surrogatepass"),
                       headers={"Content-Type": "application/json"})


# -- numbers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,field", [
    ('{"task": {"name": "x", "budget_usd": 1e400}}', "budget_usd"),
    ('{"task": {"name": "x", "budget_usd": NaN}}', "budget_usd"),
    ('{"task": {"name": "x", "deadline_hours": -Infinity}}', "deadline_hours"),
    ('{"task": {"name": "x", "resources": {"max_price_per_hour": Infinity}}}', "resources.max_price_per_hour"),
    ('{"task": {"name": "x"}, "budget_usd": 1e400}', "budget_usd"),
])
def test_non_finite_numbers_are_422_naming_the_field_in_valid_json(client, text, field):
    r = post_raw(client, "/api/v1/jobs", text)
    assert r.status_code == 422, r.text
    body = strict_json(r.text)
    assert any(d["field"].endswith(field) for d in body["detail"]), body
    assert not client.started


def test_schedule_and_budget_refuse_infinite_money(client):
    r = post_raw(client, "/api/v1/schedules",
                 json.dumps({"task": TASK, "cron": "0 2 * * *"})[:-1] + ', "budget_per_month": 1e400}')
    assert r.status_code == 422 and "budget_per_month" in r.text
    r = post_raw(client, "/api/v1/budgets", '{"id": "b1", "cap_usd": Infinity}')
    assert r.status_code == 422 and "cap_usd" in r.text
    assert client.get("/api/v1/schedules").json() == [] and client.get("/api/v1/budgets").json() == []


def test_rows_already_holding_non_finite_values_do_not_break_reads(client):
    """Written before inputs were checked (or by hand): reads answer 200, non-finite as null."""
    import time

    inf = float("inf")
    with db.session() as s:
        s.add(db.Job(id="old-1", name="old", status="succeeded", cloud="local", spec={}, budget_usd=inf,
                     deadline_hours=inf, created_at=time.time(), steps_completed=0, preemptions=0, resumes=0))
        s.add(db.Budget(id="b-inf", name="b", cap_usd=inf, period="month", timezone="UTC", created_at=time.time()))
        s.add(db.Schedule(id="s1", name="s1", task=TASK, cron="0 2 * * *", timezone="UTC", budget_per_run=None,
                          budget_per_month=inf, paused=False, overlap="skip", created_at=time.time(),
                          last_fire_at=time.time()))
        s.add(db.Budget(id=schedules.month_budget_id("s1"), name="m", cap_usd=inf, period="month",
                        timezone="UTC", created_at=time.time()))
        s.commit()
    for path in ("/api/v1/jobs", "/api/v1/jobs/old-1", "/api/v1/schedules", "/api/v1/schedules/s1",
                 "/api/v1/budgets", "/api/v1/budgets/b-inf", "/metrics", "/"):
        r = client.get(path)
        assert r.status_code == 200, (path, r.text[:300])
        if path.startswith("/api/"):
            strict_json(r.text)
    assert client.get("/api/v1/jobs/old-1").json()["budget_usd"] is None


def test_422_echoing_a_lone_surrogate_is_valid_utf8_json(client):
    r = post_raw(client, "/api/v1/jobs", '{"task": {"name": "\\ud800x", "policy": "\\udfff"}}')
    assert r.status_code == 422
    r.content.decode("utf-8")          # strict: valid UTF-8
    strict_json(r.text)
    r = post_raw(client, "/api/v1/budgets", '{"id": "ok", "cap_usd": 5, "timezone": "\\ud800"}')
    assert r.status_code == 422
    strict_json(r.content.decode("utf-8"))


# -- NUL, cron, duplicates -------------------------------------------------------------------------
@pytest.mark.parametrize("method,path,body", [
    ("post", "/api/v1/budgets", {"id": "b", "cap_usd": 5, "name": "a\x00b"}),
    ("post", "/api/v1/budgets", {"id": "b", "cap_usd": 5, "timezone": "UTC\x00"}),
    ("post", "/api/v1/schedules", {"task": TASK, "cron": "0 2 * * *", "name": "n\x00"}),
    ("post", "/api/v1/jobs", {"task": {**TASK, "local": {"trace": "/x\x00"}}}),
    ("get", "/api/v1/jobs/a%00b", None),
    ("get", "/api/v1/jobs?status=a%00", None),
    ("get", "/api/v1/schedules/a%00", None),
    ("get", "/api/v1/budgets/a%00", None),
    ("get", "/api/v1/cost-report?job_id=%00", None),
])
def test_nul_characters_are_422_not_500(client, method, path, body):
    r = client.request(method.upper(), path, json=body) if body is not None else client.request(method.upper(), path)
    assert r.status_code == 422, r.text
    strict_json(r.text)


def test_cron_that_never_fires_is_422(client):
    r = client.post("/api/v1/schedules", json={"task": TASK, "cron": "0 0 31 2 *"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "cron"
    assert "never" in r.json()["detail"][0]["allowed"]
    assert client.get("/api/v1/schedules").status_code == 200


def test_duplicate_creates_are_409(client):
    assert client.post("/api/v1/budgets", json={"id": "team", "cap_usd": 5}).status_code == 201
    r = client.post("/api/v1/budgets", json={"id": "team", "cap_usd": 7})
    assert r.status_code == 409 and r.json()["detail"][0]["field"] == "id"
    assert client.post("/api/v1/schedules", json={"task": TASK, "cron": "0 2 * * *"}).status_code == 201
    r = client.post("/api/v1/schedules", json={"task": TASK, "cron": "0 3 * * *"})
    assert r.status_code == 409 and r.json()["detail"][0]["field"] == "name"


@pytest.mark.parametrize("what", ["schedule", "budget"])
def test_concurrent_duplicate_creates_make_one_row_and_conflicts(client, what):
    """N threads create the same name at once: exactly one row, every other caller a Conflict
    (a 409 through the API), never an IntegrityError (a 500)."""
    from spotwise.errors import Conflict

    n = 8
    gate = threading.Barrier(n)
    results: list[str] = []

    def create():
        gate.wait()
        try:
            if what == "schedule":
                schedules.create_schedule(TASK, cron="0 2 * * *", name="same", budget_per_month=10)
            else:
                budgets.create_budget("same", cap_usd=10)
            results.append("ok")
        except Conflict:
            results.append("conflict")
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            results.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=create) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["conflict"] * (n - 1) + ["ok"], results
    with db.session() as s:
        model = db.Schedule if what == "schedule" else db.Budget
        assert s.query(model).count() == 1


# -- who can do what ------------------------------------------------------------------------------
@pytest.mark.parametrize("storage", [
    "file:///tmp/anywhere", "file://${SPOTWISE_HOME}/../x", "file://../../x", "file://host/x",
    "file://${SPOTWISE_HOME}/checkpoints/../../x", "s3://bu cket/x", "s3://UPPER/x", "ftp://x/y",
])
def test_file_storage_is_confined_for_api_jobs(client, home, storage):
    task = {**TASK, "training": {"steps": 5, "checkpoint": {"storage": storage}}}
    for path, body in (("/api/v1/jobs", {"task": task}), ("/api/v1/schedules", {"task": task, "cron": "0 2 * * *"})):
        r = client.post(path, json=body)
        assert r.status_code == 422, (path, r.text)
        assert "storage" in r.json()["detail"][0]["field"]
    assert not client.started
    assert not (home.parent / "x").exists()


def test_each_clouds_store_of_a_per_cloud_storage_is_confined_too(client, home):
    """A per-cloud mapping is confined store by store, the error naming the cloud's key."""
    task = {**TASK, "training": {"steps": 5, "checkpoint": {"storage": {"aws": "s3://ckpt/runs",
                                                                        "local": "file:///tmp/anywhere"}}}}
    r = client.post("/api/v1/jobs", json={"task": task})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "task.training.checkpoint.storage.local"
    assert not client.started


def test_file_storage_under_the_root_is_accepted(client, home, tmp_path, monkeypatch):
    ok = {**TASK, "training": {"steps": 5, "checkpoint": {"storage": "file://${SPOTWISE_HOME}/checkpoints/team-a"}}}
    assert client.post("/api/v1/jobs", json={"task": ok}).status_code == 202
    root = tmp_path / "ckroot"
    root.mkdir()
    monkeypatch.setenv("SPOTWISE_FILE_STORAGE_ROOT", str(root))
    inside = {**TASK, "training": {"steps": 5, "checkpoint": {"storage": f"file://{root}/run"}}}
    assert client.post("/api/v1/jobs", json={"task": inside}).status_code == 202
    assert client.post("/api/v1/jobs", json={"task": ok}).status_code == 422   # now outside the root


def test_a_file_token_file_is_confined_for_api_jobs(client, home):
    outside = {**TASK, "training": {"steps": 5, "data": {"uri": "file:///etc/tokens.bin"}}}
    r = client.post("/api/v1/jobs", json={"task": outside})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "task.training.data.uri"
    inside = {**TASK, "training": {"steps": 5, "data": {"uri": "file://${SPOTWISE_HOME}/checkpoints/d/tokens.bin"}}}
    assert client.post("/api/v1/jobs", json={"task": inside}).status_code == 202


def test_local_trace_answer_does_not_tell_whether_a_file_exists(client, home):
    answers = set()
    for trace in ("/etc/passwd", "/no/such/file", "/etc", str(home / "spotwise.db")):
        r = client.post("/api/v1/jobs", json={"task": {**TASK, "local": {"trace": trace}}})
        assert r.status_code == 422
        [d] = r.json()["detail"]
        answers.add((d["field"], d["allowed"]))
    assert len(answers) == 1


def test_policy_must_be_registered(client):
    r = client.post("/api/v1/jobs", json={"task": {**TASK, "policy": "rm -rf /"}})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "policy"
    assert "spot-fallback" in r.json()["detail"][0]["allowed"] and not client.started


# -- the front door ------------------------------------------------------------------------------
def test_security_headers_and_sign_in_without_token_in_url(client):
    bare = TestClient(client.app)
    page = bare.get("/")
    assert page.status_code == 401
    assert page.headers["x-frame-options"] == "DENY" and "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert 'method="post"' in page.text and 'action="/signin"' in page.text
    assert bare.get(f"/?token={client.token}").status_code == 400          # never via the URL
    assert "spotwise_token" not in bare.cookies
    r = bare.post("/signin", data={"token": client.token}, follow_redirects=False)
    cookie = r.headers["set-cookie"].lower()
    assert r.status_code == 303 and "httponly" in cookie and "samesite=strict" in cookie and "secure" not in cookie
    secure = TestClient(client.app, base_url="https://testserver")
    r = secure.post("/signin", data={"token": client.token}, follow_redirects=False)
    assert "; secure" in r.headers["set-cookie"].lower()
    assert bare.post("/signin", data={"token": "sw_wrong"}).status_code == 401
    assert client.get("/api/v1/jobs").headers["x-content-type-options"] == "nosniff"


def test_sqlite_file_is_private(client, database):
    import os
    import stat

    if not database.startswith("sqlite"):
        pytest.skip("a SQLite property")
    path = database.split("///", 1)[1]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


# -- user code (issue 31): only when the server enables it ---------------------------------------
@pytest.mark.parametrize("task, fields", [
    ({"name": "x", "training": {"entrypoint": "os.path:join"}}, "task.training.entrypoint"),
    ({"name": "x", "training": {"train_func": "pkg.mod:train_func"}}, "task.training.train_func"),
    ({"name": "x", "workdir": "/etc", "training": {"entrypoint": "pkg.mod:make_spec"}},
     "task.training.entrypoint, task.workdir"),
    ({"name": "x", "env": {"A": "1"}}, "task.env"),
])
def test_user_code_is_refused_with_403_naming_the_field(client, task, fields):
    r = client.post("/api/v1/jobs", json={"task": task})
    assert r.status_code == 403, r.text
    detail = r.json()["detail"]
    assert detail.startswith(f"{fields}: ") and "does not run user code" in detail
    assert "SPOTWISE_SERVE_USER_CODE=1" in detail
    assert not client.started


def test_a_server_that_serves_user_code_takes_a_workdir_zip_in_storage(client, monkeypatch):
    monkeypatch.setenv("SPOTWISE_SERVE_USER_CODE", "1")
    task = {"name": "x", "workdir": "s3://bucket/code/5f3a.zip", "pip": ["numpy"],
            "training": {"train_func": "pkg.mod:train_func", "config": {"steps": 3}}}
    r = client.post("/api/v1/jobs", json={"task": task})
    assert r.status_code == 202, r.text
    assert client.started == [r.json()["job_id"]]


@pytest.mark.parametrize("task, field", [
    ({"name": "x", "workdir": "/etc", "training": {"entrypoint": "pkg.mod:make_spec"}}, "task.workdir"),
    ({"name": "x", "workdir": "code", "training": {"entrypoint": "pkg.mod:make_spec"}}, "task.workdir"),
    ({"name": "x", "workdir": "s3://bucket/code", "training": {"entrypoint": "pkg.mod:make_spec"}}, "task.workdir"),
    ({"name": "x", "pip": "requirements.txt", "training": {"entrypoint": "pkg.mod:make_spec"}}, "task.pip"),
])
def test_served_user_code_never_names_a_path_on_the_server(client, monkeypatch, task, field):
    monkeypatch.setenv("SPOTWISE_SERVE_USER_CODE", "1")
    r = client.post("/api/v1/jobs", json={"task": task})
    assert r.status_code == 422, r.text
    [d] = r.json()["detail"]
    assert d["field"] == field and "server's disk" in d["allowed"], d
    r = client.post("/api/v1/schedules", json={"task": task, "cron": "0 2 * * *"})
    assert r.status_code == 422 and field in r.text
    assert not client.started


def test_a_stored_task_keeps_its_unset_keys_unset(client, monkeypatch):
    """Stored whole, every default became "set" when the job ran: a user entrypoint's spec had its
    own steps, precision and checkpoint interval replaced by the task defaults."""
    from spotwise.taskspec import parse_taskspec

    monkeypatch.setenv("SPOTWISE_SERVE_USER_CODE", "1")
    task = {"name": "x", "workdir": "s3://bucket/code.zip",
            "training": {"entrypoint": "pkg.mod:make_spec", "checkpoint": {"keep_last": 3}}}
    r = client.post("/api/v1/jobs", json={"task": task, "budget_usd": 2.0})
    assert r.status_code == 202, r.text
    with db.session() as s:
        stored = s.get(db.Job, r.json()["job_id"]).spec
    assert stored == {**task, "budget_usd": 2.0}
    spec = parse_taskspec(stored)
    assert spec.training.overrides() == {"keep_last": 3}
    r = client.post("/api/v1/schedules", json={"task": task, "cron": "0 2 * * *"})
    assert r.status_code in (200, 201), r.text
    with db.session() as s:
        [sch] = s.query(db.Schedule).all()
    assert sch.task == task

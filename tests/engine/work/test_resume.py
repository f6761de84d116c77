"""``spotwise resume`` through the orchestrator's parts, with the recording fakes of
``orchestrator_fakes.py`` (no node, no Ray): a budget-stopped run resumed as the same job (its
ledger continued, the cap its spend plus the new money), every refusal with its one-line reason,
two resumes at once, a resume that cannot start going back to what it was, and the CLI command."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from orchestrator_fakes import Control, FakeCloud, Jobs, Lease
from test_orchestrator_run import StopsAtACheckpoint

from spotwise.cli import main
from spotwise.engine.work import budgets, jobs, resume
from spotwise.engine.state import db
from spotwise.engine.run import orchestrator
from spotwise.engine.run.orchestrator import Factories, LaunchOptions, Orchestrator
from spotwise.engine.work.resume import ResumeRefused
from spotwise.taskspec import parse_taskspec

FAST = dict(tick_s=0.01, policy_interval_s=0.05)


def task(home: Path, **over):
    data = {"name": "r", "resources": {"nodes": 2, "market": "spot", "clouds": ["local"]},
            "training": {"steps": 10, "checkpoint": {"storage": f"file://{home}/ckpt"}}, "budget_usd": 1.0}
    data.update(over)
    return parse_taskspec(data)


def fakes(log: list, jobs_api: Jobs) -> Factories:
    cloud = FakeCloud("local", log)
    return Factories(cloud=lambda name: cloud, lease=lambda job_id, budget: Lease(log, job_id),
                     jobs_client=lambda url, headers: jobs_api, control=lambda url, token: Control(log, jobs_api, url))


def commit_checkpoint(home: Path, job_id: str, step: int) -> str:
    """What the runtime leaves in the run's storage: a step directory with its commit marker."""
    d = home / "ckpt" / job_id / "checkpoints" / f"step_{step:09d}"
    d.mkdir(parents=True)
    (d / "COMMITTED").write_text(json.dumps({"step": step, "kind": "stop", "world_size": 2}))
    return f"file://{d}"


def ledger_rows(job_id: str) -> list[tuple]:
    with db.session() as s:
        return [(r.id, r.instance_id, r.usd) for r in s.query(db.LedgerEntry).filter_by(job_id=job_id)
                .order_by(db.LedgerEntry.id)]


def budget_stopped_run(home: Path) -> Orchestrator:
    """A run stopped by its budget at a checkpoint (step 4 of 10), as in test_orchestrator_run."""
    log: list = []
    o = Orchestrator(task(home), LaunchOptions(**FAST), factories=fakes(log, StopsAtACheckpoint(log)))
    o.purse.ledger.spend = lambda now=None: 0.98           # a minute more would pass $1: the budget stop
    rep = o.run()
    assert rep["status"] == "budget_exhausted" and "spotwise resume" in rep["message"]
    commit_checkpoint(home, o.job_id, 4)
    return o


def job_row(job_id: str) -> db.Job:
    with db.session() as s:
        return s.get(db.Job, job_id)


def add_job(home: Path, job_id: str, status: str, **cols) -> None:
    spec = task(home).model_dump(mode="json", exclude_unset=True)
    with db.session() as s:
        s.add(db.Job(id=job_id, name="r", status=status, cloud="local", cluster_id="swold", spec=spec,
                     budget_usd=cols.pop("budget_usd", 1.0), created_at=1.0, started_at=2.0, **cols))
        s.commit()


def test_a_budget_stopped_run_resumes_as_the_same_job_its_ledger_continued_and_its_cap_spent_plus_new(local_home):
    first = budget_stopped_run(local_home)
    before = ledger_rows(first.job_id)
    spent = sum(usd for _, _, usd in before)
    assert before and spent > 0
    stored = job_row(first.job_id).spec          # the task as run: storage and clouds recorded with the job
    assert stored["training"]["checkpoint"]["storage"] == f"file://{local_home}/ckpt"
    assert stored["resources"]["clouds"] == ["local"]

    res = resume.prepare(first.job_id, budget_usd=1.0)
    assert (res.from_status, res.from_step, res.spent_usd) == ("budget_exhausted", 4, pytest.approx(spent))
    assert res.budget_usd == pytest.approx(spent + 1.0) and res.cluster_id != first.cluster_id
    row = job_row(first.job_id)
    assert row.status == "pending" and row.budget_usd == pytest.approx(spent + 1.0) and row.finished_at is None

    log: list = []
    o = Orchestrator(res.spec, LaunchOptions(budget_usd=res.budget_usd, **FAST), job_id=first.job_id,
                     cluster_id=res.cluster_id, factories=fakes(log, Jobs(log)), resume=True)
    assert o.storage == first.storage                              # where the runtime finds the checkpoints
    assert o.purse.budget_usd == pytest.approx(spent + 1.0)        # the cap the purse enforces: spent + new
    assert o.purse.ledger.spend() == pytest.approx(spent)          # the leg starts from the job's spend
    rep = o.run()
    assert rep["status"] == "succeeded" and rep["job_id"] == first.job_id
    after = ledger_rows(first.job_id)
    assert after[:len(before)] == before and len(after) > len(before)   # the same ledger, continued, nothing rebilled
    assert rep["cost_usd"] == pytest.approx(sum(usd for _, _, usd in after), abs=1e-6)
    assert rep["cost_usd"] <= rep["budget_usd"]
    assert [(r["from_status"], r["from_step"]) for r in rep["resumed"]] == [("budget_exhausted", 4)]
    assert ("submit", f"spotwise-{first.job_id}") in log               # the same run name for the runtime
    row = job_row(first.job_id)
    assert row.status == "succeeded" and row.cluster_id == res.cluster_id
    from spotwise.engine.display.summary import summary_lines

    assert "resumed from step 4 (was budget_exhausted)" in " ".join(summary_lines(rep))
    from spotwise.engine.state.store import job_events

    from spotwise.engine.display.sentences import sentence

    [ev] = [e for e in job_events(first.job_id) if e["event"] == "resumed"]
    assert ev["from_step"] == 4
    assert sentence(ev).startswith(f"resumed from step 4 (was budget_exhausted, ${spent:.4f} spent): cap $1.")


def test_without_budget_a_budget_exhausted_job_is_refused_saying_to_add_money(local_home):
    first = budget_stopped_run(local_home)
    with pytest.raises(ResumeRefused, match="--budget USD") as e:
        resume.prepare(first.job_id)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert job_row(first.job_id).status == "budget_exhausted"                  # nothing changed


@pytest.mark.parametrize("status,cols,needle,http", [
    ("succeeded", {"final_checkpoint": "file:///x/final"}, "it succeeded: nothing is left to train", 409),
    ("running", {}, "it is running", 409),
    ("pending", {}, "it is pending", 409),
    ("failed", {"message": "training raised ValueError: bad data"}, "it failed (training raised ValueError: bad data)",
     409),
])
def test_every_refusal_says_why_in_one_line(local_home, status, cols, needle, http):
    add_job(local_home, "j-1", status, **cols)
    commit_checkpoint(local_home, "j-1", 4)
    with pytest.raises(ResumeRefused) as e:
        resume.prepare("j-1", budget_usd=1.0)
    assert needle in str(e.value) and "\n" not in str(e.value) and e.value.http_status == http
    assert job_row("j-1").status == status


def test_unknown_job_and_no_checkpoint_are_refused(local_home):
    with pytest.raises(ResumeRefused, match="no such job") as e:
        resume.prepare("nope", budget_usd=1.0)
    assert e.value.http_status == 404
    add_job(local_home, "j-2", "lost")
    with pytest.raises(ResumeRefused, match="nothing to resume from: no committed checkpoint of run j-2") as e:
        resume.prepare("j-2", budget_usd=1.0)
    assert "spotwise launch" in str(e.value) and job_row("j-2").status == "lost"
    torn = local_home / "ckpt" / "j-2" / "checkpoints" / "step_000000008"
    torn.mkdir(parents=True)                              # a checkpoint without its marker does not count
    with pytest.raises(ResumeRefused, match="nothing to resume from"):
        resume.prepare("j-2", budget_usd=1.0)


def test_a_lost_cancelled_or_interrupted_job_resumes_and_a_bad_number_is_an_input_error(local_home):
    add_job(local_home, "j-lost", "lost")
    add_job(local_home, "j-cancel", "cancelled")
    add_job(local_home, "j-head", "failed", message="the Ray head node was lost", report={"interrupted": True})
    for j in ("j-lost", "j-cancel", "j-head"):
        commit_checkpoint(local_home, j, 6)
        res = resume.prepare(j, deadline_hours=2.0)            # no --budget: what is left of the $1 cap
        assert res.budget_usd == 1.0 and res.spec.deadline_hours == 2.0 and job_row(j).status == "pending"
    from spotwise.errors import InputError

    add_job(local_home, "j-nan", "lost")
    with pytest.raises(InputError, match="--budget"):
        resume.prepare("j-nan", budget_usd=float("nan"))


def test_two_resumes_at_once_start_one_runner(database, home):
    """Both pass the first look at the job (the barrier holds them after it); the transaction that
    takes the job lets exactly one through, on SQLite and on PostgreSQL."""
    add_job(home, "j-race", "lost")
    commit_checkpoint(home, "j-race", 4)
    both = threading.Barrier(2)
    real = resume.latest_checkpoint

    def slow(job_id, spec):
        both.wait(timeout=30)
        return real(job_id, spec)

    results: list = []

    def go():
        try:
            results.append(resume.prepare("j-race", budget_usd=0.5))
        except ResumeRefused as e:
            results.append(e)

    resume.latest_checkpoint = slow
    try:
        ts = [threading.Thread(target=go) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=60)
    finally:
        resume.latest_checkpoint = real
    took = [r for r in results if isinstance(r, resume.Resumption)]
    refused = [r for r in results if isinstance(r, ResumeRefused)]
    assert len(took) == 1 and len(refused) == 1, results
    assert "it is pending" in str(refused[0])
    with db.session() as s:
        assert s.query(db.Event).filter_by(job_id="j-race", kind="resumed").count() == 1


def test_a_resumed_job_reserves_again_and_its_budget_counts_each_dollar_once(database, home):
    budgets.create_budget("team", cap_usd=10.0, period="total")
    add_job(home, "j-b", "lost")
    with db.session() as s:
        s.add(db.LedgerEntry(job_id="j-b", instance_id="i-1", cloud="local", market="spot", start=0, end=100,
                             seconds=100, usd_per_hour=36.0, usd=1.0, price_source="t", price_as_of="t"))
        s.commit()
    rid = budgets.reserve("team", 1.0, job_id="j-b")
    budgets.settle(rid, 1.0)
    commit_checkpoint(home, "j-b", 4)
    res = resume.prepare("j-b", budget_usd=2.0)
    assert res.budget_usd == pytest.approx(3.0)
    st = budgets.status("team")
    assert (st.spent_usd, st.reserved_usd) == (pytest.approx(1.0), pytest.approx(2.0))
    with db.session() as s:                     # the new leg spends $0.50
        s.add(db.LedgerEntry(job_id="j-b", instance_id="i-2", cloud="local", market="spot", start=200, end=250,
                             seconds=50, usd_per_hour=36.0, usd=0.5, price_source="t", price_as_of="t"))
        s.commit()
    budgets.settle_job("j-b")
    st = budgets.status("team")
    assert (st.spent_usd, st.reserved_usd) == (pytest.approx(1.5), 0.0)     # not 1.0 + 1.5


def test_a_resumed_scheduled_run_is_its_schedules_again_until_it_ends(local_home):
    from spotwise.engine.work import schedules

    sch = schedules.create_schedule(task(local_home), cron="0 2 * * *", name="nightly")
    add_job(local_home, "j-s", "budget_exhausted")
    with db.session() as s:
        s.add(db.ScheduleRun(schedule_id=sch["id"], fire_at=1.0, status="finished", reason="job budget_exhausted",
                             job_id="j-s", created_at=1.0))
        s.commit()
    commit_checkpoint(local_home, "j-s", 4)
    resume.prepare("j-s", budget_usd=1.0)
    assert [(r["status"], r["reason"]) for r in schedules.runs("nightly")] == [("launched", "resumed from step 4")]
    with db.session() as s:
        s.get(db.Job, "j-s").status = "succeeded"
        s.commit()
    assert jobs.finish_schedule_runs() == 1
    assert [(r["status"], r["reason"]) for r in schedules.runs("nightly")] == [("finished", "job succeeded")]


def test_a_resume_that_cannot_start_goes_back_to_what_it_was(local_home, monkeypatch):
    add_job(local_home, "j-r", "lost")
    commit_checkpoint(local_home, "j-r", 4)
    # the runner's path: the orchestrator refuses the leg (a cap below one billing minute)
    resume.prepare("j-r", budget_usd=0.0001)
    assert jobs.run_job("j-r")["status"] == "failed"             # the runner's answer: nothing ran
    row = job_row("j-r")
    assert row.status == "lost" and "resume did not start" in row.message and "billing minute" in row.message
    assert "step 4" in row.message
    # a dead owner's resume (the process went away before its runner took it): reconcile reverts it
    resume.prepare("j-r", budget_usd=1.0)
    with db.session() as s:
        s.get(db.Job, "j-r").owner_pid = 2 ** 22 + 7           # no such process
        s.commit()
    [r] = jobs.reconcile()
    assert r["status"] == "lost" and job_row("j-r").status == "lost"


# -- the CLI ---------------------------------------------------------------------------------------
def test_cli_refusals_exit_2_with_one_line(local_home, capsys):
    add_job(local_home, "j-ok", "succeeded")
    for args, needle in ((["resume", "nope"], "no such job"),
                         (["resume", "j-ok", "--budget", "1"], "it succeeded"),
                         (["resume", "j-ok", "--budget", "-1"], "--budget")):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, err
    add_job(local_home, "j-run", "running", owner_pid=None)
    assert main(["resume", "j-run", "--budget", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: cannot resume job j-run: it is running"), err


def test_cli_resume_runs_the_job_to_the_end(local_home, capsys, monkeypatch):
    first = budget_stopped_run(local_home)
    spent = sum(usd for _, _, usd in ledger_rows(first.job_id))
    log: list = []
    monkeypatch.setattr(orchestrator, "Factories", lambda: fakes(log, Jobs(log)))   # no Ray: the fakes
    capsys.readouterr()
    assert main(["resume", first.job_id, "--budget", "1", "--format", "json"]) == 0
    out = capsys.readouterr()
    rep = json.loads(out.out)
    assert rep["status"] == "succeeded" and rep["budget_usd"] == pytest.approx(spent + 1.0)
    assert f"resuming job {first.job_id} from step 4 (was budget_exhausted)" in out.err
    assert main(["resume", first.job_id, "--budget", "1"]) == 2          # succeeded now: refused
    assert "it succeeded" in capsys.readouterr().err

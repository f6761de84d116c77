"""A run's curves: what the recorder keeps, what ``curves`` reads back, ``status --plot``, the API,
the dashboard's job page and ``/metrics`` — on SQLite and PostgreSQL."""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from typer.testing import CliRunner

from spotwise.cli import app, main
from spotwise.engine.state import db
from spotwise.engine.run.curves import CurveRecorder, curves, latest, step_at

T0 = 1_800_000_000.0


def _job(job_id="j1", status="running", budget=2.0):
    with db.session() as s:
        s.add(db.Job(id=job_id, name="t", status=status, cloud="local", spec={}, created_at=T0, budget_usd=budget))
        s.commit()


def _event(job_id, t, kind, **detail):
    with db.session() as s:
        s.add(db.Event(job_id=job_id, t=t, kind=kind, detail=detail))
        s.commit()


def _run(job_id="j1"):
    """Twelve ticks a second apart: step i, a falling loss, 1 cent a tick; a preemption at step 5."""
    _job(job_id)
    rec = CurveRecorder(job_id, every_s=2.0)
    for i in range(12):
        rec.sample(T0 + i, {"step": i, "loss": 3.0 / (i + 1)}, 0.01 * i)
    rec.sample(T0 + 12.5, {"step": 12, "loss": 0.2}, 0.125, final=True)
    _event(job_id, T0 + 5.5, "preempted", instance_id="w1", market="spot", zone="local-a")
    _event(job_id, T0 + 9.0, "launched", instance_id="w2", role="worker", market="spot")   # not a mark


def test_the_recorder_samples_every_interval_while_something_changes_and_always_at_the_end(database):
    _run()
    c = curves("j1")
    assert [p["step"] for p in c["points"]] == [0, 2, 4, 6, 8, 10, 12]        # every 2 s, then the final one
    assert c["points"][-1] == {"t": T0 + 12.5, "step": 12, "loss": 0.2, "spend_usd": 0.125, "tokens_per_s": None,
                               "mfu": None, "peak_memory_bytes": None}
    assert c["budget_usd"] == 2.0
    # a mark carries the step reached then (the last point at or before it); launches are not marks
    assert c["marks"] == [{"t": T0 + 5.5, "kind": "preempted", "label": "preempted", "step": 4}]


def test_nothing_new_is_not_written_and_a_loss_that_is_not_finite_is_a_gap(database):
    _job()
    rec = CurveRecorder("j1", every_s=0.0)
    assert rec.sample(T0, None, 0.0)                                          # before training reports
    assert not rec.sample(T0 + 1, {}, 0.0)                                    # the same point again
    assert not rec.sample(T0 + 2, {}, 0.0, final=True)
    assert rec.sample(T0 + 3, {"step": 3, "loss": math.nan}, 0.5)
    assert rec.sample(T0 + 4, {"step": 4, "loss": math.inf}, 0.6)
    pts = curves("j1")["points"]
    assert [(p["step"], p["loss"]) for p in pts] == [(None, None), (3, None), (4, None)]


def test_a_point_that_cannot_be_written_is_logged_and_the_run_goes_on(database, caplog):
    _job()
    with db.engine().begin() as c:
        c.execute(text("DROP TABLE curve_points"))
    assert CurveRecorder("j1").sample(T0, {"step": 1, "loss": 1.0}, 0.1) is False
    assert "could not record a curve point of j1" in caplog.text


def test_step_at_is_the_last_step_at_or_before():
    pts = [{"t": 1.0, "step": None}, {"t": 2.0, "step": 5}, {"t": 3.0, "step": 9}]
    assert [step_at(pts, t) for t in (0.5, 1.5, 2.0, 2.9, 10.0)] == [None, None, 5, 5, 9]


def test_latest_is_each_jobs_newest_point(database):
    _run("j1")
    _job("j2")
    assert latest(["j1", "j2", "nope"]) == {"j1": {"t": T0 + 12.5, "step": 12, "loss": 0.2, "spend_usd": 0.125,
                                                   "tokens_per_s": None, "mfu": None, "peak_memory_bytes": None}}
    assert latest([]) == {}


def test_status_plot_writes_both_curves(database, tmp_path):
    _run()
    out = tmp_path / "curves.png"
    r = CliRunner().invoke(app, ["status", "j1", "--plot", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "7 loss points, 7 spend points, 1 marks" in r.output
    from spotwise.curveplot import series

    s = series(curves("j1"))          # what was drawn
    assert s["loss"][0] == (0, 3.0) and s["loss"][-1] == (12, 0.2)
    assert s["spend"][-1] == (pytest.approx(12.5 / 60), 0.125) and s["budget_usd"] == 2.0
    assert s["loss_marks"] == [(4, "preempted")] and s["spend_marks"] == [(pytest.approx(5.5 / 60), "preempted")]


@pytest.mark.parametrize("args, field", [(["status", "--plot", "x.png"], "--plot"),
                                         (["status", "j1", "--plot", "x.txt"], "--plot"),
                                         (["status", "j1", "--plot", "/no/such/dir/x.png"], "--plot")])
def test_status_plot_refuses_bad_input_naming_the_field(database, args, field, capsys):
    _job()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err


def test_the_api_the_job_page_and_metrics_show_the_same_curves(database):
    from spotwise.service import auth
    from spotwise.service.app import create_app
    from spotwise.service.scheduler import Scheduler

    _run()
    token = auth.create_token("test")
    with TestClient(create_app(Scheduler(launcher=lambda job_id: None)),
                    headers={"Authorization": f"Bearer {token}"}) as c:
        body = c.get("/api/v1/jobs/j1/curves").json()
        assert body == {**curves("j1"), "job_id": "j1"}
        assert c.get("/api/v1/jobs/nope/curves").status_code == 404
        page = c.get("/jobs/j1")
        assert page.status_code == 200
        html = page.text
        loss_svg = html[html.index('id="loss-chart"'):html.index("</svg>", html.index('id="loss-chart"'))]
        assert loss_svg.count(",") == 7 and 'class="mark"' in loss_svg        # 7 points, the preemption
        spend_svg = html[html.index('id="job-spend-chart"'):]
        assert 'class="budget"' in spend_svg and "budget $2.00" in spend_svg
        assert "preempted" in html and c.get("/jobs/nope").status_code == 404
        assert 'href="/jobs/j1"' in c.get("/").text                       # linked from the job list
        assert TestClient(c.app).get("/jobs/j1").status_code == 401            # the same token as the rest
        metrics = c.get("/metrics").text
        assert 'spotwise_job_step{job_id="j1"} 12.0' in metrics
        assert 'spotwise_job_loss{job_id="j1"} 0.2' in metrics
        assert 'spotwise_job_spend_usd{job_id="j1"} 0.125' in metrics


def test_held_out_losses_are_recorded_once_by_step_and_shown_by_the_api_metrics_and_plot(database, tmp_path):
    from spotwise.curveplot import series
    from spotwise.engine.display.sentences import sentence
    from spotwise.engine.run.curves import latest_eval

    _job()
    rec = CurveRecorder("j1", every_s=0.0)
    rec.sample(T0, {"step": 0, "eval_loss": [{"step": 0, "loss": 5.5}]}, 0.0)
    rec.sample(T0 + 1, {"step": 4, "eval_loss": [{"step": 0, "loss": 5.5}, {"step": 4, "loss": 4.0}]}, 0.1)
    assert rec.record_evals(T0 + 2, {"eval_loss": [{"step": 0, "loss": 5.5}, {"step": 4, "loss": 4.0}]}) == 0
    # a resumed run measures step 4 again: its newest value wins
    rec.sample(T0 + 3, {"step": 4, "eval_loss": [{"step": 4, "loss": 3.9}]}, 0.2)
    c = curves("j1")
    assert [(e["step"], e["loss"]) for e in c["eval_loss"]] == [(0, 5.5), (4, 3.9)]
    assert latest_eval(["j1"]) == {"j1": 3.9}
    assert series(c)["eval_loss"] == [(0, 5.5), (4, 3.9)]
    assert sentence({"event": "eval", "step": 4, "loss": 3.9}) == "held-out loss 3.9 at step 4"
    from spotwise.service.metrics import running_jobs

    fams = {f.name: f for f in running_jobs()}
    assert [s.value for s in fams["spotwise_job_eval_loss"].samples] == [3.9]


def test_the_job_page_draws_the_held_out_loss_beside_the_training_loss():
    from spotwise.service.dashboard import curve_svg

    svg = curve_svg("loss-chart", [(0, 5.0), (10, 4.0)], label="loss", x_label="step",
                    second=[(0, 5.5), (10, 4.5)], second_label="held-out loss")
    second = svg[svg.index('class="second"'):]
    assert second.count(",") == 2 and "held-out loss" in second
    assert 'class="second"' not in curve_svg("loss-chart", [(0, 5.0)], label="loss", x_label="step")


def test_speed_is_on_the_curves_the_api_and_metrics_and_mfu_is_against_the_workers_gpu_peak(database):
    """The snapshot's figures (StepMeter: global tokens/s, model FLOPs/s, ranks, a rank's peak
    memory) become tokens/s, MFU and peak memory on each point; MFU divides by the ranks times the
    workers' GPU peak (p4d.24xlarge: A100, 312 TFLOPS bf16 dense); none on the local cloud's CPUs."""
    from spotwise.engine.run.views import speed
    from spotwise.provisioner.base import Node
    from spotwise.service.metrics import running_jobs

    def worker(cloud, itype):
        return Node(cloud=cloud, instance_id="w", instance_type=itype, region="us-east-1", zone="us-east-1a",
                    market="spot", usd_per_hour=1.0, cluster_id="c", job_id="j1")

    snap = {"step": 7, "loss": 2.0, "perf": {"tokens_per_s": 50_000.0, "model_flops_per_s": 16 * 312e12 * 0.45,
                                             "world": 16, "peak_memory_bytes": 3e10, "memory_kind": "cuda_allocated"}}
    fast = speed(snap, [worker("aws", "p4d.24xlarge")])
    assert fast["tokens_per_s"] == 50_000.0 and fast["peak_memory_bytes"] == 3e10
    assert math.isclose(fast["mfu"], 0.45)
    assert "mfu" not in speed(snap, [worker("local", "local.cpu1")]) and speed({}, []) == {}
    _job()
    rec = CurveRecorder("j1", every_s=0.0)
    rec.sample(T0, snap, 0.5, speed=fast)
    rec.sample(T0 + 1, {**snap, "step": 8}, 0.6, speed={})          # a figure training could not give
    pts = curves("j1")["points"]
    assert (pts[0]["tokens_per_s"], round(pts[0]["mfu"], 6), pts[0]["peak_memory_bytes"]) == (50_000.0, 0.45, 3e10)
    assert (pts[1]["tokens_per_s"], pts[1]["mfu"]) == (None, None)
    rec.sample(T0 + 2, {**snap, "step": 9}, 0.7, speed=fast)
    fams = {f.name: f for f in running_jobs()}
    assert [s.value for s in fams["spotwise_job_tokens_per_second"].samples] == [50_000.0]
    assert [round(s.value, 6) for s in fams["spotwise_job_mfu"].samples] == [0.45]
    assert [s.value for s in fams["spotwise_job_peak_memory_bytes"].samples] == [3e10]

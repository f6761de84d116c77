"""``training.train_func``: an unmodified Ray Train function, with Ray Train's worker calls faked
(no cluster): its reported ``step``/``loss`` are the run's progress, a checkpoint it reports is
recorded with its URI, a stop ends it at its next report (after that report's checkpoint), a
checkpoint reported on a notice is the just-in-time one, and its exceptions are the user's while
Ray's own are not. The real thing, a user package preempted on the emulated AWS, is in tests/e2e/test_launch_aws.py."""

from __future__ import annotations

import sys
import types

import pytest

from spotwise.engine.run.journal import outcome
from spotwise.runtime.api import TrainConfig, TrainJob, TrainResult
from spotwise.runtime.training.trainfunc import Reporter, StopAtReport, run_train_func, step_of
from spotwise.runtime.training.usercode import UserCodeError

USER = '''
import ray.train

def train_func(config):
    start = 0
    ck = ray.train.get_checkpoint()
    if ck is not None:
        start = int(ck.path.rsplit("_", 2)[-2])     # the step in spotwise's name for it
    for step in range(start + 1, config["steps"] + 1):
        if step == config.get("fail_at"):
            raise ValueError(f"bad batch at step {step}")
        ck = object() if step % 2 == 0 else None
        ray.train.report({"step": step, "loss": 1.0 / step}, checkpoint=ck)
'''


class Session:
    """The worker's session as the Reporter uses it (a RaySession without Ray)."""

    def __init__(self, rank: int = 0, stop_after: int | None = None) -> None:
        self.rank, self.world_size, self.actor = rank, 2, None
        self.stop_after = stop_after               # the stop is seen at this report (1-based)
        self.polls = 0
        self.progress: list[tuple[int, float | None]] = []
        self.checkpoints: list = []
        self.resumes: list[tuple[int, int]] = []
        self.preempted = False
        self.waited = False

    def local_stop_reason(self):
        self.polls += 1
        return "budget" if self.stop_after is not None and self.polls >= self.stop_after else None

    def local_preempted(self) -> bool:
        return self.preempted

    def report_progress(self, step, loss, perf=None) -> None:
        self.progress.append((step, loss))

    def report_checkpoint(self, info) -> None:
        self.checkpoints.append(info)

    def report_resume(self, from_step, world_size) -> None:
        self.resumes.append((from_step, world_size))

    def after_preemption_checkpoint(self) -> None:
        self.waited = True


class RayReport:
    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[dict, object, str | None]] = []
        self.fail = fail

    def __call__(self, metrics, checkpoint=None, checkpoint_dir_name=None, **kw) -> None:
        if self.fail is not None:
            raise self.fail
        self.calls.append((metrics, checkpoint, checkpoint_dir_name))


def _reporter(session: Session, report: RayReport | None = None) -> Reporter:
    return Reporter(report or RayReport(), session, broadcast=lambda v: v, run_uri="file:///s/_ray/run/")


def test_step_and_loss_are_the_progress_and_a_checkpoint_is_recorded_where_ray_writes_it():
    s, ray_report = Session(), RayReport()
    rep = _reporter(s, ray_report)
    rep({"step": 5, "loss": 0.5})
    rep({"step": 10, "loss": 0.25, "acc": 0.9}, checkpoint=object())
    rep({"epoch": 1})                                  # no step: progress unchanged
    assert s.progress == [(5, 0.5), (10, 0.25)] and rep.step == 10
    name = ray_report.calls[1][2]
    assert step_of(name) == 10 and rep.checkpoint_uri == f"file:///s/_ray/run/{name}"
    assert [(c.step, c.uri, c.kind) for c in s.checkpoints] == [(10, rep.checkpoint_uri, "periodic")]
    rep({"step": 11}, checkpoint=object(), checkpoint_dir_name="mine")   # the function's own name is kept
    assert ray_report.calls[-1][2] == "mine" and rep.checkpoint_uri.endswith("/mine")


def test_a_stop_ends_the_function_at_its_next_report_after_that_reports_checkpoint():
    s = Session(stop_after=1)
    rep = _reporter(s)
    with pytest.raises(StopAtReport) as e:
        rep({"step": 20, "loss": 0.1}, checkpoint=object())
    assert e.value.reason == "budget" and not isinstance(e.value, Exception)   # `except Exception` cannot eat it
    assert [(c.step, c.kind) for c in s.checkpoints] == [(20, "stop")]


def test_rank_zero_decides_the_stop_for_every_rank():
    s = Session(rank=1, stop_after=0)              # this rank's poller saw the stop, rank 0's did not
    Reporter(RayReport(), s, broadcast=lambda v: None, run_uri="file:///r")({"step": 1})
    s = Session(rank=1)
    with pytest.raises(StopAtReport):             # rank 0 saw it: every rank stops
        Reporter(RayReport(), s, broadcast=lambda v: "cancel", run_uri="file:///r")({"step": 1})
    assert s.checkpoints == []                   # only rank 0 tells the control actor


def test_a_checkpoint_reported_on_a_notice_is_the_just_in_time_one_and_the_ranks_wait():
    s = Session()
    rep = _reporter(s)
    s.preempted = True
    rep({"step": 3})                               # no checkpoint: keep going (the function checks)
    assert not s.waited
    rep({"step": 4}, checkpoint=object())
    assert s.waited and s.checkpoints[-1].kind == "preemption"


def test_an_error_of_rays_report_is_the_clusters_not_the_users():
    boom = RuntimeError("worker group is shutting down")
    rep = _reporter(Session(), RayReport(fail=boom))
    with pytest.raises(RuntimeError):
        rep({"step": 1})
    assert rep.cluster_error is boom
    refused = ValueError("Passing objects containing Torch tensors as metrics is not supported")
    rep = _reporter(Session(), RayReport(fail=refused))
    with pytest.raises(ValueError):
        rep({"step": 1})
    assert rep.cluster_error is None              # Ray refused the function's arguments: its bug


def test_a_module_level_import_of_report_gets_spotwises(fake_ray_train, tmp_path):
    (tmp_path / "userfn2.py").write_text("from ray.train import report\n\n\ndef train_func(config):\n"
                                         "    report({'step': 3, 'loss': 0.5})\n")
    s = Session()
    cfg = TrainConfig.model_validate({"train_func": "userfn2:train_func"})
    try:
        run_train_func(TrainJob(run_name="r", storage_uri="file:///s", config=cfg), s, run_uri="file:///r")
    finally:
        sys.modules.pop("userfn2", None)
    assert s.progress == [(3, 0.5)]


@pytest.fixture
def fake_ray_train(tmp_path, monkeypatch):
    """``ray.train``'s worker calls faked in this process, and the USER module importable."""
    import ray.train
    import ray.train.collective

    (tmp_path / "userfn.py").write_text(USER)
    monkeypatch.syspath_prepend(str(tmp_path))
    state = types.SimpleNamespace(checkpoint=None, reports=RayReport())
    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: state.checkpoint)
    monkeypatch.setattr(ray.train, "report", state.reports)
    monkeypatch.setattr(ray.train.collective, "broadcast_from_rank_zero", lambda v: v)
    yield state
    sys.modules.pop("userfn", None)


def _job(**config) -> TrainJob:
    cfg = TrainConfig.model_validate({"train_func": "userfn:train_func", "config": config})
    return TrainJob(run_name="run", storage_uri="file:///s", config=cfg)


def test_a_function_that_returns_succeeded_at_its_last_reported_step(fake_ray_train):
    import ray.train

    s = Session()
    out = run_train_func(_job(steps=7), s, run_uri="file:///s/_ray/run")
    assert ray.train.report is fake_ray_train.reports        # Ray's own again afterwards
    res = TrainResult(**out)
    assert res.steps_completed == 7 and res.returned and res.stopped is None
    assert step_of(res.final_checkpoint) == 6                 # the last checkpoint it reported
    assert s.progress[-1] == (7, pytest.approx(1 / 7))
    # a Ray Train function's end is its own: training.steps (default 200) does not make it a failure
    assert outcome(res, stop_reason=None, steps=200) == ("succeeded", None)


def test_a_stopped_function_ends_at_its_last_reported_checkpoint(fake_ray_train):
    s = Session(stop_after=3)                     # the stop is seen at step 3's report
    res = TrainResult(**run_train_func(_job(steps=50), s, run_uri="file:///s/_ray/run"))
    assert res.stopped == "budget" and not res.returned and res.steps_completed == 3
    assert step_of(res.final_checkpoint) == 2
    assert outcome(res, stop_reason="budget", steps=50)[0] == "budget_exhausted"


def test_a_resumed_group_reports_where_it_resumed_from(fake_ray_train):
    fake_ray_train.checkpoint = types.SimpleNamespace(path="/s/_ray/run/step_000000004_abcdef12")
    s = Session()
    res = TrainResult(**run_train_func(_job(steps=6), s, run_uri="file:///s/_ray/run"))
    assert s.resumes == [(4, 2)] and [p[0] for p in s.progress] == [5, 6] and step_of(res.final_checkpoint) == 6


def test_an_exception_at_step_5_is_a_user_error_with_its_traceback(fake_ray_train):
    with pytest.raises(UserCodeError) as e:
        run_train_func(_job(steps=9, fail_at=5), Session(), run_uri="file:///s/_ray/run")
    assert "userfn:train_func(config) raised ValueError: bad batch at step 5" in str(e.value)
    assert "userfn.py" in e.value.tail and "bad batch at step 5" in e.value.tail


def test_a_missing_function_names_the_field(fake_ray_train):
    cfg = TrainConfig.model_validate({"train_func": "userfn:nope"})
    with pytest.raises(UserCodeError) as e:
        run_train_func(TrainJob(run_name="r", storage_uri="file:///s", config=cfg), Session(), run_uri="file:///r")
    assert e.value.where == "training.train_func" and "train_func" in str(e.value)

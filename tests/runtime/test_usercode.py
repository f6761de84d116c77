"""A user's ``make_spec`` through the real loop, in process (one gloo rank, no Ray): the task's
settings override the spec's, a preempted run resumes to the uninterrupted run's weights, and an
exception in user code comes out as a ``UserCodeError`` with its traceback's tail."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from spotwise.runtime.api import TrainConfig, TrainJob
from spotwise.runtime.control import Control
from spotwise.runtime.job import decode_job, encode_job, preflight
from spotwise.runtime.loop import LocalSession, run_loop
from spotwise.runtime.storage import open_storage
from spotwise.runtime.usercode import UserCodeError, load_entrypoint, spec_for

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own-code" / "regress"
FAILING = '''
from regress.train import make_spec as base


def make_spec(config):
    mode = config["fail_at"]
    spec = base(config)
    inner = spec.loss_fn

    def loss(model, batch):
        if mode == "now":
            raise ValueError("bad batch")
        return inner(model, batch)
    spec.loss_fn = loss
    return spec
'''


@pytest.fixture
def user_pkg(tmp_path, monkeypatch):
    """The example's package copied to a temporary directory on sys.path (as a workdir is)."""
    shutil.copytree(EXAMPLE, tmp_path / "regress")
    (tmp_path / "regress" / "failing.py").write_text(FAILING)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "regress" or m.startswith("regress.")]:
        del sys.modules[name]


def _cfg(**training) -> TrainConfig:
    return TrainConfig.model_validate({"entrypoint": "regress.train:make_spec",
                                       "config": {"width": 16, "batch": 8}, **training})


def test_task_settings_override_the_spec_only_when_given(user_pkg):
    spec = spec_for(_cfg())
    assert (spec.steps, spec.checkpoint_interval, spec.precision) == (300, 25, "fp32")
    spec = spec_for(_cfg(steps=12, precision="auto", checkpoint={"interval_steps": 4, "keep_last": 3}),
                    notice_window_s=30.0)
    assert (spec.steps, spec.checkpoint_interval, spec.keep_last, spec.precision, spec.notice_window_s) == \
        (12, 4, 3, "auto", 30.0)


def test_the_wire_keeps_what_the_task_set(user_pkg):
    job = TrainJob(run_name="r", storage_uri="file:///tmp/x", config=_cfg(steps=12))
    back = decode_job(encode_job(job, control_port=1))[0].config
    assert back.overrides() == {"steps": 12} and back.config == job.config.config


def test_a_preempted_user_run_resumes_to_the_uninterrupted_weights(user_pkg, pg1, tmp_path):
    cfg = _cfg(steps=12, checkpoint={"interval_steps": 5})
    full = run_loop(spec_for(cfg, agree_interval_s=0), LocalSession(), open_storage(f"file://{tmp_path}/a"))
    assert full.steps_completed == 12 and full.model_sha256

    store = open_storage(f"file://{tmp_path}/b")
    session = LocalSession()
    session.preempted = True                  # a notice from the start: JIT checkpoint after step 1
    first = run_loop(spec_for(cfg, agree_interval_s=0), session, store)
    assert first.preempted and first.steps_completed == 1
    again = run_loop(spec_for(cfg, agree_interval_s=0), LocalSession(), store)
    assert again.resumed_from == 1 and again.steps_completed == 12
    assert again.model_sha256 == full.model_sha256


def test_an_exception_in_user_code_is_a_user_error_with_its_traceback(user_pkg, pg1, tmp_path):
    cfg = TrainConfig.model_validate({"entrypoint": "regress.failing:make_spec", "steps": 3,
                                      "config": {"width": 16, "batch": 8, "fail_at": "now"}})
    with pytest.raises(UserCodeError) as e:
        run_loop(spec_for(cfg), LocalSession(), open_storage(f"file://{tmp_path}/c"))
    assert "TrainSpec.loss_fn raised ValueError: bad batch" in str(e.value)
    assert "failing.py" in e.value.tail and "raise ValueError" in e.value.tail


def test_make_spec_errors_and_wrong_returns_are_user_errors(user_pkg):
    with pytest.raises(UserCodeError, match="KeyError"):
        spec_for(TrainConfig.model_validate({"entrypoint": "regress.failing:make_spec", "config": {}}))
    with pytest.raises(UserCodeError, match="returned int, not a spotwise.train.TrainSpec"):
        spec_for(TrainConfig.model_validate({"entrypoint": "builtins:len", "config": {}}))


def test_load_entrypoint_names_what_the_module_has(user_pkg):
    with pytest.raises(UserCodeError, match=r"no function 'nope'; it has: .*make_spec"):
        load_entrypoint("regress.train:nope")
    with pytest.raises(UserCodeError, match="ModuleNotFoundError"):
        load_entrypoint("regress.absent:make_spec")


def test_preflight_fails_a_job_whose_entrypoint_does_not_import(user_pkg):
    ok = TrainJob(run_name="r", storage_uri="file:///tmp/x", config=_cfg())
    assert preflight(ok) is None
    bad = TrainJob(run_name="r", storage_uri="file:///tmp/x",
                   config=TrainConfig.model_validate({"entrypoint": "regress.absent:make_spec"}))
    res = preflight(bad)
    assert res is not None and res.error and res.error.startswith("preflight on the head")
    assert "No module named 'regress.absent'" in res.error


def test_the_control_actor_counts_each_failed_attempt_once():
    c = Control()
    c.report_user_error("a1", 1, "ValueError: x", "tail-1")
    c.report_user_error("a1", 0, "ValueError: x", "tail-0")     # the same attempt, another rank
    c.report_user_error("a2", 0, "ValueError: y", "tail-2")
    assert [(e["rank"], e["tail"]) for e in c.user_errors()] == [(1, "tail-1"), (0, "tail-2")]
    snap = c.snapshot()
    assert len(snap["user_errors"]) == 2 and "tail" not in snap["user_errors"][0]
    assert [e["event"] for e in snap["events"]] == ["user_error", "user_error"]

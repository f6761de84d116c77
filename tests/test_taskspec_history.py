"""The task file's ``spot_history``: the zone's availability before the run, shown to the policy.

Checked when the task is loaded (one answer whatever is wrong with the file), confined to the trace
directories for API callers, and given to the policy by the orchestrator before its first tick."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import yaml

from spotwise.engine.run.orchestrator import LaunchOptions, Orchestrator, show_history
from spotwise.errors import InputError
from spotwise.policies.rules.survival_policy import SpotwiseSurvival
from spotwise.policies.traces import builtin_traces_dir
from spotwise.service.boundary import confine_spec
from spotwise.taskspec import HISTORY_ALLOWED, load_taskspec, parse_taskspec

TASK = {"name": "hist-run", "training": {"steps": 5}}
SHIPPED = builtin_traces_dir() / "aws-1node-avail-2022-10-26" / "aws_us-west-2a_v100_8_2022-10-26.json"


def _task_file(tmp_path, **fields) -> str:
    p = tmp_path / "task.yaml"
    p.write_text(yaml.safe_dump({**TASK, **fields}))
    return str(p)


def _trace(tmp_path, name: str = "zone.json", data=(1, 1, 0, 0, 0, 1, 1, 0, 1), gap=600) -> str:
    p = tmp_path / name
    p.write_text(json.dumps({"data": list(data), "metadata": {"gap_seconds": gap}}))
    return str(p)


# -- the task file --------------------------------------------------------------------------------
def test_a_valid_history_file_is_accepted(tmp_path) -> None:
    path = _trace(tmp_path)
    assert load_taskspec(_task_file(tmp_path, spot_history=path)).spot_history == path
    assert load_taskspec(_task_file(tmp_path, spot_history=str(SHIPPED))).spot_history == str(SHIPPED)
    assert load_taskspec(_task_file(tmp_path)).spot_history is None        # optional


def test_a_bad_history_file_gets_one_answer_naming_the_field(tmp_path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "garbage.json").write_text("{not json")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "deep.json").write_text("[" * 100_000)
    bad = [
        str(tmp_path / "missing.json"),
        str(tmp_path / "dir"),
        str(tmp_path / "garbage.json"),
        str(tmp_path / "binary.json"),
        str(tmp_path / "deep.json"),
        _trace(tmp_path, "nogap.json", gap=0),                 # no usable metadata.gap_seconds
        _trace(tmp_path, "twos.json", data=(1, 2, 0)),
        _trace(tmp_path, "empty.json", data=()),
    ]
    answers = set()
    for path in bad:
        with pytest.raises(InputError) as e:
            load_taskspec(_task_file(tmp_path, spot_history=path))
        [p] = e.value.problems
        assert p.field == "spot_history" and p.allowed == HISTORY_ALLOWED, path
        assert "Traceback" not in str(e.value)
        answers.add((p.field, p.allowed))
    assert len(answers) == 1


def test_an_empty_history_path_is_refused_by_the_schema() -> None:
    with pytest.raises(InputError) as e:
        parse_taskspec({**TASK, "spot_history": ""})
    assert [p.field for p in e.value.problems] == ["spot_history"]


# -- the API boundary -----------------------------------------------------------------------------
def test_boundary_refuses_a_history_outside_the_trace_dirs(tmp_path, home) -> None:
    outside = _trace(tmp_path)                      # a real trace, but not in an allowed directory
    answers = set()
    for path in (outside, "/etc/passwd", "/no/such/file", "/etc", str(home / "spotwise.db"),
                 str(home / "traces" / ".." / "x.json")):
        with pytest.raises(InputError) as e:
            confine_spec(parse_taskspec({**TASK, "spot_history": path}))
        [p] = e.value.problems
        answers.add((p.field, p.allowed))
    assert len(answers) == 1 and next(iter(answers))[0] == "task.spot_history"   # one answer for all
    (home / "traces").mkdir()
    inside = shutil.copy(outside, home / "traces" / "zone.json")
    confine_spec(parse_taskspec({**TASK, "spot_history": str(inside)}))      # allowed
    confine_spec(parse_taskspec({**TASK, "spot_history": str(SHIPPED)}))     # the shipped ones too
    (home / "traces" / "bad.json").write_text('{"data": [1, 0]}')           # inside, but no gap_seconds
    with pytest.raises(InputError) as e:
        confine_spec(parse_taskspec({**TASK, "spot_history": str(home / "traces" / "bad.json")}))
    assert e.value.problems[0].field == "task.spot_history"


def test_boundary_still_confines_local_trace(tmp_path, home) -> None:
    with pytest.raises(InputError) as e:
        confine_spec(parse_taskspec({**TASK, "local": {"trace": _trace(tmp_path)}, "spot_history": "/etc/passwd"}))
    assert sorted(p.field for p in e.value.problems) == ["task.local.trace", "task.spot_history"]


def test_the_api_refuses_a_history_outside_the_trace_dirs(database, home) -> None:
    from fastapi.testclient import TestClient

    from spotwise.service import auth
    from spotwise.service.app import create_app
    from spotwise.service.scheduler import Scheduler

    started: list = []
    token = auth.create_token("hist")
    with TestClient(create_app(Scheduler(launcher=started.append)),
                    headers={"Authorization": f"Bearer {token}"}) as client:
        r = client.post("/api/v1/jobs", json={"task": {**TASK, "spot_history": "/etc/passwd"}})
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == "task.spot_history"
        assert "passwd" not in json.dumps(r.json()["detail"][0]["allowed"])
        assert not started
        r = client.post("/api/v1/jobs", json={"task": {**TASK, "spot_history": str(SHIPPED)}})
        assert r.status_code == 202


# -- the orchestrator's hook ----------------------------------------------------------------------
def test_show_history_primes_the_policy(tmp_path) -> None:
    spec = parse_taskspec({**TASK, "policy": "spotwise", "spot_history": str(SHIPPED)})
    pol = SpotwiseSurvival()
    assert show_history(pol, spec)
    book = pol._state["_book"]
    assert book.seen("outage")[0] > 0 and book.seen("streak")[0] > 0
    blank = SpotwiseSurvival()
    assert not show_history(blank, parse_taskspec(TASK))
    assert blank._state["_book"].seen("outage")[0] == 0


def test_show_history_ages_the_last_spell(tmp_path) -> None:
    spec = parse_taskspec({**TASK, "spot_history": _trace(tmp_path, data=(0, 0, 1, 1, 0, 0, 0, 1, 1, 1), gap=900)})
    pol = SpotwiseSurvival()
    show_history(pol, spec)
    assert pol._state["_last_has"][0] == 1
    assert pol._state["_up_since"][0] == pytest.approx(-3 * 0.25)          # up for 3 ticks of 15 min
    np.testing.assert_allclose(pol._state["_book"].seen("outage"), [1.0])  # 0 0 0: the one complete outage


def test_a_history_gone_by_run_time_is_logged_not_fatal(tmp_path, caplog) -> None:
    path = _trace(tmp_path)
    spec = parse_taskspec({**TASK, "spot_history": path})
    (tmp_path / "zone.json").unlink()
    pol = SpotwiseSurvival()
    with caplog.at_level(logging.WARNING, logger="spotwise.orchestrator"):
        assert not show_history(pol, spec)
    assert "spot_history" in caplog.text
    assert pol._state["_book"].seen("outage")[0] == 0


def test_the_orchestrator_calls_the_hook(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    monkeypatch.delenv("SPOTWISE_DATABASE_URL", raising=False)
    spec = parse_taskspec({**TASK, "policy": "spotwise", "spot_history": str(SHIPPED)})
    o = Orchestrator(spec, LaunchOptions())      # builds the plan; launches nothing
    assert o.steering.policy._state["_book"].seen("outage")[0] > 0
    o2 = Orchestrator(parse_taskspec({**TASK, "policy": "spotwise"}), LaunchOptions())
    assert o2.steering.policy._state["_book"].seen("outage")[0] == 0

"""A run that fails in a way nobody planned for still ends its job: never left ``running``.

Reproduces issue #17's "a bad ``--trace`` leaves the job ``running``": a trace file that is not
JSON made the local market raise a plain ``JSONDecodeError`` (not a :class:`SpotwiseError`), which
escaped the orchestrator before it recorded an outcome.
"""

from __future__ import annotations

import json

import pytest

from spotwise.provisioner.clouds.local.cloud import marked_pids
from spotwise.engine.state import db
from spotwise.engine.run.orchestrator import LaunchOptions, Orchestrator
from spotwise.taskspec import parse_taskspec


def test_an_unexpected_error_after_the_job_row_is_written_ends_the_job_failed(database, home):
    trace = home / "trace.json"
    trace.write_text("this is not JSON")
    spec = parse_taskspec({"name": "bad-trace", "resources": {"accelerators": "cpu:1", "nodes": 1, "clouds": ["local"]},
                           "training": {"entrypoint": "tiny-gpt", "steps": 10,
                                        "checkpoint": {"storage": f"file://{home}/ckpt", "interval_steps": 5}},
                           "budget_usd": 1.0}, source="test")
    orch = Orchestrator(spec, LaunchOptions(trace=str(trace)))
    with pytest.raises(json.JSONDecodeError):          # a bug-shaped error still reaches the caller (CLI: exit 70)
        orch.run()
    with db.session() as s:
        job = s.get(db.Job, orch.job_id)
        assert job.status == "failed" and "JSONDecodeError" in job.message
        assert job.finished_at is not None and job.report["status"] == "failed"
    assert marked_pids(home_prefix=str(home)) == []

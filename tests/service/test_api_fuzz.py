"""Schemathesis against /openapi.json: generated requests never get a 500 (bounded examples).

Driven through schemathesis' Python API (operation -> hypothesis strategy) rather than its pytest
plugin, so it runs with whatever pytest the project pins. Every operation gets ``EXAMPLES``
generated cases, sent with a valid token (so the handlers run, not just the 401 path).
"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

EXAMPLES = 12


class Recorder:
    def __init__(self):
        self.started = []

    def __call__(self, job_id):
        self.started.append(job_id)


def test_no_server_errors(sqlite_db):
    from spotwise.service import auth
    from spotwise.service.app import create_app
    from spotwise.service.scheduler import Scheduler

    token = auth.create_token("fuzz")
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(Scheduler(launcher=Recorder())))
    ops = [r.ok() for r in schema.get_all_operations()]
    assert len(ops) >= 15
    failures = []
    for op in ops:
        @given(case=op.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case):
            response = case.call(headers={"Authorization": f"Bearer {token}"})
            case.validate_response(response, checks=[not_a_server_error])

        try:
            run()
        except Exception as e:  # collect all operations' failures, then report them together
            failures.append(f"{op.label}: {str(e)[:2000]}")
    assert not failures, "\n\n".join(failures)

"""Schemathesis against ``/openapi.json``, on SQLite and on PostgreSQL: no generated request gets
a server error, and every JSON answer is strict JSON (no ``NaN``/``Infinity``, valid UTF-8).

Cases are drawn from both of schemathesis' generation modes: positive (valid by the schema, so
the handlers' own checks and the database are reached) and negative (violating it: wrong types,
out-of-range numbers, odd strings). Bounded and repeatable: ``EXAMPLES`` cases per operation, ``derandomize=True`` (hypothesis draws
from a fixed seed, so a failure reproduces on the next run), no example database. Driven through
schemathesis' Python API (operation -> hypothesis strategy) rather than its pytest plugin, so it
runs with whatever pytest the project pins. Requests carry a valid token, so the handlers run,
not just the 401 path; the app's launcher only records job ids (nothing is started).
"""

from __future__ import annotations

import json

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

EXAMPLES = 12


def strict_json_body(response) -> None:
    """A JSON answer must parse with a strict parser."""
    if "json" not in response.headers.get("content-type", ""):
        return
    text = response.content.decode("utf-8")
    json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} in a JSON answer")))


def test_no_server_errors(database):
    from spotwise.service import auth
    from spotwise.service.app import create_app
    from spotwise.service.scheduler import Scheduler

    token = auth.create_token("fuzz")
    started: list[str] = []
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(Scheduler(launcher=started.append)))
    ops = [r.ok() for r in schema.get_all_operations()]
    assert len(ops) >= 15
    failures = []
    calls = 0
    for op in ops:
        @given(case=st.one_of(op.as_strategy(GenerationMode.POSITIVE), op.as_strategy(GenerationMode.NEGATIVE)))
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                  derandomize=True)
        def run(case):
            nonlocal calls
            calls += 1
            response = case.call(headers={"Authorization": f"Bearer {token}"})
            case.validate_response(response, checks=[not_a_server_error])
            strict_json_body(response)

        try:
            run()
        except Exception as e:  # noqa: BLE001 - collect all operations' failures, then report them together
            failures.append(f"{op.label}: {str(e)[:2000]}")
    assert not failures, "\n\n".join(failures)
    assert calls >= len(ops) * 2          # the cases ran (not all filtered out)

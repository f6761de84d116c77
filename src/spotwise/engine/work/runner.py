"""``python -m spotwise.engine.work.runner JOB_ID``: run one recorded job (started by the service).

One process per job (see :mod:`spotwise.engine.work.jobs`); SIGINT cancels it cleanly.
"""

from __future__ import annotations

import json
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    from spotwise.errors import SpotwiseError
    from spotwise.engine.work.jobs import run_job

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m spotwise.engine.work.runner JOB_ID", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        report = run_job(args[0])
    except SpotwiseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps({k: report.get(k) for k in ("job_id", "status", "cost_usd", "steps_completed")}))
    return 0 if report.get("status") == "succeeded" else 3


if __name__ == "__main__":
    sys.exit(main())

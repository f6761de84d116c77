"""``spotwise serve``: reconcile, then the scheduler and the HTTP API in one process.

On start, :func:`~spotwise.service.jobs.reconcile` ends the jobs a previous server (or runner)
left marked running with no owner process. The scheduler ticks in a background thread; uvicorn
serves the app in the main thread. On SIGINT/SIGTERM uvicorn stops and the scheduler with it;
running jobs keep running in their own runner processes (their owner is the runner, not the
server), so restarting the server never stops or repeats a job.
"""

from __future__ import annotations

import logging

log = logging.getLogger("spotwise.server")


def serve(host: str = "127.0.0.1", port: int = 8600, *, tick_seconds: float = 5.0, log_level: str = "info") -> None:
    import uvicorn

    from spotwise.service import db, jobs
    from spotwise.service.app import create_app, freeze_startup_heap
    from spotwise.service.scheduler import Scheduler

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    db.engine()
    for r in jobs.reconcile():
        log.warning("reconciled %s", r)
    scheduler = Scheduler()
    app = create_app(scheduler)
    freeze_startup_heap()
    scheduler.start(interval=tick_seconds)
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
    finally:
        scheduler.stop()

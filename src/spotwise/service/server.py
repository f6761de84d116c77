"""``spotwise serve``: reconcile, then the scheduler and the HTTP API in one process.

On start, and every :data:`REAP_INTERVAL_S` after, :func:`~spotwise.engine.work.jobs.reconcile` ends
the jobs whose runner is dead (lease expired, or its process gone) and marks them ``lost``. The scheduler ticks in a background thread; uvicorn
serves the app in the main thread. On SIGINT/SIGTERM uvicorn stops and the scheduler with it;
running jobs keep running in their own runner processes (their owner is the runner, not the
server), so restarting the server never stops or repeats a job.
"""

from __future__ import annotations

import logging

log = logging.getLogger("spotwise.server")


def serve(host: str = "127.0.0.1", port: int = 8600, *, tick_seconds: float = 5.0, log_level: str = "info") -> None:
    import uvicorn

    from spotwise.engine.state import db
    from spotwise.engine.work import jobs
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
    reaper = _start_reaper(REAP_INTERVAL_S)
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
    finally:
        reaper.set()
        scheduler.stop()


REAP_INTERVAL_S = 30.0   # a dead runner's job is reaped within its lease (30 s) + this


def _start_reaper(interval: float):
    """Reap jobs whose runner died (lease expired, or its pid gone) while the server runs, not only
    at start: a SIGKILLed runner's job is marked ``lost`` and its bills closed within a minute."""
    import threading

    from spotwise.engine.work import jobs

    stop = threading.Event()

    def loop():
        while not stop.wait(interval):
            try:
                for r in jobs.reconcile():
                    log.warning("reconciled %s", r)
            except Exception:  # noqa: BLE001 - the next pass tries again
                log.exception("reconcile failed")

    threading.Thread(target=loop, name="reaper", daemon=True).start()
    return stop

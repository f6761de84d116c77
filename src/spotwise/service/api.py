"""The HTTP API under ``/api/v1`` (FastAPI): prices, estimates, jobs, schedules, budgets, cost report.

Every route needs ``Authorization: Bearer <token>`` (tokens from ``spotwise token create``);
without a valid one the answer is 401. Bad input is a 422 whose ``detail`` lists
``{field, given, allowed}`` — the same :class:`~spotwise.errors.Problem` the CLI prints — or
FastAPI's own validation detail (``loc`` names the field); a name or id already taken is a 409.
Launches never block: ``POST /jobs`` records the job and hands it to the app's launcher (a runner
process per job).

Trust boundary: a token holder may start jobs, but not act as the server user on its disk. So a
task submitted here (a job or a schedule) may use ``file://`` checkpoint storage only under the
server's file storage root (``SPOTWISE_FILE_STORAGE_ROOT``, default ``$SPOTWISE_HOME/checkpoints``),
and a ``local.trace`` only from the shipped traces or ``$SPOTWISE_HOME/traces``, with one answer
for every refused trace path (so the API does not tell which files exist). A NUL character in
any query, path or body string is a 422 (PostgreSQL cannot store one; it was a 500). Those checks
live in :mod:`spotwise.service.boundary`; this module holds the request models and the routes, each of
which parses, calls one engine function and shapes the answer.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from spotwise.engine.work import budgets, jobs, schedules
from spotwise.engine.state import ledger, store
from spotwise.service.boundary import confine_spec, refuse_nul, require_token

Money = Annotated[float, Field(gt=0, le=1e7, allow_inf_nan=False)]
Hours = Annotated[float, Field(gt=0, le=1e5, allow_inf_nan=False)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobIn(_In):
    task: dict[str, Any] = Field(description="a task spec, as in a task YAML file")
    budget_usd: Optional[Money] = Field(default=None, description="the run's cap (overrides the task's)")
    deadline_hours: Optional[Hours] = None
    budget_id: Optional[str] = Field(default=None, max_length=128,
                                     description="a budget to reserve the run's cap against first")


class ResumeIn(_In):
    budget_usd: Optional[Money] = Field(default=None, description="USD added on top of what the job has spent "
                                                                  "(default: what is left of its own cap)")
    deadline_hours: Optional[Hours] = Field(default=None, description="a new deadline, in hours from now")


class ScheduleIn(_In):
    task: dict[str, Any]
    cron: str = Field(max_length=128, examples=["0 2 * * *"])
    timezone: str = Field(default="UTC", max_length=64)
    budget_per_run: Optional[Money] = None
    budget_per_month: Optional[Money] = None
    deadline_hours: Optional[Hours] = None
    name: Optional[str] = Field(default=None, max_length=128)
    overlap: Literal["skip", "queue"] = "skip"
    unfinished: Literal["restart", "resume"] = "restart"
    paused: bool = False


class ScheduleUpdate(_In):
    cron: Optional[str] = Field(default=None, max_length=128)
    timezone: Optional[str] = Field(default=None, max_length=64)
    budget_per_run: Optional[Money] = None
    budget_per_month: Optional[Money] = None
    deadline_hours: Optional[Hours] = None
    overlap: Optional[Literal["skip", "queue"]] = None
    unfinished: Optional[Literal["restart", "resume"]] = None


class BudgetIn(_In):
    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
    cap_usd: Money
    name: Optional[str] = Field(default=None, max_length=128)
    period: Literal["month", "total"] = "month"
    timezone: str = Field(default="UTC", max_length=64)


def _csv(v: str | None) -> list[str] | None:
    return [x.strip() for x in v.split(",") if x.strip()] if v else None


router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_token), Depends(refuse_nul)])


@router.get("/prices", summary="GPU offers, cheapest first")
def prices(accelerator: str = Query(..., max_length=64, examples=["H100"]),
           count: int = Query(1, ge=1, le=16), nodes: int = Query(1, ge=1, le=256),
           clouds: Optional[str] = Query(None, max_length=64), regions: Optional[str] = Query(None, max_length=256),
           market: Optional[str] = Query(None, max_length=64),
           max_price: Optional[float] = Query(None, gt=0, le=1e6), limit: int = Query(50, ge=1, le=1000)):
    from spotwise.pricing.catalog import find_offers

    offers = find_offers({accelerator: count}, clouds=_csv(clouds), regions=_csv(regions), market=market,
                         max_price=max_price, nodes=nodes)
    return {"count": len(offers), "offers": [o.to_dict() for o in offers[:limit]]}


@router.get("/estimates", summary="expected cost and time of a job per cloud and market")
def estimates(accelerator: str = Query(..., max_length=64), count: int = Query(1, ge=1, le=16),
              nodes: int = Query(1, ge=1, le=256), hours: Optional[float] = Query(None, gt=0, le=1e5),
              model_params: Optional[float] = Query(None, gt=0, le=1e14),
              tokens: Optional[float] = Query(None, gt=0, le=1e16), mfu: float = Query(0.4, gt=0, le=1),
              clouds: Optional[str] = Query(None, max_length=64), market: Optional[str] = Query(None, max_length=64),
              deadline_hours: Optional[float] = Query(None, gt=0, le=1e5),
              budget_usd: Optional[float] = Query(None, gt=0, le=1e9)):
    from spotwise.pricing.estimate import JobModel, estimate

    job = JobModel(hours=hours, model_params=model_params, tokens=tokens, mfu=mfu)
    out = estimate({accelerator: count}, job, nodes=nodes, clouds=_csv(clouds), market=_csv(market),
                   deadline_hours=deadline_hours, budget_usd=budget_usd)
    return {"count": len(out), "estimates": [e.to_dict() for e in out]}


@router.get("/jobs", summary="jobs, newest first")
def list_jobs(status: Optional[str] = Query(None, max_length=32), limit: int = Query(50, ge=1, le=1000)):
    return store.list_jobs(limit=limit, status=status)


def _job_or_404(job_id: str) -> None:
    if not store.job_exists(job_id):
        raise HTTPException(404, detail=f"no job {job_id!r}")


@router.get("/jobs/{job_id}")
def get_job(job_id: str):
    d = store.get_job(job_id, with_report=True)
    if d is None:
        raise HTTPException(404, detail=f"no job {job_id!r}")
    return d


@router.get("/jobs/{job_id}/events", summary="the job's events (launches, notices, preemptions, stops)")
def job_events(job_id: str, after_id: int = Query(0, ge=0, le=2**62)):
    _job_or_404(job_id)
    return store.job_events(job_id, after_id=after_id)


@router.get("/jobs/{job_id}/curves", summary="the job's loss per step, spend over time, and what marks them")
def job_curves(job_id: str):
    from spotwise.engine.run.curves import curves

    _job_or_404(job_id)
    return curves(job_id)


@router.get("/jobs/{job_id}/logs", summary="what the job printed (the driver and every rank), in order")
def job_logs(job_id: str, after: int = Query(0, ge=0, le=2**62), limit: int = Query(1000, ge=1, le=10000)):
    """The job's own output (``spotwise logs``): the lines after sequence number ``after`` (at most
    ``limit``), each with ``seq``, ``t``, ``rank``, ``node``, ``stream``, ``line``; ``next`` is the
    ``after`` of the next call (the same when nothing new came)."""
    from spotwise.engine.run.joblogs import lines

    _job_or_404(job_id)
    rows = lines(job_id, after=after, limit=limit)
    return {"job_id": job_id, "lines": rows, "next": rows[-1]["seq"] if rows else after}


@router.get("/jobs/{job_id}/runner-log", summary="the tail of the job runner's own log (the orchestrator's)")
def job_runner_log(job_id: str, tail: int = Query(200, ge=1, le=10000)):
    _job_or_404(job_id)
    return {"job_id": job_id, "lines": jobs.log_tail(job_id, tail)}


@router.post("/jobs", status_code=202, summary="launch a job in the background")
def launch(body: JobIn, request: Request):
    spec = jobs.spec_with(body.task, budget_usd=body.budget_usd, deadline_hours=body.deadline_hours,
                          source="task")
    confine_spec(spec)
    job_id = jobs.submit(spec, budget_id=body.budget_id)
    request.app.state.scheduler.start_job(job_id)
    return {"job_id": job_id, "status": "pending"}


@router.post("/jobs/{job_id}/cancel")
def cancel_job(job_id: str):
    _job_or_404(job_id)
    return {"job_id": job_id, "result": jobs.cancel(job_id)}


@router.post("/jobs/{job_id}/resume", status_code=202,
             summary="continue a budget_exhausted, cancelled or lost job from its last checkpoint")
def resume_job(job_id: str, request: Request, body: Optional[ResumeIn] = None):
    """The same as ``spotwise resume`` (:mod:`spotwise.engine.work.resume`): 404 for an unknown job, 409
    with the one-line reason for one that cannot be resumed now (succeeded, running, failed for a
    cause of its own, no committed checkpoint, no money left without ``budget_usd``)."""
    from spotwise.engine.work.resume import ResumeRefused, prepare

    body = body or ResumeIn()
    try:
        res = prepare(job_id, budget_usd=body.budget_usd, deadline_hours=body.deadline_hours, check=confine_spec)
    except ResumeRefused as e:
        raise HTTPException(e.http_status, detail=str(e)) from None
    request.app.state.scheduler.start_job(job_id)
    return {"job_id": job_id, "status": "pending", "from_step": res.from_step, "from_status": res.from_status,
            "budget_usd": res.budget_usd, "spent_usd": round(res.spent_usd, 6)}


@router.get("/schedules")
def list_schedules():
    return schedules.list_schedules()


@router.post("/schedules", status_code=201)
def create_schedule(body: ScheduleIn):
    from spotwise.taskspec import parse_taskspec, resolve_init_from

    spec = parse_taskspec(resolve_init_from(body.task, source="task"), source="task")
    confine_spec(spec)
    return schedules.create_schedule(spec, cron=body.cron, timezone=body.timezone,
                                     budget_per_run=body.budget_per_run, budget_per_month=body.budget_per_month,
                                     deadline_hours=body.deadline_hours, name=body.name, overlap=body.overlap,
                                     paused=body.paused, unfinished=body.unfinished)


def _schedule_or_404(ref: str) -> None:
    if not schedules.exists(ref):
        raise HTTPException(404, detail=f"no schedule {ref!r}")


@router.get("/schedules/{ref}")
def get_schedule(ref: str):
    _schedule_or_404(ref)
    return schedules.describe(ref, runs_limit=20)


@router.patch("/schedules/{ref}")
def update_schedule(ref: str, body: ScheduleUpdate):
    _schedule_or_404(ref)
    return schedules.update(ref, **body.model_dump(exclude_unset=True))


@router.delete("/schedules/{ref}")
def delete_schedule(ref: str):
    _schedule_or_404(ref)
    return {"removed": schedules.remove(ref)}


@router.post("/schedules/{ref}/pause")
def pause_schedule(ref: str):
    _schedule_or_404(ref)
    return schedules.set_paused(ref, True)


@router.post("/schedules/{ref}/resume")
def resume_schedule(ref: str):
    _schedule_or_404(ref)
    return schedules.set_paused(ref, False)


@router.get("/budgets")
def list_budgets():
    return [b.to_dict() for b in budgets.list_budgets()]


@router.post("/budgets", status_code=201)
def create_budget(body: BudgetIn):
    budgets.create_budget(body.id, cap_usd=body.cap_usd, name=body.name, period=body.period,
                          timezone=body.timezone)
    return budgets.status(body.id).to_dict()


@router.get("/budgets/{budget_id}")
def get_budget(budget_id: str):
    if not budgets.exists(budget_id):
        raise HTTPException(404, detail=f"no budget {budget_id!r}")
    return budgets.status(budget_id).to_dict()


@router.get("/cost-report", summary="spend from the ledger by job, cloud and market")
def cost_report(job_id: Optional[str] = Query(None, max_length=64)):
    return ledger.cost_report(job_id)

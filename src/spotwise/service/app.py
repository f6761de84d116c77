"""The service's ASGI app: API (``/api/v1``), dashboard (``/``), metrics (``/metrics``).

``create_app(scheduler)`` builds it around a :class:`~spotwise.service.scheduler.Scheduler`, whose
launcher starts the jobs ``POST /api/v1/jobs`` records (tests pass one with their own launcher).
The dashboard and ``/metrics`` take the same token as the API: a Bearer header, or the
``spotwise_token`` cookie that ``/?token=...`` sets (so a browser can open the dashboard).
``/healthz`` is open (for load balancers).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from spotwise.errors import InputError, SpotwiseError
from spotwise.service import auth

STATIC = Path(__file__).with_name("static")


def freeze_startup_heap() -> None:
    """Load what every request reads (the price catalog), collect once, then ``gc.freeze()``.

    A full (generation 2) collection of the server's startup heap (~90k objects: FastAPI,
    pydantic, SQLAlchemy, the catalog) takes ~50 ms on this machine and stalls every request
    queued behind it; at 200 req/s that was most of the p99. Frozen objects are never scanned
    again, so full collections only walk what requests allocate. Called by ``spotwise serve``
    once the app is built.
    """
    import gc

    from spotwise.pricing.catalog import default_catalog

    default_catalog()
    gc.collect()
    gc.freeze()


def create_app(scheduler=None) -> FastAPI:
    from spotwise.service import api, dashboard, metrics
    from spotwise.service.scheduler import Scheduler

    app = FastAPI(title="spotwise", version="1", description="Train models on cloud GPUs for the least money.")
    app.state.scheduler = scheduler if scheduler is not None else Scheduler()

    @app.exception_handler(InputError)
    async def _input_error(_req: Request, e: InputError):
        return JSONResponse(status_code=422, content={"detail": [
            {"field": p.field, "given": p.given if isinstance(p.given, (int, float, str, bool, type(None))) else repr(p.given),
             "allowed": p.allowed} for p in e.problems], "message": str(e)})

    @app.exception_handler(SpotwiseError)
    async def _spotwise_error(_req: Request, e: SpotwiseError):
        return JSONResponse(status_code=409, content={"detail": str(e)})

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, e: RequestValidationError):
        errs = [{"field": ".".join(str(x) for x in err.get("loc", ()) if x not in ("body", "query", "path")) or "(body)",
                 "loc": list(err.get("loc", ())), "msg": err.get("msg"), "type": err.get("type")}
                for err in e.errors()]
        return JSONResponse(status_code=422, content={"detail": errs})

    app.include_router(api.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/healthz", include_in_schema=False)
    def healthz():
        return {"ok": True}

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index(request: Request, token: str | None = None, gpu: str = "H100"):
        if token is not None:
            if not auth.verify(token):
                return HTMLResponse(dashboard.LOGIN, status_code=401)
            r = RedirectResponse("/", status_code=303)
            r.set_cookie("spotwise_token", token, httponly=True, samesite="strict")
            return r
        if not auth.verify(api.bearer_token(request)):
            return HTMLResponse(dashboard.LOGIN, status_code=401)
        return HTMLResponse(dashboard.render(gpu=gpu[:64]))

    @app.get("/metrics", include_in_schema=False)
    def metrics_endpoint(request: Request):
        if not auth.verify(api.bearer_token(request)):
            return JSONResponse(status_code=401, content={"detail": "a valid API token is required"},
                                headers={"WWW-Authenticate": "Bearer"})
        return Response(metrics.render(), media_type=metrics.CONTENT_TYPE)

    return app

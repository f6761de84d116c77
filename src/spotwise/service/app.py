"""The service's ASGI app: API (``/api/v1``), dashboard (``/``), metrics (``/metrics``).

``create_app(scheduler)`` builds it around a :class:`~spotwise.service.scheduler.Scheduler`, whose
launcher starts the jobs ``POST /api/v1/jobs`` records (tests pass one with their own launcher).
The dashboard and ``/metrics`` take the same token as the API: a Bearer header, or the
``spotwise_token`` cookie that the sign-in form (``POST /signin``) sets so a browser can open the
dashboard. The cookie is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's
page can make the browser send it, so it cannot be used for cross-site requests) and ``Secure``
when the request came over HTTPS; the token travels in the form body, never in a URL (URLs end
up in logs, history and ``Referer`` headers). ``/healthz`` is open (for load balancers).

Every answer is valid JSON: :class:`SafeJSONResponse` writes non-finite numbers as ``null`` and
lone surrogates as U+FFFD (an old row holding ``Infinity`` or a 422 echoing what a client sent
must not turn into a 500). :class:`~spotwise.service.guard.Guard` sits in front of everything
(token before body, body limit, browser security headers).
"""

from __future__ import annotations

import html

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from starlette.exceptions import HTTPException as StarletteHTTPException

from spotwise.errors import Conflict, InputError, SpotwiseError
from spotwise.output import dumps
from spotwise.service import auth


class SafeJSONResponse(JSONResponse):
    """JSON that is always valid: see :func:`spotwise.output.json_safe`."""

    def render(self, content) -> bytes:
        return dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _problems(e: InputError) -> dict:
    return {"detail": [{"field": p.field, "given": p.given if isinstance(p.given, (int, float, str, bool, type(None)))
                        else repr(p.given), "allowed": p.allowed} for p in e.problems], "message": str(e)}

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
    from spotwise.service.boundary import bearer_token
    from spotwise.service.scheduler import Scheduler

    from spotwise.service.guard import Guard, max_body_bytes

    app = FastAPI(title="spotwise", version="1", description="Train models on cloud GPUs for the least money.",
                  default_response_class=SafeJSONResponse)
    app.state.scheduler = scheduler if scheduler is not None else Scheduler()
    app.add_middleware(Guard, limit=max_body_bytes())     # checked now: a bad value stops serve (exit 2)

    @app.exception_handler(Conflict)
    async def _conflict(_req: Request, e: Conflict):
        return SafeJSONResponse(status_code=409, content=_problems(e))

    @app.exception_handler(InputError)
    async def _input_error(_req: Request, e: InputError):
        return SafeJSONResponse(status_code=422, content=_problems(e))

    @app.exception_handler(SpotwiseError)
    async def _spotwise_error(_req: Request, e: SpotwiseError):
        return SafeJSONResponse(status_code=409, content={"detail": str(e)})

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_req: Request, e: StarletteHTTPException):
        return SafeJSONResponse(status_code=e.status_code, content={"detail": e.detail},
                                headers=getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, e: RequestValidationError):
        errs = [{"field": ".".join(str(x) for x in err.get("loc", ()) if x not in ("body", "query", "path")) or "(body)",
                 "loc": list(err.get("loc", ())), "msg": err.get("msg"), "type": err.get("type")}
                for err in e.errors()]
        return SafeJSONResponse(status_code=422, content={"detail": errs})

    app.include_router(api.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/healthz", include_in_schema=False)
    def healthz():
        return {"ok": True}

    @app.post("/signin", include_in_schema=False)
    async def signin(request: Request):
        """The sign-in form's target: the token in an urlencoded body, answered with the cookie."""
        from urllib.parse import parse_qs

        form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=4)
        token = (form.get("token") or [""])[0].strip()
        if not auth.verify(token):
            return HTMLResponse(dashboard.LOGIN, status_code=401)
        r = RedirectResponse("/", status_code=303)
        r.set_cookie("spotwise_token", token, httponly=True, samesite="strict",
                     secure=request.url.scheme == "https", path="/")
        return r

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index(request: Request, gpu: str = "H100"):
        if "token" in request.query_params:
            # the old `/?token=` sign-in: refused, so a token never sits in a URL (logs, history)
            return HTMLResponse(dashboard.LOGIN, status_code=400)
        if not auth.verify(bearer_token(request)):
            return HTMLResponse(dashboard.LOGIN, status_code=401)
        return HTMLResponse(dashboard.render(gpu=gpu[:64]))

    @app.get("/jobs/{job_id}", response_class=HTMLResponse, include_in_schema=False)
    def job_page(request: Request, job_id: str):
        if not auth.verify(bearer_token(request)):
            return HTMLResponse(dashboard.LOGIN, status_code=401)
        page = dashboard.render_job(job_id[:64])
        if page is None:
            return HTMLResponse(f"<!doctype html><p>no job {html.escape(job_id[:64])!s}</p>", status_code=404)
        return HTMLResponse(page)

    @app.get("/metrics", include_in_schema=False)
    def metrics_endpoint(request: Request):
        if not auth.verify(bearer_token(request)):
            return JSONResponse(status_code=401, content={"detail": "a valid API token is required"},
                                headers={"WWW-Authenticate": "Bearer"})
        return Response(metrics.render(), media_type=metrics.CONTENT_TYPE)

    return app

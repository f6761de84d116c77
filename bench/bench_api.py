"""Load benchmark of the API on loopback: mixed reads at a fixed rate, p50/p99 latency.

Starts ``spotwise serve``'s app under uvicorn in a subprocess (SQLite in a temp SPOTWISE_HOME,
seeded with jobs, ledger rows and schedules), and, in the same run, a bare FastAPI app with one
hello endpoint (the baseline: what uvicorn + FastAPI cost by themselves on this machine). A lean
asyncio client sends requests open-loop at ``--rate`` per second for ``--seconds`` and
prints latency percentiles and the ratio of spotwise's p99 to the baseline's.

    .venv/bin/python bench/bench_api.py --rate 200 --seconds 20          # open loop, the target
    .venv/bin/python bench/bench_api.py --client wrk --connections 8     # capacity (closed loop)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from spotwise.utils.net import free_port

SERVER = r"""
import os, sys, time, uvicorn
mode, port = sys.argv[1], int(sys.argv[2])
if mode == "baseline":
    from fastapi import FastAPI
    app = FastAPI()
    @app.get("/hello")
    def hello():
        return {"hello": "world"}
else:
    from spotwise.engine.state import db
    from spotwise.engine.work import schedules
    from spotwise.service import auth
    from spotwise.service.app import create_app
    from spotwise.service.scheduler import Scheduler
    token = auth.create_token("bench")
    now = time.time()
    with db.session() as s:
        for i in range(50):
            s.add(db.Job(id=f"job-{i}", name="bench", status="succeeded", cloud="local", spec={}, budget_usd=1.0,
                         created_at=now - i * 60))
        s.flush()
        for k in range(2000):
            s.add(db.LedgerEntry(job_id=f"job-{k % 50}", instance_id=f"i{k % 100}", cloud="local",
                                 market="spot" if k % 3 else "on-demand", start=now - 5000 + k, end=now - 4999 + k,
                                 seconds=1, usd_per_hour=0.36, usd=0.0001, price_source="b", price_as_of="b"))
        s.commit()
    for i in range(5):
        schedules.create_schedule({"name": f"s{i}"}, cron="0 2 * * *", budget_per_run=1, budget_per_month=10)
    open(os.environ["BENCH_TOKEN_FILE"], "w").write(token)
    app = create_app(Scheduler(launcher=lambda j: None))
    if os.environ.get("BENCH_NO_FREEZE") != "1":
        from spotwise.service.app import freeze_startup_heap
        freeze_startup_heap()            # as `spotwise serve` does
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
"""

SPOTWISE_PATHS = ["/api/v1/jobs?limit=20", "/api/v1/jobs/job-7", "/api/v1/schedules", "/api/v1/budgets",
                  "/api/v1/prices?accelerator=H100&market=spot&limit=20", "/api/v1/cost-report?job_id=job-3",
                  "/api/v1/jobs/job-11/events"]


def start(mode: str, home: str, database_url: str | None = None) -> tuple[subprocess.Popen, int, str | None]:
    port = free_port()
    tok = os.path.join(home, "token")
    env = dict(os.environ, SPOTWISE_HOME=home, BENCH_TOKEN_FILE=tok)
    env.pop("SPOTWISE_DATABASE_URL", None)
    if database_url and mode != "baseline":
        env["SPOTWISE_DATABASE_URL"] = database_url
    p = subprocess.Popen([sys.executable, "-c", SERVER, mode, str(port)], env=env)
    import httpx

    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/{'hello' if mode == 'baseline' else 'healthz'}", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        p.kill()
        raise SystemExit(f"{mode} server did not start")
    return p, port, (open(tok).read() if mode != "baseline" else None)


async def load(port: int, paths: list[str], token: str | None, rate: float, seconds: float) -> dict:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    lat: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers, limits=limits,
                                 timeout=10) as c:
        for p in paths:                                     # warm-up
            await c.get(p)

        async def one(path: str) -> None:
            nonlocal errors
            t = time.perf_counter()
            try:
                r = await c.get(path)
                if r.status_code != 200:
                    errors += 1
            except httpx.HTTPError:
                errors += 1
            lat.append((time.perf_counter() - t) * 1000)

        n = int(rate * seconds)
        t0 = time.perf_counter()
        tasks = []
        for i in range(n):                                  # open loop: send on schedule, whatever the replies
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(paths[i % len(paths)])))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    lat.sort()
    q = statistics.quantiles(lat, n=100)
    return {"requests": n, "errors": errors, "achieved_rps": round(n / wall, 1), "p50_ms": round(q[49], 2),
            "p99_ms": round(q[98], 2), "max_ms": round(lat[-1], 2)}


async def load_raw(port: int, paths: list[str], token: str | None, rate: float, seconds: float) -> dict:
    """Open-loop load at ``rate`` req/s with a lean HTTP/1.1 keep-alive client on raw asyncio
    streams (uvloop when installed): an httpx client costs more CPU per request than the server
    on this 2-core machine. Latency runs from each request's *scheduled* send time, so a server
    that falls behind is charged for the queueing it causes (no coordinated omission)."""
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    reqs = [f"GET {p} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n".encode() for p in paths]
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    lat: list[float] = []
    errors = 0
    kinds: dict[str, int] = {}

    async def one(i: int, scheduled: float) -> None:
        nonlocal errors
        reused = bool(idle)
        conn = idle.pop() if idle else await asyncio.open_connection("127.0.0.1", port)
        r, w = conn
        try:
            w.write(reqs[i % len(reqs)])
            try:
                head = await r.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as e:
                if not (reused and not e.partial):
                    raise
                # the server closed an idle keep-alive connection (uvicorn: after 5 s); like any
                # HTTP client, send again once on a fresh connection
                w.close()
                conn = r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(reqs[i % len(reqs)])
                head = await r.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            n = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    n = int(line[15:])
            await r.readexactly(n)
            if status != 200:
                errors += 1
                kinds[f"HTTP {status} {paths[i % len(paths)]}"] = kinds.get(f"HTTP {status} {paths[i % len(paths)]}", 0) + 1
            idle.append(conn)
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            errors += 1
            kinds[type(e).__name__] = kinds.get(type(e).__name__, 0) + 1
            w.close()
        lat.append((time.perf_counter() - scheduled) * 1000)

    for i in range(len(paths)):                              # warm-up, one of each
        await one(i, time.perf_counter())
    lat.clear()
    errors = 0
    kinds.clear()
    n = int(rate * seconds)
    t0 = time.perf_counter()
    tasks = []
    for i in range(n):
        at = t0 + i / rate
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, at)))
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    for _, w in idle:
        w.close()
    lat.sort()
    q = statistics.quantiles(lat, n=100)
    return {"client": "raw-asyncio open loop", "requests": n, "errors": errors, "error_kinds": kinds, "rate": rate,
            "achieved_rps": round(n / wall, 1), "p50_ms": round(q[49], 2), "p99_ms": round(q[98], 2),
            "max_ms": round(lat[-1], 2)}


WRK_LUA = """
paths = {%s}
token = "%s"
i = 0
request = function()
  i = i + 1
  local h = {}
  if token ~= "" then h["Authorization"] = "Bearer " .. token end
  return wrk.format("GET", paths[(i %% #paths) + 1], h)
end
"""


def load_wrk(port: int, paths: list[str], token: str | None, seconds: float, conns: int) -> dict:
    """Closed-loop load with wrk (a C client, so the client is not the bottleneck)."""
    import re

    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(WRK_LUA % (", ".join(json.dumps(p) for p in paths), token or ""))
    try:
        out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{int(seconds)}s", "--latency", "-s", f.name,
                              f"http://127.0.0.1:{port}"], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)

    def ms(label):
        m = re.search(rf"{label}%\s+([\d.]+)(us|ms|s)", out)
        v, u = float(m.group(1)), m.group(2)
        return round(v / 1000 if u == "us" else v * 1000 if u == "s" else v, 2)

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"client": "wrk", "connections": conns, "rps": rps, "p50_ms": ms("50"), "p99_ms": ms("99"),
            "non_2xx": int(non2xx.group(1)) if non2xx else 0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=200)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--client", choices=["raw", "httpx", "wrk"], default="raw",
                    help="raw (default) or httpx: open loop at --rate; wrk: closed loop with --connections "
                         "(the server's capacity; needs Debian's wrk)")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--no-freeze", action="store_true",
                    help="skip gc.freeze() of the startup heap (to measure what it buys)")
    ap.add_argument("--postgres", action="store_true",
                    help="serve from a fresh PostgreSQL database on 127.0.0.1:5432 (dropped after) instead of SQLite")
    a = ap.parse_args()
    if a.no_freeze:
        os.environ["BENCH_NO_FREEZE"] = "1"
    out = {}
    pg_name = database_url = None
    if a.postgres:
        import uuid

        import psycopg

        pg_name = f"sw_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{pg_name}"')
        database_url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{pg_name}"
    try:
        _run(a, out, database_url)
    finally:
        if pg_name:
            import psycopg

            with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')
    out["database"] = "postgresql" if a.postgres else "sqlite"
    out["gc_freeze"] = not a.no_freeze
    out["p99_ratio_spotwise_over_baseline"] = round(out["spotwise"]["p99_ms"] / out["baseline"]["p99_ms"], 2)
    out["rate"], out["seconds"] = a.rate, a.seconds
    print(json.dumps(out, indent=2))


def _run(a, out: dict, database_url: str | None) -> None:
    for mode in ("baseline", "spotwise"):
        with tempfile.TemporaryDirectory() as home:
            proc, port, token = start(mode, home, database_url)
            try:
                paths = ["/hello"] if mode == "baseline" else SPOTWISE_PATHS
                if a.client == "wrk":
                    out[mode] = load_wrk(port, paths, token, a.seconds, a.connections)
                elif a.client == "raw":
                    out[mode] = asyncio.run(load_raw(port, paths, token, a.rate, a.seconds))
                else:
                    out[mode] = asyncio.run(load(port, paths, token, a.rate, a.seconds))
            finally:
                proc.terminate()
                proc.wait(timeout=30)


if __name__ == "__main__":
    main()

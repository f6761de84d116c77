"""The training job's driver on the cluster's head, and the orchestrator's view of it.

The orchestrator never runs training in its own process: it submits

    python -m spotwise.runtime.node.job SPEC_B64

through Ray's Jobs API (``ray.job_submission.JobSubmissionClient``) to the head's dashboard. This
driver then, on the head:

1. connects to its own cluster (``ray.init()`` inside a Ray job);
2. creates the run's control actor (:mod:`spotwise.runtime.training.control`), pinned to the head so a spot
   worker being reclaimed never takes the run's state with it;
3. serves a tiny control endpoint on the head's private address (``GET /v1/snapshot``,
   ``GET /v1/output?after=SEQ``, ``POST /v1/stop``, ``POST /v1/drain``, ``POST /v1/lease``),
   bearer-token protected (``SPOTWISE_CONTROL_TOKEN``): what the orchestrator polls every tick for
   progress, checkpoints and resumes, and for the job's own output (:mod:`spotwise.runtime.training.joboutput`), how it asks training to stop at a checkpoint (budget, Ctrl-C, a move to another
   market), and where it renews the run's lease, which every node's dead man's switch reads
   (:mod:`spotwise.runtime.node.deadman`);
4. runs :func:`spotwise.runtime.training.trainer.fit` with its own output captured (rank ``driver``), waits
   (at most :data:`OUTPUT_DRAIN_S`) until the orchestrator has read every line of the job's output,
   and prints the result as one ``SPOTWISE_RESULT {json}`` line, which the orchestrator reads back
   from the job's logs.

Why the Jobs API and not a driver on the user's machine: the run must not depend on the
laptop's connection to the cluster (Ray Client drops the job with the connection), and the
dashboard port is the one thing the orchestrator has to reach (plus this endpoint). Both listen
on the head's private address; see ``docs/orchestrator.md`` for how they are reached.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import sys
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from spotwise.runtime.api import TrainConfig, TrainJob, TrainResult

log = logging.getLogger("spotwise.job")
RESULT_PREFIX = "SPOTWISE_RESULT "
SNAPSHOT_PREFIX = "SPOTWISE_SNAPSHOT "
TOKEN_ENV = "SPOTWISE_CONTROL_TOKEN"
#: the launcher's build id (:func:`spotwise.build.build_id`): a head running another build refuses
#: the job, since its runtime, checkpoint layout or protocol may differ from what the launcher expects
BUILD_ENV = "SPOTWISE_BUILD_ID"
#: how long the driver, once training is over, waits for the orchestrator to read the job's output
#: (it reads every second while the job runs; a gone orchestrator costs the job this much at its end)
OUTPUT_DRAIN_S = 15.0


# -- the job's description on the wire -----------------------------------------------------------
def encode_job(job: TrainJob, *, control_port: int, control_host: str | None = None,
               use_gpu: bool | None = None) -> str:
    """``job`` as the driver's one argument (URL-safe base64 of JSON: no shell quoting issues).
    ``control_host``: the address the control endpoint listens on (default: the head's Ray node
    address), the one the orchestrator was told to reach."""
    # only what the task set: a user entrypoint's spec keeps its own steps, precision and
    # checkpoint settings unless the task gave them (TrainConfig.overrides reads what was set)
    wire = {**asdict(job), "config": job.config.model_dump(mode="json", exclude_unset=True)}
    doc = {"job": wire, "control_port": control_port, "control_host": control_host, "use_gpu": use_gpu}
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


def decode_job(arg: str) -> tuple[TrainJob, int, str | None, bool | None]:
    doc = json.loads(base64.urlsafe_b64decode(arg.encode()))
    j = dict(doc["job"])
    cfg = TrainConfig.model_validate(j.pop("config"))
    return (TrainJob(config=cfg, **j), int(doc["control_port"]), doc.get("control_host"),
            doc.get("use_gpu"))


def parse_result(logs: str) -> TrainResult | None:
    """The driver's result from its job logs (the last ``SPOTWISE_RESULT`` line), or None."""
    for line in reversed(logs.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return TrainResult(**json.loads(line[len(RESULT_PREFIX):]))
    return None


def parse_snapshot(logs: str) -> dict | None:
    """The control actor's final snapshot as the driver printed it when training ended (the
    control endpoint is gone by the time the orchestrator reads the result)."""
    for line in reversed(logs.splitlines()):
        if line.startswith(SNAPSHOT_PREFIX):
            return json.loads(line[len(SNAPSHOT_PREFIX):])
    return None


# -- the control endpoint ------------------------------------------------------------------------
def store_lease_in_kv(raw: bytes) -> None:
    """Store the run's lease where every node's watcher reads it: Ray's internal KV on the head's
    GCS (this driver is connected with ``ray.init()``)."""
    from ray.experimental import internal_kv

    from spotwise.runtime.node.deadman import KV_KEY, KV_NAMESPACE

    internal_kv._internal_kv_put(KV_KEY, raw, overwrite=True, namespace=KV_NAMESPACE)


class ControlServer:
    """HTTP front of the control actor on the head: snapshot, stop, drain and the run's lease.

    ``lease_store``: where ``POST /v1/lease`` puts the lease (default: Ray's internal KV, see
    :func:`store_lease_in_kv`); a test passes its own.
    """

    def __init__(self, actor, *, host: str, port: int, token: str, lease_store=None) -> None:
        import ray

        srv = self
        store_lease = lease_store or store_lease_in_kv

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, code: int, doc: dict) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {srv.token}":
                    return True
                self._send(401, {"error": "missing or wrong bearer token"})
                return False

            def do_GET(self) -> None:  # noqa: N802
                if not self._authorized():
                    return
                url = urlsplit(self.path)
                if url.path == "/v1/snapshot":
                    call = actor.snapshot.remote
                elif url.path == "/v1/output":
                    try:
                        after = int((parse_qs(url.query).get("after") or ["0"])[0])
                    except ValueError:
                        return self._send(400, {"error": "after: an integer sequence number is required"})
                    call = functools.partial(actor.output.remote, max(0, after))
                else:
                    return self._send(404, {"error": "not found"})
                try:
                    self._send(200, ray.get(call(), timeout=10))
                except Exception as e:  # noqa: BLE001 - the caller retries on the next tick
                    self._send(503, {"error": f"{type(e).__name__}: {e}"})

            def do_POST(self) -> None:  # noqa: N802
                if not self._authorized():
                    return
                n = int(self.headers.get("Content-Length") or 0)
                if n > 65536:
                    return self._send(413, {"error": "body too large"})
                try:
                    doc = json.loads(self.rfile.read(n) or b"{}")
                    if not isinstance(doc, dict):
                        raise ValueError
                except ValueError:
                    return self._send(400, {"error": "body must be a JSON object"})
                if self.path == "/v1/stop":
                    reason = str(doc.get("reason") or "stop")[:64]
                    ray.get(actor.request_stop.remote(reason), timeout=10)
                    return self._send(200, {"stop_reason": reason})
                if self.path == "/v1/drain":
                    ids = [str(i) for i in doc.get("instance_ids") or []]
                    deadline_s = float(doc.get("deadline_s") or 60.0)
                    return self._send(200, {"drained": drain_instances(ids, deadline_s)})
                if self.path == "/v1/lease":
                    from spotwise.runtime.node.deadman import encode_lease

                    try:
                        raw = encode_lease(float(doc["expires_at"]))
                    except (KeyError, TypeError, ValueError):
                        return self._send(400, {"error": "expires_at: a finite epoch time in seconds is required"})
                    try:
                        store_lease(raw)
                    except Exception as e:  # noqa: BLE001 - the runner retries on its next renewal
                        return self._send(503, {"error": f"{type(e).__name__}: {e}"})
                    return self._send(200, {"expires_at": json.loads(raw)["expires_at"]})
                return self._send(404, {"error": "not found"})

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.token = token
        self._httpd = Server((host, port), Handler)
        self._t = threading.Thread(target=self._httpd.serve_forever, name="spotwise-control", daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def start(self) -> "ControlServer":
        self._t.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def drain_instances(instance_ids: list[str], deadline_s: float) -> dict[str, str]:
    """Drain the Ray nodes of ``instance_ids`` with reason PREEMPTION (what a spot notice does), so
    Ray Train writes the just-in-time checkpoint before the orchestrator ends them (a move between
    markets). ``{instance_id: outcome}``."""
    import time

    import ray

    from spotwise.runtime.node.notices import Notice
    from spotwise.runtime.node.watch import drain

    gcs = ray.get_runtime_context().gcs_address
    notice = Notice(cloud="spotwise", action="move", deadline_ms=int((time.time() + deadline_s) * 1000))
    out = {}
    for iid in instance_ids:
        try:
            ok, msg = drain(gcs, iid, notice)
            out[iid] = ("accepted: " if ok else "rejected: ") + msg
        except Exception as e:  # noqa: BLE001 - reported back; the node is ended at the deadline anyway
            out[iid] = f"error: {type(e).__name__}: {e}"
    return out


class ControlClient:
    """The orchestrator's side of :class:`ControlServer` (stdlib HTTP, short timeouts)."""

    def __init__(self, url: str, token: str, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, doc: dict | None = None) -> dict:
        import urllib.request

        data = json.dumps(doc).encode() if doc is not None else None
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
            return json.loads(r.read())

    def snapshot(self) -> dict:
        return self._call("GET", "/v1/snapshot")

    def output(self, after: int) -> dict:
        """The job's output lines after sequence number ``after`` (:meth:`Control.output`)."""
        return self._call("GET", f"/v1/output?after={int(after)}")

    def request_stop(self, reason: str) -> None:
        self._call("POST", "/v1/stop", {"reason": reason})

    def drain(self, instance_ids: list[str], deadline_s: float) -> dict:
        """Drain these instances' Ray nodes (a just-in-time checkpoint, as on a spot notice)."""
        return self._call("POST", "/v1/drain", {"instance_ids": instance_ids, "deadline_s": deadline_s})

    def renew_lease(self, expires_at: float) -> dict:
        """Tell every node of the run to end itself at ``expires_at`` unless renewed before."""
        return self._call("POST", "/v1/lease", {"expires_at": expires_at})


# -- the driver ----------------------------------------------------------------------------------
def own_cluster_env(environ=os.environ) -> dict | None:
    """The runtime env this driver adds to the job: ``RAY_ADDRESS`` = the GCS address Ray's job
    supervisor gave this driver, for every process the job starts (Ray Train's controller, its
    helper actors, the ranks). Why: a process without it that asks Ray's state API (Ray Train's
    placement-group cleaner does, about its controller) finds the cluster by scanning this
    machine's Ray processes; with two clusters on one machine (two local launches at once, the
    test suite) it printed "Found multiple active Ray instances" and asked the other cluster. None
    when the supervisor set no concrete address (the job's env then stays as submitted)."""
    addr = environ.get("RAY_ADDRESS", "")
    if not addr or addr == "auto" or "://" in addr:
        return None
    return {"env_vars": {"RAY_ADDRESS": addr}}


def preflight(job: TrainJob) -> TrainResult | None:
    """Import a user entrypoint (or Ray Train function) here, on the head, in the job's own environment (its workdir and
    pip requirements), before any worker group starts: an import error then fails the run at
    once instead of after the workers are paid for. None when it imports (or is the built-in)."""
    if not job.config.user_code:
        return None
    from spotwise.runtime.training.usercode import UserCodeError, load_entrypoint

    field, ref = job.config.user_ref
    try:
        load_entrypoint(ref, field=field)
    except UserCodeError as e:
        import importlib.util

        top = ref.split(".")[0].split(":")[0]
        try:
            found = importlib.util.find_spec(top)
            where = f"{top!r} resolves to {getattr(found, 'submodule_search_locations', None) or getattr(found, 'origin', None)}"
        except (ImportError, ValueError):
            where = f"{top!r} does not resolve"
        log.error("preflight: %s\n%s", e, e.tail)
        return TrainResult(steps_completed=0, final_checkpoint=None, model_sha256=None,
                           error=f"preflight on the head (cwd {os.getcwd()}; {where}): {e}\n{e.tail}")
    return None


def wait_until_read(actor, timeout_s: float) -> bool:
    """Wait (at most ``timeout_s``) until the orchestrator has read every line of the job's
    output from the control actor: the endpoint goes with this process. Whether it did."""
    import time

    import ray

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if ray.get(actor.output_unread.remote(), timeout=10) <= 0:
                return True
        except Exception:  # noqa: BLE001 - the actor is gone: nothing left to read
            return False
        time.sleep(0.25)
    log.warning("the orchestrator did not read the job's last output within %.0f s", timeout_s)
    return False


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m spotwise.runtime.node.job SPEC_B64", file=sys.stderr)
        return 2
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        print(f"{TOKEN_ENV} is not set: the control endpoint would be open", file=sys.stderr)
        return 2
    from spotwise.build import build_id

    want, have = os.environ.get(BUILD_ENV, ""), build_id()
    if want and want != have:
        result = TrainResult(steps_completed=0, final_checkpoint=None, model_sha256=None,
                             error=f"the head runs spotwise build {have}, the launcher build {want}: refused "
                                   "(nodes must install the build their launch shipped)")
        print(RESULT_PREFIX + json.dumps(asdict(result)), flush=True)
        return 1
    log.info("spotwise build %s", have)
    job, control_port, control_host, use_gpu = decode_job(args[0])
    import ray

    from spotwise.runtime.training import control as control_mod
    from spotwise.runtime.training.trainer import fit

    ray.init(logging_level=logging.WARNING, log_to_driver=False, runtime_env=own_cluster_env())
    actor = control_mod.create_actor(job.control_run_name or job.run_name, pin_to_head=True)
    host = control_host or ray.util.get_node_ip_address()
    server = ControlServer(actor, host=host, port=control_port, token=token).start()
    log.info("control endpoint on %s:%d", host, server.port)
    from spotwise.runtime.node.drains import DrainReporter

    # the orchestrator hears of a node's notice as soon as its drain is accepted (issue 51)
    drains = DrainReporter(lambda kind, **kw: actor.report_event.remote(kind, **kw)).start()
    from spotwise.runtime.training.joboutput import captured, node_label

    with captured(lambda recs: ray.get(actor.append_output.remote(recs), timeout=10), rank="driver",
                  node=node_label()):
        try:
            result = preflight(job) or fit(job, use_gpu=use_gpu)
        except BaseException as e:  # noqa: BLE001 - reported as the run's error, never lost
            log.error("training failed: %s", e, exc_info=True)
            result = TrainResult(steps_completed=0, final_checkpoint=None, model_sha256=None,
                                 error=f"{type(e).__name__}: {e}")
    drains.stop()
    wait_until_read(actor, OUTPUT_DRAIN_S)
    try:
        print(SNAPSHOT_PREFIX + json.dumps(ray.get(actor.snapshot.remote(), timeout=30)), flush=True)
    except Exception as e:  # noqa: BLE001 - the result below still counts
        log.warning("could not read the final snapshot: %s", e)
    print(RESULT_PREFIX + json.dumps(asdict(result)), flush=True)
    server.stop()
    if result.diverged:
        from spotwise.runtime.training.optim import EXIT_DIVERGED

        return EXIT_DIVERGED
    return 0 if result.error is None else 1


if __name__ == "__main__":
    sys.exit(main())

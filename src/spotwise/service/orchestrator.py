"""One run end to end: plan, launch, train, react to preemptions, bill, stop, tear down, report.

The orchestrator is the only place that ties the packages together. Its loop ticks a few times a
second and, on each tick:

* bills the nodes (per second, at their launch price) and enforces the budget: when spend so far
  plus the next billing minute at the current burn rate would pass the cap, it asks training to
  stop at a checkpoint; if a stop could not finish in time it ends the nodes at once — spend never
  passes the cap;
* handles lost nodes (a spot preemption after its notice, or a node that vanished without one):
  closes their bill, asks the policy where the replacement should run (spot, or on-demand when
  spot keeps failing or the deadline requires it), and launches it; Ray Train restarts the worker
  group on it and resumes from the newest complete checkpoint;
* starts the simulated spot market's clock once training reports its first step.

Whatever happens (success, failure, Ctrl-C, an exception here), ``finally`` ends every node of the
cluster and closes every bill; nodes carry the job and cluster ids, so ``spotwise gc`` can end them
even after a crash of this process.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from spotwise.errors import InputError, Problem, SpotwiseError
from spotwise.paths import home
from spotwise.policies.base import NONE, ON_DEMAND, SPOT, Observation, get_policy
from spotwise.pricing.offer import Market, Offer
from spotwise.provisioner.base import CapacityError, LaunchRequest, Node
from spotwise.service import db
from spotwise.service.ledger import Ledger
from spotwise.taskspec import TaskSpec

log = logging.getLogger("spotwise.orchestrator")

BILLING_INCREMENT_S = 60.0     # the budget rule looks one billing minute ahead
HARD_STOP_MARGIN_S = 5.0       # end nodes at once when less than this much budget time is left


@dataclass(kw_only=True)
class LaunchOptions:
    cloud: str = "local"
    budget_usd: float | None = None
    preempt_at: list[float] | None = None
    no_preempt: bool = False
    storage: str | None = None
    trace: str | None = None
    notice_seconds: float | None = None
    progress: bool = False


@dataclass
class _RunState:
    preemptions: int = 0
    lost_nodes: int = 0
    stop_reason: str | None = None
    hard_stopped: bool = False
    events: list[dict] = field(default_factory=list)


def _storage_uri(spec: TaskSpec, opts: LaunchOptions) -> str:
    uri = opts.storage or spec.training.checkpoint.storage
    if uri.startswith("file://"):
        # ${SPOTWISE_HOME} is spotwise's state directory (SPOTWISE_HOME, else ~/.local/share/spotwise),
        # so a task's default checkpoints follow the state it belongs to.
        raw = uri[len("file://"):].replace("${SPOTWISE_HOME}", str(home()))
        path = Path(os.path.expanduser(raw)).absolute()
        path.mkdir(parents=True, exist_ok=True)
        return f"file://{path}"
    if not uri.startswith(("s3://", "gs://")):
        raise InputError(Problem("--storage", uri, "file://PATH, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX"))
    if not urlparse(uri).netloc:
        raise InputError(Problem("--storage", uri, "a URI with a bucket name, e.g. s3://my-bucket/ckpt"))
    return uri


def _train_config(spec: TaskSpec):
    from spotwise.runtime.api import ModelConfig, TrainConfig

    t = spec.training
    return TrainConfig(
        model=t.entrypoint,
        model_config=ModelConfig(seq_len=t.model.seq_len, d_model=t.model.d_model,
                                 n_layers=t.model.n_layers, n_heads=t.model.n_heads),
        steps=t.steps, batch_size=t.batch_size, lr=t.lr, seed=t.seed, precision=t.precision,
        checkpoint_interval=t.checkpoint.interval_steps, keep_last=t.checkpoint.keep_last)


class Orchestrator:
    def __init__(self, spec: TaskSpec, opts: LaunchOptions) -> None:
        if opts.cloud != "local":
            raise InputError(Problem("--cloud", opts.cloud,
                                     "local (training runs launch on the local cloud; use `spotwise up` "
                                     "to provision a cluster on aws, gcp or azure)"))
        self.spec = spec
        self.opts = opts
        self.budget = opts.budget_usd if opts.budget_usd is not None else spec.budget_usd
        if self.budget is not None and self.budget <= 0:
            raise InputError(Problem("--budget", self.budget, "a positive number of US dollars"))
        self.job_id = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.cluster_id = f"sw{uuid.uuid4().hex[:10]}"
        self.storage = _storage_uri(spec, opts)
        self.policy = get_policy(spec.policy)
        self.state = _RunState()
        self.num_workers = spec.resources.nodes
        self._lost: "queue.Queue[tuple[Node, str]]" = queue.Queue()
        self._nodes: dict[str, Node] = {}
        self._lock = threading.Lock()
        self._step = 0
        self._handled: set[str] = set()
        self._last_step_t = 0.0
        self._last_notice_t = 0.0
        self._resumes_seen = 0
        self._resumes_at_notice = 0
        self._noticed: set[str] = set()
        self.max_replacements = max(10, 5 * self.num_workers)

    # -- planning ------------------------------------------------------------------------------
    def _plan(self, cloud) -> tuple[Offer, list[Offer], list[Offer]]:
        offers = cloud.offers()
        r = self.spec.resources
        head = min((o for o in offers if o.instance_type == "local.head"), key=lambda o: o.usd_per_hour)
        workers = [o for o in offers if o.instance_type != "local.head"
                   and (r.max_price_per_hour is None or o.usd_per_hour <= r.max_price_per_hour)]
        spot = sorted((o for o in workers if o.market is Market.SPOT), key=lambda o: o.usd_per_hour)
        od = sorted((o for o in workers if o.market is Market.ON_DEMAND), key=lambda o: o.usd_per_hour)
        if r.market == "spot":
            od = []
        elif r.market == "on-demand":
            spot = []
        if not spot and not od:
            raise InputError(Problem("resources.max_price_per_hour", r.max_price_per_hour,
                                     f"at least the cheapest local offer "
                                     f"(${min(o.usd_per_hour for o in offers if o.instance_type != 'local.head')}/h)"))
        cheapest = (spot or od)[0]
        minute = (head.usd_per_hour + self.num_workers * cheapest.usd_per_hour) * BILLING_INCREMENT_S / 3600
        if self.budget is not None and self.budget < minute:
            raise SpotwiseError(f"budget ${self.budget:.4f} cannot pay for even one billing minute of the "
                                f"cheapest cluster (${minute:.4f}); nothing was launched")
        return head, spot, od

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> dict:
        from spotwise.provisioner.local import LocalClusterConfig, LocalCloud, WORKER_RESOURCE
        from spotwise.provisioner.local_market import SimulatedMarket
        from spotwise.provisioner.local_metadata import MetadataServer

        cloud = LocalCloud()
        head_offer, spot_offers, od_offers = self._plan(cloud)
        ledger = Ledger(self.job_id)
        self._record_job(status="running")
        metadata = MetadataServer().start()
        cfg = cloud.cluster_config(self.cluster_id)
        cfg.metadata_url = f"http://127.0.0.1:{metadata.port}/i"
        cloud.configure(cfg)

        local = self.spec.local
        preempt_at = [] if self.opts.no_preempt else (self.opts.preempt_at if self.opts.preempt_at is not None
                                                     else list(local.preempt_at))
        trace = None if self.opts.no_preempt else (self.opts.trace or local.trace)
        market = SimulatedMarket(
            cloud=cloud, metadata=metadata, spot_nodes=self._live_spot_workers,
            on_preempted=lambda node, p: self._lost.put((node, "preempted")),
            on_notice=self._on_notice,
            ready=self._training_since_last_notice,
            preempt_at=preempt_at, trace_path=trace, tick_seconds=local.trace_tick_seconds,
            notice_seconds=self.opts.notice_seconds if self.opts.notice_seconds is not None
            else local.notice_seconds,
            zone=(spot_offers[0].zone if spot_offers else "local-a"))
        result = None
        status, message = "failed", None
        snapshot: dict = {}
        started = time.time()
        try:
            self._launch(cloud, ledger, head_offer, role="head")
            for _ in range(self.num_workers):
                self._launch_worker(cloud, ledger, spot_offers, od_offers, elapsed_h=0.0)
            os.environ.update(cfg.driver_env())
            import ray

            from spotwise.runtime import control as control_mod
            from spotwise.runtime.api import TrainJob
            from spotwise.runtime.trainer import fit

            ray.init(address=cloud.head_address(self.cluster_id), namespace=control_mod.NAMESPACE,
                     logging_level=logging.ERROR, log_to_driver=False)
            control = control_mod.create_actor(self.job_id, pin_to_head=True)
            job = TrainJob(run_name=self.job_id, storage_uri=self.storage, config=_train_config(self.spec),
                           num_workers=self.num_workers,
                           resources_per_worker={"CPU": 1, WORKER_RESOURCE: 1},
                           control_run_name=self.job_id, env=self._worker_env())
            box: dict = {}
            fit_thread = threading.Thread(target=lambda: box.update(result=fit(job)), name="fit", daemon=True)
            fit_thread.start()
            last_bill = 0.0
            while fit_thread.is_alive():
                time.sleep(0.25)
                now = time.time()
                try:
                    snapshot = ray.get(control.snapshot.remote(), timeout=10)
                except Exception:  # the control actor lives on the head; keep going on a hiccup
                    pass
                step = int(snapshot.get("step") or 0)
                if snapshot.get("step_time"):
                    self._last_step_t = max(self._last_step_t, float(snapshot["step_time"]))
                self._step = step
                self._resumes_seen = len(snapshot.get("resumes", []))
                if snapshot.get("started_at") and market._thread is None:
                    market.start(snapshot["started_at"])
                if now - last_bill >= 1.0:
                    ledger.bill(now)
                    last_bill = now
                if self._enforce_budget(ledger, control, cloud, now):
                    break
                self._handle_lost(cloud, ledger, spot_offers, od_offers, started)
                self._detect_vanished(cloud)
            fit_thread.join(timeout=30 if not self.state.hard_stopped else 1)
            result = box.get("result")
            try:
                snapshot = ray.get(control.snapshot.remote(), timeout=10)
            except Exception:
                pass
        except KeyboardInterrupt:
            status, message = "cancelled", "interrupted by the user"
        except SpotwiseError as e:
            status, message = "failed", str(e)
        finally:
            market.stop()
            try:
                import ray

                if ray.is_initialized():
                    ray.shutdown()
            except Exception:
                pass
            live = cloud.list_nodes(self.cluster_id) + list(self._nodes.values())
            cloud.terminate(live)
            for n in live:
                ledger.close(n.instance_id, reason="teardown")
            ledger.close_all()
            cloud.reap_cluster(self.cluster_id)
            metadata.stop()
        if status != "cancelled" and message is None:
            status, message = self._outcome(result)
        report = self._report(status, message, result, snapshot, ledger, market)
        self._record_job(status=status, report=report)
        return report

    # -- pieces of the loop --------------------------------------------------------------------
    def _worker_env(self) -> dict[str, str]:
        env = {}
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                  "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_SESSION_TOKEN"):
            if os.environ.get(k):
                env[k] = os.environ[k]
        return env

    def _launch(self, cloud, ledger: Ledger, offer: Offer, *, role: str) -> Node:
        [node] = cloud.launch(LaunchRequest(cluster_id=self.cluster_id, job_id=self.job_id, offer=offer,
                                            role=role))
        with self._lock:
            self._nodes[node.instance_id] = node
        ledger.open(node)
        self._event("launched", instance_id=node.instance_id, role=role, market=node.market,
                    usd_per_hour=node.usd_per_hour, zone=node.zone)
        return node

    def _launch_worker(self, cloud, ledger: Ledger, spot: list[Offer], od: list[Offer], *, elapsed_h: float) -> Node:
        decision = self.policy.decide(self._observation(elapsed_h))
        candidates = (spot + od) if decision.market in (SPOT, NONE) and spot else od or spot
        last_error: Exception | None = None
        for offer in candidates:
            try:
                return self._launch(cloud, ledger, offer, role="worker")
            except CapacityError as e:   # next offer (next zone, then on-demand)
                last_error = e
                self._event("capacity_error", offer=offer.key, error=str(e))
        raise SpotwiseError(f"no capacity for a worker node: {last_error}")

    def _observation(self, elapsed_h: float) -> Observation:
        """What the policy knows: work is measured in hours at the pace training has shown so far."""
        deadline_h = self.spec.deadline_hours or float("inf")
        frac = min(1.0, self._step / max(1, self.spec.training.steps))
        task_h = elapsed_h / frac if frac > 0 and elapsed_h > 0 else 0.0
        return Observation(elapsed_h=elapsed_h, deadline_h=deadline_h, task_h=task_h,
                           work_done_h=frac * task_h, restart_h=0.0, tick_h=1 / 3600,
                           preemptions=self.state.preemptions, budget_usd=self.budget)

    def _on_notice(self, node: Node, p) -> None:
        self._noticed.add(node.instance_id)
        self._last_notice_t = time.time()
        self._resumes_at_notice = self._resumes_seen
        self._event("spot_notice", instance_id=node.instance_id, kill_at=round(p.kill_at, 3))

    def _training_since_last_notice(self) -> bool:
        return self._last_step_t > self._last_notice_t + 1e-6 and self._resumed_since_notice()

    def _resumed_since_notice(self) -> bool:
        # after a notice, training counts as running again once a resume has been reported
        return self._last_notice_t == 0.0 or self._resumes_seen > self._resumes_at_notice

    def _live_spot_workers(self) -> list[Node]:
        with self._lock:
            nodes = [n for n in self._nodes.values() if n.role == "worker" and n.market == "spot"]
        return sorted(nodes, key=lambda n: n.launched_at or 0)

    def _handle_lost(self, cloud, ledger: Ledger, spot, od, started: float) -> None:
        while True:
            try:
                node, why = self._lost.get_nowait()
            except queue.Empty:
                return
            with self._lock:
                self._nodes.pop(node.instance_id, None)
            ledger.close(node.instance_id, reason=why)
            cloud.terminate([node])    # whatever is left of it (its watcher, stray workers)
            if node.instance_id in self._handled:
                continue    # reported twice (vanished at its notice, then by the market's kill)
            self._handled.add(node.instance_id)
            if why == "preempted":
                self.state.preemptions += 1
            self.state.lost_nodes += 1
            if self.state.lost_nodes > self.max_replacements:
                raise SpotwiseError(f"{self.state.lost_nodes} worker nodes were lost; giving up after "
                                    f"{self.max_replacements} replacements (see the node logs under "
                                    f"$SPOTWISE_HOME/local/logs)")
            self._event(why, instance_id=node.instance_id)
            if self.state.stop_reason is None:
                replacement = self._launch_worker(cloud, ledger, spot, od,
                                                  elapsed_h=(time.time() - started) / 3600)
                self._event("replaced", lost=node.instance_id, by=replacement.instance_id,
                            market=replacement.market)

    def _detect_vanished(self, cloud) -> None:
        """A node that died without a notice (crash, reclaim with no warning) is a lost node too."""
        alive = {n.instance_id for n in cloud.list_nodes(self.cluster_id)}
        with self._lock:
            gone = [n for iid, n in self._nodes.items() if iid not in alive]
        for n in gone:
            if n.role == "head":
                raise SpotwiseError("the Ray head node was lost; the run is resumable from its last checkpoint")
            # A node that went away after its spot notice was preempted, not lost without warning.
            self._lost.put((n, "preempted" if n.instance_id in self._noticed else "lost"))
            with self._lock:
                self._nodes.pop(n.instance_id, None)

    def _enforce_budget(self, ledger: Ledger, control, cloud, now: float) -> bool:
        """Stop gracefully a billing minute ahead of the cap; end everything at once at the margin."""
        if self.budget is None:
            return False
        spend = ledger.spend(now)
        rate = ledger.rate_usd_per_hour()
        if self.state.stop_reason is None and spend + rate * BILLING_INCREMENT_S / 3600 > self.budget:
            self.state.stop_reason = "budget"
            control.request_stop.remote("budget")
            self._event("budget_stop_requested", spend_usd=round(spend, 6), budget_usd=self.budget)
        if spend + rate * HARD_STOP_MARGIN_S / 3600 >= self.budget:
            self.state.stop_reason = "budget"
            self.state.hard_stopped = True
            self._event("budget_hard_stop", spend_usd=round(spend, 6), budget_usd=self.budget)
            with self._lock:
                nodes = list(self._nodes.values())
            cloud.terminate(nodes)
            for n in nodes:
                ledger.close(n.instance_id, reason="budget")
            return True
        return False

    def _outcome(self, result) -> tuple[str, str | None]:
        steps = self.spec.training.steps
        if self.state.stop_reason == "budget":
            return "budget_exhausted", "stopped before the next billing minute would pass the budget; resumable from the final checkpoint"
        if result is None:
            return "failed", "training did not return a result"
        if result.error:
            return "failed", result.error
        if result.stopped:
            return ("budget_exhausted" if result.stopped == "budget" else "failed"), f"stopped: {result.stopped}"
        if result.steps_completed >= steps:
            return "succeeded", None
        return "failed", f"training ended after {result.steps_completed}/{steps} steps"

    def _report(self, status, message, result, snapshot, ledger: Ledger, market) -> dict:
        hours = ledger.hours_by_market()
        resumes = snapshot.get("resumes", []) if snapshot else []
        lost_steps = sum(max(0, r["max_step_before"] - r["from_step"]) for r in resumes)
        with db.session() as s:
            cost = db.job_spend(s, self.job_id)
        steps_completed = result.steps_completed if result else (snapshot.get("step", 0) if snapshot else 0)
        final_ckpt = result.final_checkpoint if result else None
        if not final_ckpt and snapshot and snapshot.get("checkpoints"):
            final_ckpt = snapshot["checkpoints"][-1]["uri"]
        return {
            "job_id": self.job_id,
            "cluster_id": self.cluster_id,
            "status": status,
            "message": message,
            "steps_total": self.spec.training.steps,
            "steps_completed": steps_completed,
            "preemptions": self.state.preemptions,
            "lost_nodes": self.state.lost_nodes,
            "resumes": len(resumes),
            "lost_steps": lost_steps,
            "checkpoint_interval": self.spec.training.checkpoint.interval_steps,
            "cost_usd": round(cost, 6),
            "budget_usd": self.budget,
            "hours_by_market": {"spot": round(hours.get("spot", 0.0), 6),
                                "on_demand": round(hours.get("on-demand", 0.0), 6)},
            "final_checkpoint": final_ckpt,
            "model_sha256": result.model_sha256 if result else None,
            "precision": result.precision if result else None,
            "storage": self.storage,
            "checkpoints": [{"step": c["step"], "kind": c["kind"]} for c in (snapshot or {}).get("checkpoints", [])],
            "resume_points": [{"from_step": r["from_step"], "max_step_before": r["max_step_before"]} for r in resumes],
            "events": self.state.events,
        }

    # -- persistence ---------------------------------------------------------------------------
    def _event(self, kind: str, **detail) -> None:
        ev = {"t": round(time.time(), 3), "event": kind, **detail}
        self.state.events.append(ev)
        log.info("%s %s", kind, detail)
        if self.opts.progress:
            import sys

            print(f"[spotwise] {kind} {detail}", file=sys.stderr, flush=True)
        try:
            with db.session() as s:
                s.add(db.Event(job_id=self.job_id, t=ev["t"], kind=kind, detail=detail))
                s.commit()
        except Exception:
            log.exception("could not record event %s", kind)

    def _record_job(self, *, status: str, report: dict | None = None) -> None:
        with db.session() as s:
            job = s.get(db.Job, self.job_id)
            if job is None:
                job = db.Job(id=self.job_id, name=self.spec.name, status=status, cloud=self.opts.cloud,
                             cluster_id=self.cluster_id, spec=self.spec.model_dump(mode="json"),
                             budget_usd=self.budget, deadline_hours=self.spec.deadline_hours,
                             created_at=time.time(), started_at=time.time(), owner_pid=os.getpid())
                s.add(job)
            job.status = status
            if report is not None:
                job.finished_at = time.time()
                job.steps_completed = report["steps_completed"] or 0
                job.preemptions = report["preemptions"]
                job.resumes = report["resumes"]
                job.final_checkpoint = report["final_checkpoint"]
                job.model_sha256 = report["model_sha256"]
                job.message = report["message"]
                job.report = report
            s.commit()

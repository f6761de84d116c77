"""One run end to end, on any cloud: plan, provision, submit, monitor, tear down, report.

The orchestrator talks to clouds only through the provisioner's :class:`~spotwise.provisioner.base.Cloud`
interface and to training only through Ray's Jobs API and the job driver's control endpoint
(:mod:`spotwise.runtime.job`), so the same loop drives the local cloud and AWS (GCP and Azure
through the same interface):

1. **plan** (:mod:`spotwise.engine.planner`): every offer that fits, ranked by expected total cost;
2. **provision**: the cluster's on-demand head, then the workers, walking the plan on capacity
   errors (:class:`~spotwise.provisioner.failover.Failover`);
3. **submit**: ``python -m spotwise.runtime.job`` to the head through the Jobs API;
4. **monitor**, a few times a second (:meth:`Orchestrator._tick`): read progress from the control
   endpoint; bill every node per second at its launch price; stop at a checkpoint a billing
   minute before the budget would be passed (end everything at once at the margin); notice nodes
   that went away (preempted or lost), close their bills and replace only them where the policy
   says; ask the policy, every ``policy_interval_s``, whether the run should move between spot and
   on-demand (a move launches the new nodes, drains the old ones through the head — the same
   just-in-time checkpoint as a spot notice — and ends them);
5. **teardown** (``finally``): end every node of the cluster, close every bill, delete what the
   cluster shared (security group, leftover interfaces, local processes).

Nodes carry the job and cluster ids, so ``spotwise gc`` can end them even after a crash here.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlparse

from spotwise.errors import InputError, Problem, SpotwiseError
from spotwise.paths import home
from spotwise.policies.base import NONE, ON_DEMAND, SPOT, Observation, get_policy
from spotwise.provisioner.base import Cloud, Node, cloud_class, known_clouds
from spotwise.engine.joins import POLL_S as JOIN_POLL_S
from spotwise.engine.joins import JoinWatch, alive_instances
from spotwise.engine.ledger import Ledger
from spotwise.engine.driver import TERMINAL, Control, Driver, control_client, jobs_client
from spotwise.engine.journal import Journal, JobRow, outcome, report
from spotwise.engine.planner import Plan, make_plan
from spotwise.engine.purse import Lease, Money, Purse, StopLatch, check_budget_floor
from spotwise.engine.market_watch import (MarketWatch, history_key, show_history, show_recorded_history,
                                           site_of)
from spotwise.engine.spot_log import SiteKey, SpotLog
from spotwise.engine.steering import (Command, MarketMove, Migrate, NoOp, Steering, TopUp, View, Wait,
                                      cluster_prices, transfer_read_usd)
from spotwise.taskspec import TaskSpec

log = logging.getLogger("spotwise.orchestrator")

DRAIN_DEADLINE_S = 60.0        # a market move's old nodes get this long for their checkpoint


@dataclass(kw_only=True)
class LaunchOptions:
    cloud: str | None = None            # comma-separated clouds (overrides the task's); None: the task's, else local
    budget_usd: float | None = None
    preempt_at: list[float] | None = None
    no_preempt: bool = False
    storage: str | None = None
    trace: str | None = None
    notice_seconds: float | None = None
    progress: bool = False
    tick_s: float = 0.25
    policy_interval_s: float = 5.0
    boot_timeout_s: float = 900.0       # submission -> first training step, or the run fails
    join_timeout_s: float = 600.0       # a worker not ALIVE in Ray this long (since launch or last seen) is replaced
    spot_probe_s: float = 60.0          # on on-demand with spot last seen unobtainable: ask for one spot worker this often


def _runner_lease(job_id: str, budget_usd: float | None) -> Lease:
    from spotwise.engine.lease import RunnerLease

    return RunnerLease(job_id, budget_usd=budget_usd)


@dataclass(kw_only=True)
class Factories:
    """How the orchestrator makes what reaches outside this process; tests replace them."""

    lease: Callable[[str, float | None], Lease] = _runner_lease   # (job id, budget) -> the runner's lease
    jobs_client: Callable[[str, Mapping[str, str]], Any] = jobs_client   # (dashboard URL, headers) -> Jobs API client
    control: Callable[[str, str], Control] = control_client             # (control URL, token) -> control endpoint


def parse_clouds(value: str | None, spec: TaskSpec) -> list[str]:
    raw = [c.strip() for c in value.split(",") if c.strip()] if value else list(spec.resources.clouds)
    clouds = raw or ["local"]
    bad = [c for c in clouds if c not in known_clouds()]
    if bad:
        raise InputError(Problem("--cloud", ",".join(bad), ", ".join(known_clouds())))
    return list(dict.fromkeys(clouds))


def storage_uri(spec: TaskSpec, opts: LaunchOptions, clouds: list[str]) -> str:
    """The run's checkpoint URI; ``file://`` only when every node runs on this machine."""
    uri = opts.storage or spec.training.checkpoint.storage
    field_name = "--storage" if opts.storage else "training.checkpoint.storage"
    if uri.startswith("file://"):
        remote = [c for c in clouds if not cloud_class(c).on_this_machine]
        if remote:
            raise InputError(Problem(field_name, uri, f"an s3:// URI for a run on {', '.join(remote)}: nodes "
                                                      "on a cloud cannot share this machine's disk"))
        raw = uri[len("file://"):].replace("${SPOTWISE_HOME}", str(home()))
        path = Path(os.path.expanduser(raw)).absolute()
        path.mkdir(parents=True, exist_ok=True)
        return f"file://{path}"
    if not uri.startswith("s3://"):
        raise InputError(Problem(field_name, uri, "file://PATH or s3://BUCKET/PREFIX (GCS: through its "
                                                  "S3-compatible endpoint, see docs/provisioner.md)"))
    if not urlparse(uri).netloc:
        raise InputError(Problem(field_name, uri, "a URI with a bucket name, e.g. s3://my-bucket/ckpt"))
    return uri


# kept for callers of the old name
def _storage_uri(spec: TaskSpec, opts: LaunchOptions) -> str:
    return storage_uri(spec, opts, parse_clouds(opts.cloud, spec))


class Orchestrator:
    def __init__(self, spec: TaskSpec, opts: LaunchOptions, *, job_id: str | None = None,
                 cluster_id: str | None = None, factories: Factories | None = None) -> None:
        make = factories or Factories()
        self.spec = spec
        self.opts = opts
        self.clouds = parse_clouds(opts.cloud, spec)
        self.budget = opts.budget_usd if opts.budget_usd is not None else spec.budget_usd
        if self.budget is not None and not (self.budget > 0 and math.isfinite(self.budget)):
            raise InputError(Problem("--budget", self.budget, "a positive, finite number of US dollars"))
        if not (opts.join_timeout_s > 0 and math.isfinite(opts.join_timeout_s)):
            raise InputError(Problem("join_timeout_s", opts.join_timeout_s, "a positive, finite number of seconds"))
        if not (opts.spot_probe_s > 0 and math.isfinite(opts.spot_probe_s)):
            raise InputError(Problem("spot_probe_s", opts.spot_probe_s, "a positive, finite number of seconds"))
        self.job_id = job_id or f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.cluster_id = cluster_id or f"sw{uuid.uuid4().hex[:10]}"
        self.storage = storage_uri(spec, opts, self.clouds)
        policy = get_policy(spec.policy_name)
        self.journal = Journal(self.job_id, progress=opts.progress)
        self.num_workers = spec.resources.nodes
        self.max_replacements = max(10, 5 * self.num_workers)
        self.plan: Plan = make_plan(spec, self.clouds, budget=self.budget, storage=self.storage)
        # the zone's history: the task's file, else what earlier runs recorded at the plan's site
        spot_log = SpotLog(self.job_id, opts.policy_interval_s)
        self.history: dict | None = ({"source": "file", "path": spec.spot_history}
                                     if show_history(policy, spec) else
                                     show_recorded_history(policy, history_key(self.plan),
                                                           hours=spec.spot_history_hours,
                                                           tick_s=opts.policy_interval_s))
        self.watch = MarketWatch(offers={o.key: o for o in self.plan.offers}, log=spot_log)
        self.steering = Steering(policy, spec.policy_name,
                                 transfer_read_usd=lambda site: transfer_read_usd(self.storage, spec, site))
        self._sites = list(dict.fromkeys(site_of(o) for o in self.plan.offers))
        self._prepared: set[tuple[str, str]] = set()
        best = self.plan.chosen
        check_budget_floor(self.budget, best.head_usd_per_hour + self.num_workers * best.offer.usd_per_hour)
        self.stop = StopLatch()               # why the run is stopping: the first reason wins
        self.purse = Purse(Ledger(self.job_id), self.budget, lease=lambda: make.lease(self.job_id, self.budget),
                           event=self.journal.event)
        self.row = JobRow(job_id=self.job_id, spec=spec, clouds=self.clouds, cluster_id=self.cluster_id,
                          budget_usd=self.budget)
        self._clouds: dict[str, Cloud] = {}
        self._nodes: dict[str, Node] = {}
        self._ending: set[str] = set()       # instance ids we are terminating ourselves
        self._draining: dict[str, float] = {}  # instance id -> drain deadline (a market move)
        self._probing: set[str] = set()        # a spot probe's instance, while the policy is asked
        self._head: Node | None = None
        self._joins = JoinWatch(timeout_s=opts.join_timeout_s)   # workers whose Ray never joined (or left)
        self._dashboard: tuple[str, dict[str, str]] | None = None   # the head's dashboard URL and headers
        self.driver = Driver(job_id=self.job_id, storage=self.storage, training=spec.training,
                             num_workers=self.num_workers, boot_timeout_s=opts.boot_timeout_s,
                             event=self.journal.event, jobs_client=make.jobs_client, control=make.control)

    # -- plan ---------------------------------------------------------------------------------
    def cloud(self, name: str) -> Cloud:
        if name not in self._clouds:
            self._clouds[name] = cloud_class(name).for_task(self.spec, self.opts)
        return self._clouds[name]

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> dict:
        """The whole run. Whatever happens after the job row is written — an error of any kind,
        Ctrl-C, SIGTERM — the cluster is torn down and the job ends in a final status; teardown
        itself defers SIGINT/SIGTERM (:mod:`spotwise.engine.signals`). The runner's lease
        (:mod:`spotwise.engine.lease`) is held from the first write to the last."""
        from spotwise.provisioner.failover import Failover
        from spotwise.engine import signals

        result = None
        status, message, crash = "failed", None, None
        with signals.sigterm_raises():
            try:
                self.row.record("running")
                self.purse.hold()            # claimed and renewing before the first node launches
                self._failover = Failover(cloud_factory=self.cloud)
                try:
                    self._provision()
                    self._submit()
                    self.purse.attach(self.driver.lease_push())   # the nodes hear the lease at once
                    result = self._monitor()
                except signals.Terminated:
                    raise
                except KeyboardInterrupt:
                    status, message = "cancelled", "interrupted by the user"
                    self.journal.event("cancel_requested")
                    result = self._stop_gracefully("cancel")
            except signals.Terminated as e:
                status, message = "cancelled", f"{e}: ended without a final checkpoint"
            except KeyboardInterrupt:
                status, message = "cancelled", "interrupted by the user (twice): ended without a final checkpoint"
            except SpotwiseError as e:
                status, message = "failed", str(e)
            except Exception as e:  # noqa: BLE001 - not ours to expect, but the job must not stay running
                status, message, crash = "failed", f"{type(e).__name__}: {e}", e
            finally:
                with signals.deferred() as late:
                    report = self._finish(status, message, result)
                    if late:
                        self.journal.event("signals_deferred_during_teardown", signals=late)
        if crash is not None:
            raise crash
        return report

    def _finish(self, status: str, message: str | None, result) -> dict:
        """Teardown, then the final status and report (every step tried even if one fails)."""
        try:
            self._teardown()
        except Exception as e:  # noqa: BLE001 - gc and the nodes' dead man's switch end what is left
            log.exception("teardown of %s failed", self.cluster_id)
            status, message = "failed", f"{message + '; ' if message else ''}teardown failed: {e}"
        self.watch.close()                # logs its own write errors: never fails the run
        if status != "cancelled" and message is None:
            status, message = outcome(result, stop_reason=self.stop.reason, steps=self.spec.training.steps)
        try:
            final = self._report(status, message, result)
        except Exception as e:  # noqa: BLE001 - a report bug must not keep the job from its final status
            log.exception("could not build the report")
            final = {"job_id": self.job_id, "cluster_id": self.cluster_id, "status": status,
                     "message": f"{message}; report failed: {e}", "steps_completed": 0, "preemptions": 0,
                     "resumes": 0, "final_checkpoint": None, "model_sha256": None,
                     "cloud": ",".join(self.clouds), "events": self.journal.events}
        self.purse.release()              # before the final status: a renewal must not race it
        self.row.record(status, final)
        return final

    # -- provision ----------------------------------------------------------------------------
    def _provision(self, prefer: tuple[str, str] | None = None) -> None:
        """The head, then the workers, walking the plan (every attempt goes into the report).

        The walk crosses regions and clouds in plan order: when every offer of the first site
        answers a capacity error, the cluster comes up on the next site of the plan (another region,
        or another cloud when the task allows several). ``prefer`` = (site, market) puts that
        site's offers of that market first (a migration's target).
        """
        from spotwise.provisioner.failover import Attempt

        offers = self.plan.offers
        if prefer is not None:
            first = [o for o in offers if (site_of(o), o.market.value) == prefer]
            offers = first + [o for o in offers if o not in first]
        else:
            self.journal.event("plan", chosen=self.plan.chosen.offer.key, reason=self.plan.reason)
        attempts: list[Attempt] = []
        try:
            cluster = self._failover.provision(offers, cluster_id=self.cluster_id, job_id=self.job_id,
                                               nodes=self.num_workers, dedicated_head=True, attempts=attempts,
                                               prepare=self._prepare_site)
        finally:
            self._record_attempts(attempts)
        for n in cluster.nodes:
            self._adopt(n)
        self._head = cluster.head

    def _prepare_site(self, cloud_name: str, region: str) -> None:
        """What a cluster needs in a site before its first node (once per site and run)."""
        if (cloud_name, region) not in self._prepared:
            self.cloud(cloud_name).prepare_cluster(self.cluster_id, self.job_id, region)
            self._prepared.add((cloud_name, region))

    def _record_attempts(self, attempts) -> None:
        self.journal.saw_attempts(attempts)
        self.watch.saw_attempts(attempts, time.time())

    def _adopt(self, node: Node) -> None:
        self._nodes[node.instance_id] = node
        if node.role == "worker" and node.market == SPOT:
            self.watch.saw_spot_worker()
        self.purse.ledger.open(node)
        self.journal.event("launched", instance_id=node.instance_id, role=node.role, market=node.market,
                    usd_per_hour=node.usd_per_hour, zone=node.zone, cloud=node.cloud,
                    price_source=node.extra.get("price_source"))

    # -- submit -------------------------------------------------------------------------------
    def _submit(self) -> None:
        """Training to the head (:meth:`Driver.submit`); the join watch asks the same dashboard."""
        head = self._head
        assert head is not None
        cloud = self.cloud(head.cloud)
        ep = cloud.endpoint(self.cluster_id, head)
        self.driver.submit(ep, notice_window_s=cloud.notice_window_s)
        self._dashboard = (ep.dashboard_url, dict(ep.headers))

    # -- monitor ------------------------------------------------------------------------------
    def _monitor(self):
        last_nodes = last_policy = last_joins = 0.0
        while True:
            time.sleep(self.opts.tick_s)
            now = time.time()
            self._read_progress()
            if self._hard_stop(self.purse.tick(now, self.stop, self.driver.request_stop)):
                return self.driver.result(hard_stopped=True)   # money first: nothing below launches past the cap
            if now - last_nodes >= 1.0:
                self._check_nodes()
                self._finish_drains(now)
                if now - last_joins >= JOIN_POLL_S:
                    self._check_joins(now)
                    last_joins = now
                if self.stop.reason is None:
                    self.top_up(now)
                last_nodes = now
            if now - last_policy >= self.opts.policy_interval_s:
                self._record_spot(now)
                if self.stop.reason is None:
                    self.consult_policy(now)
                last_policy = now
            self.driver.check_boot(now)
            if self.driver.status_poll.due(now) and self.driver.poll_status() in TERMINAL:
                self._read_progress()
                return self.driver.result(hard_stopped=self.purse.hard_stopped)

    def _read_progress(self) -> None:
        """Training's progress (:meth:`Driver.poll`), and what the head's cloud saw in it (the local
        cloud's simulated market: its notices) as events."""
        snap = self.driver.poll()
        if snap is None:
            return
        for ev in self.cloud(self._head.cloud).observe(self.cluster_id, snap) if self._head else []:
            kind = ev.pop("event")
            self.journal.event(kind, **ev)

    def _stop_gracefully(self, reason: str, wait_s: float = 180.0):
        """Ask training to stop at a checkpoint and wait for the job to end (billing on)."""
        if self._head is None or self.driver.control is None:
            return None
        self.stop.request(reason)
        try:
            self.driver.request_stop(reason)
        except Exception:  # noqa: BLE001 - the driver is gone or not up: there is nothing to stop gracefully
            return None
        deadline = time.time() + wait_s
        while time.time() < deadline:
            time.sleep(0.5)
            self.purse.ledger.bill()
            if self._hard_stop(self.purse.check(time.time(), self.stop, self.driver.request_stop)):
                break
            if self.driver.status() in TERMINAL:
                break
        self._read_progress()
        return self.driver.result(wait_s=10, hard_stopped=self.purse.hard_stopped)

    def _check_nodes(self) -> None:
        """Nodes that went away without us ending them: preempted (spot, reclaimed) or lost."""
        for n in self._gone_nodes():
            self._nodes.pop(n.instance_id, None)
            self.purse.ledger.close(n.instance_id, reason="ended" if n.instance_id in self._ending else "gone")
            if n.instance_id not in self._ending:
                self._node_lost(n)

    def _gone_nodes(self) -> list[Node]:
        """Our nodes their cloud no longer lists for the cluster."""
        by_cloud: dict[str, list[Node]] = {}
        for n in self._nodes.values():
            by_cloud.setdefault(n.cloud, []).append(n)
        gone: list[Node] = []
        for name, nodes in by_cloud.items():
            alive = {n.instance_id for n in self.cloud(name).list_nodes(self.cluster_id)}
            gone += [n for n in nodes if n.instance_id not in alive]
        return gone

    def _node_lost(self, n: Node) -> None:
        """A node we did not end is gone: count it (preempted or lost), end what is left of it, and
        give up when the head went or too many workers did (a worker is replaced by ``_top_up``)."""
        if n.role == "head":
            raise SpotwiseError("the Ray head node was lost; the run is resumable from its last checkpoint")
        preempted = self.cloud(n.cloud).was_preempted(n)
        why = "preempted" if preempted else "lost"
        if preempted:
            self.journal.preemptions += 1
            if n.market == SPOT:
                self.watch.saw_spot_lost(n, time.time(), spot_left=any(
                    w.market == SPOT for w in self._workers() if w.instance_id != n.instance_id))
        self.journal.lost_nodes += 1
        self.driver.lost(time.time())
        self.journal.event(why, instance_id=n.instance_id, market=n.market, zone=n.zone)
        try:
            self.cloud(n.cloud).terminate([n])    # whatever is left of it
        except SpotwiseError as e:
            log.warning("could not end what is left of %s: %s", n.instance_id, e)
        self._check_replacements()

    def _check_replacements(self) -> None:
        """Give up once more workers were lost (preempted, gone, or never in Ray) than ``max_replacements``."""
        if self.journal.lost_nodes > self.max_replacements:
            raise SpotwiseError(f"{self.journal.lost_nodes} worker nodes were lost; giving up after "
                                f"{self.max_replacements} replacements")

    def _check_joins(self, now: float) -> None:
        """End the workers whose Ray has not been ALIVE in the cluster for ``join_timeout_s``
        (:mod:`spotwise.engine.joins`): the cloud still lists them, so nothing else would replace
        them. Counted as lost (``max_replacements`` bounds them too); ``_top_up`` replaces them."""
        if self._dashboard is None:
            return
        self._joins.seen(alive_instances(*self._dashboard), now)
        for o in self._joins.overdue(list(self._nodes.values()), now, exclude={*self._draining, *self._ending}):
            n = o.node
            try:
                self._end_nodes([n], reason="not joined")
            except SpotwiseError as e:    # still ours and still overdue: tried again at the next poll
                self._ending.discard(n.instance_id)
                log.warning("could not end %s, whose Ray is not in the cluster: %s", n.instance_id, e)
                continue
            self.journal.lost_nodes += 1
            self.driver.lost(now)
            self.journal.event("not_joined", instance_id=n.instance_id, market=n.market, zone=n.zone,
                        unseen_s=round(o.unseen_s, 1), seen=o.seen, join_timeout_s=self.opts.join_timeout_s)
            self._check_replacements()

    def _workers(self) -> list[Node]:
        """The run's workers: not being drained, and not a spot probe the policy has not taken yet."""
        return [n for n in self._nodes.values() if n.role == "worker" and n.instance_id not in self._draining
                and n.instance_id not in self._probing]

    def _current_market(self) -> str:
        ws = self._workers()
        if not ws:
            return NONE
        return SPOT if sum(w.market == "spot" for w in ws) * 2 >= len(ws) else ON_DEMAND

    def top_up(self, now: float) -> None:
        """Replace missing workers where the policy says now (:meth:`Steering.replace`): a
        replacement, a wait (training waits for them; asked again next time) or a migration."""
        self._act(self.steering.replace(self._view(now)), now)

    def _act(self, cmd: Command, now: float, *, probe: Node | None = None) -> None:
        """Carry out one of :class:`Steering`'s commands."""
        if isinstance(cmd, Migrate):
            self._migrate(cmd, now)
        elif isinstance(cmd, Wait):
            if cmd.announce:
                self.journal.event("waiting", missing=cmd.missing, reason=cmd.reason)
        elif isinstance(cmd, TopUp):
            for n in self._launch_workers(cmd.count, cmd.market, why=cmd.reason):
                self.steering.waiting = False
                self.journal.event("replaced", by=n.instance_id, market=n.market, reason=cmd.reason)
        elif isinstance(cmd, MarketMove):
            self._move(cmd, now, probe)
        else:
            assert isinstance(cmd, NoOp)

    def _launch_workers(self, count: int, market: str, *, why: str) -> list[Node]:
        """Up to ``count`` workers on ``market`` next to the head (the failover tries the plan's
        offers of that market in order); never the other market: which market is the policy's call."""
        from spotwise.provisioner.failover import Attempt

        assert self._head is not None
        offers = [o for o in self.plan.offers if o.market.value == market]
        attempts: list[Attempt] = []
        got = self._failover.add_workers(offers, head=self._head, cluster_id=self.cluster_id,
                                         job_id=self.job_id, count=count, attempts=attempts)
        self._record_attempts(attempts)
        for n in got:
            self._adopt(n)
        if len(got) < count:
            self.journal.event("no_capacity", wanted=count, got=len(got), market=market, why=why)
        return got

    # -- the policy, every few seconds ----------------------------------------------------------
    def _view(self, now: float) -> View:
        """The run as :class:`Steering` sees it (blocked sites as of ``now``)."""
        here = self._current_site()
        return View(obs=self._observation(), here=here, sites=tuple(self._sites),
                    missing=self.num_workers - len(self._workers()), current=self._current_market(),
                    worker_markets=tuple(w.market for w in self._workers()), fixed_market=self._fixed_market(),
                    blocked=self.watch.blocked_pairs({*self._sites, here}, now),
                    spot_refused=self.watch.spot_refused(now), stopping=self.stop.reason is not None,
                    draining=bool(self._draining), migrations=len(self.journal.migrations),
                    cluster_up=self._head is not None)

    def _observation(self) -> Observation:
        """What the policy knows: work measured in hours at the pace training has shown so far."""
        elapsed_h = (time.time() - self.driver.started) / 3600 if self.driver.started else 0.0
        deadline_h = self.spec.deadline_hours or float("inf")
        step = self.driver.step
        frac = min(1.0, step / max(1, self.spec.training.steps))
        # the pace is training's own (since its first step), not the cluster's boot time
        t0 = self.driver.snapshot.get("started_at")
        train_h = (time.time() - float(t0)) / 3600 if t0 else 0.0
        task_h = train_h / frac if frac > 0 and train_h > 0 else self.plan.chosen.expected_hours
        restart_s = self.driver.restart_s
        restart_h = sum(restart_s) / len(restart_s) / 3600 if restart_s else 0.0
        site = self._current_site()
        now = time.time()
        # One site, or every site of the plan when the task allows several regions/clouds (the
        # policy's multi-region mode: it answers with a site, and another site means a migration)
        sites = self._sites if len(self._sites) > 1 else [site]
        spot_available = self._spot_availability(sites, now)
        prices = cluster_prices(self.plan.offers, sites, self.num_workers)
        return Observation(elapsed_h=elapsed_h, deadline_h=deadline_h, task_h=task_h, work_done_h=frac * task_h,
                           restart_h=restart_h, tick_h=self.opts.policy_interval_s / 3600,
                           current=self._current_market(), region=site,
                           spot_available=spot_available,
                           spot_price=prices[SPOT], on_demand_price=prices[ON_DEMAND],
                           preemptions=self.journal.preemptions, spent_usd=self.purse.ledger.spend(),
                           budget_usd=self.budget)

    def _spot_availability(self, sites: list[str], now: float) -> dict[str, bool]:
        """Site -> spot obtainable now (:meth:`MarketWatch.availability`); a spot worker counts as
        running unless we are ending it."""
        running = any(w.market == SPOT and w.instance_id not in self._ending for w in self._workers())
        return self.watch.availability(sites, now, spot_running=running)

    def _probe_spot(self, now: float) -> Node | None:
        """On on-demand, with spot last seen unobtainable: ask for one spot worker (every
        ``spot_probe_s``). Granted, spot is obtainable again (the policy is asked next, and a move to
        spot keeps it as its first worker); refused, the capacity error says it is still not.
        One site and a market the policy chooses only."""
        if (len(self._sites) > 1 or self._fixed_market() is not None
                or self._current_market() != ON_DEMAND or self.stop.reason is not None
                or not self.watch.probe_due(now, self.opts.spot_probe_s)):
            return None
        self.watch.probe_asked(now)
        got = self._launch_workers(1, SPOT, why="probe: is spot obtainable again?")
        if not got:
            return None
        self.watch.probes["granted"] += 1
        self._probing.add(got[0].instance_id)
        self.journal.event("spot_probe_granted", instance_id=got[0].instance_id)
        return got[0]

    def _record_spot(self, now: float) -> None:
        """This tick's evidence of spot for later runs (:meth:`MarketWatch.record_tick`): every
        spot worker of ours not being ended counts, drained and probing ones included."""
        self.watch.record_tick(now, self._spot_sites())

    def _spot_sites(self) -> set[SiteKey]:
        return {SiteKey(n.cloud, n.region, n.instance_type) for n in self._nodes.values()
                if n.role == "worker" and n.market == SPOT and n.instance_id not in self._ending}

    def consult_policy(self, now: float) -> None:
        """Ask the policy whether the run should be elsewhere (:meth:`Steering.consult`): another
        market (a move) or another site (a migration). Task ``market: auto`` only, once training
        runs and no move is under way. First a spot probe when one is due (:meth:`_probe_spot`):
        kept as the first new worker if the policy moves to spot, ended at once otherwise."""
        if self._draining or not self.driver.training_started or self.spec.resources.market != "auto":
            return
        probe = self._probe_spot(now)
        decision, cmd = self.steering.consult(self._view(now))
        if probe is not None:
            self._probing.discard(probe.instance_id)
            if decision.market != SPOT:
                # spot is back but the policy stays (e.g. a young streak): the probe goes at once;
                # what it found stays known, so no more probes until a spot launch fails again
                self._end_nodes([probe], reason="probe")
                self.journal.event("spot_probe_ended", instance_id=probe.instance_id, reason=self.steering.why(decision))
                probe = None
        self._act(cmd, now, probe=probe)

    def _move(self, cmd: MarketMove, now: float, probe: Node | None) -> None:
        """Move the workers to ``cmd.to``: launch the new ones (a kept probe is the first), drain
        the old ones through the head (just-in-time checkpoint), end them once it is committed; or
        abandon the move when the new market cannot supply them all."""
        kept = [probe] if probe is not None else []
        old = [w for w in self._workers() if w.market != cmd.to]
        new = kept + (self._launch_workers(len(old) - len(kept), cmd.to, why=cmd.reason) if len(old) > len(kept) else [])
        if kept:
            self.watch.probes["kept"] += 1
        if len(new) < len(old) or any(n.market != cmd.to for n in new):
            self._end_nodes(new, reason="move abandoned")
            self.journal.event("move_abandoned", to=cmd.to, reason=cmd.reason)
            return
        self._drain(old, now)
        move = {"t": round(now, 3), "from": cmd.frm, "to": cmd.to, "reason": cmd.reason,
                "step": self.driver.step}
        self.journal.moved(move)

    # -- moving the whole job to another site -----------------------------------------------------
    def _current_site(self) -> str:
        if self._head is not None:
            return f"{self._head.cloud}/{self._head.region}"
        return site_of(self.plan.chosen.offer)

    def _fixed_market(self) -> str | None:
        """The task's market when it fixes one (spot or on-demand); None when the policy chooses."""
        m = self.spec.resources.market
        return m if m in (SPOT, ON_DEMAND) else None

    def _migrate(self, cmd: Migrate, now: float) -> None:
        """Checkpoint, end this cluster, bring one up in ``cmd.target`` (or the next site that has
        capacity) and resubmit; training resumes from the checkpoint. Every node is billed to the
        second it ends, and the budget rule holds throughout (the stop is a checkpoint stop)."""
        target, market, reason = cmd.target, cmd.market, cmd.reason
        here = self._current_site()
        step = self.driver.step
        self.journal.event("migrate_requested", frm=here, to=target, market=market, reason=reason, step=step)
        self._stop_for_move()
        if self.stop.reason == "budget":
            return                                              # the budget, not the move, decides
        self.stop.clear()
        self.driver.archive()
        self._end_nodes(list(self._nodes.values()), reason="migrated")
        self._head = None
        self.driver.fresh(time.time())
        self._provision(prefer=(target, market))
        self._submit()
        self.purse.attach(self.driver.lease_push())   # the new nodes' dead man's switch hears from us at once
        landed = self._current_site()
        move = {"t": round(time.time(), 3), "from": here, "to": landed, "market": market, "reason": reason,
                "step": step}
        self.journal.migrated(move)

    def _stop_for_move(self) -> None:
        """End training before a move: at a stop checkpoint when every worker is up; else at once
        (training waits for the missing workers; its last committed checkpoint — the lost node's
        just-in-time one — is the resume point)."""
        if len(self._workers()) >= self.num_workers:
            self._stop_gracefully("migrate", wait_s=DRAIN_DEADLINE_S * 3)   # a checkpoint now
            return
        try:
            self.driver.request_stop("migrate")
            self.driver.stop_job()
        except Exception as e:  # noqa: BLE001 - the cluster is ended after this either way
            log.warning("stopping the job before a move: %s", e)

    def _drain(self, nodes: list[Node], now: float) -> None:
        """Ask the head to drain ``nodes`` (just-in-time checkpoint, as on a spot notice)."""
        for n in nodes:
            self._draining[n.instance_id] = now + DRAIN_DEADLINE_S
        self.driver.drain([n.instance_id for n in nodes], DRAIN_DEADLINE_S)

    def _finish_drains(self, now: float) -> None:
        if not self._draining:
            return
        first = min(self._draining.values()) - DRAIN_DEADLINE_S
        ckpt_after = any(c.get("t", 0) >= first and c.get("kind") == "preemption"
                         for c in self.driver.snapshot.get("checkpoints") or [])
        due = [iid for iid, t in self._draining.items() if ckpt_after or now >= t]
        nodes = [self._nodes[i] for i in due if i in self._nodes]
        for iid in due:
            self._draining.pop(iid, None)
        self._end_nodes(nodes, reason="moved")

    def _end_nodes(self, nodes: list[Node], *, reason: str) -> None:
        by_cloud: dict[str, list[Node]] = {}
        for n in nodes:
            self._ending.add(n.instance_id)
            by_cloud.setdefault(n.cloud, []).append(n)
        for name, ns in by_cloud.items():
            self.cloud(name).terminate(ns)
        for n in nodes:
            self._nodes.pop(n.instance_id, None)
            self.purse.ledger.close(n.instance_id, reason=reason)

    # -- money --------------------------------------------------------------------------------
    def _hard_stop(self, money: Money) -> bool:
        """The budget's hard stop (:meth:`Purse.check`): every node is ended at once."""
        if money is not Money.HARD_STOP:
            return False
        self._end_nodes(list(self._nodes.values()), reason="budget")
        return True

    # -- teardown -----------------------------------------------------------------------------
    def _teardown(self) -> None:
        for name, cloud in list(self._clouds.items()):
            try:
                live = cloud.list_nodes(self.cluster_id)
            except SpotwiseError as e:
                log.error("could not list %s nodes of %s (gc will end them): %s", name, self.cluster_id, e)
                live = []
            mine = [n for n in self._nodes.values() if n.cloud == name]
            ids = {n.instance_id for n in live}
            everything = live + [n for n in mine if n.instance_id not in ids]
            try:
                if everything:
                    cloud.terminate(everything)
            except SpotwiseError as e:
                log.error("could not end %d %s node(s) (gc will): %s", len(everything), name, e)
            for n in everything:
                self.purse.ledger.close(n.instance_id, reason="teardown")
            try:
                for what in cloud.cleanup_cluster(self.cluster_id):
                    self.journal.event("deleted", what=what)
            except SpotwiseError as e:
                log.error("cleanup of %s on %s failed (gc will retry): %s", self.cluster_id, name, e)
        self.purse.ledger.close_all()
        self._nodes.clear()

    # -- the report ----------------------------------------------------------------------------
    def _report(self, status: str, message: str | None, result) -> dict:
        return report(self.journal, status=status, message=message, result=result, job_id=self.job_id,
                      cluster_id=self.cluster_id, spec=self.spec, plan=self.plan, storage=self.storage,
                      budget_usd=self.budget, history=self.history, head=self._head,
                      drivers=self.driver.drivers(), hours=self.purse.ledger.hours_by_market(),
                      probes=self.watch.probes, restart_s=self.driver.restart_s)

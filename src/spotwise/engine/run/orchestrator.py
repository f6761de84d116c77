"""One run end to end, on any cloud: plan, provision, submit, monitor, tear down, report.

The orchestrator talks to clouds only through the provisioner's :class:`~spotwise.provisioner.base.Cloud`
interface and to training only through Ray's Jobs API and the job driver's control endpoint
(:mod:`spotwise.runtime.node.job`), so the same loop drives the local cloud and AWS (GCP and Azure
through the same interface). It is a composition of parts, each owning one concern:

* :class:`~spotwise.engine.run.journal.Journal`: what happened — events, counters, the job row, the report;
* :class:`~spotwise.engine.run.market_watch.MarketWatch`: what the run has seen of capacity;
* :class:`~spotwise.engine.run.steering.Steering`: where the run should be — the policy's answers as
  commands, with no side effects;
* :class:`~spotwise.engine.run.purse.Purse`: money — billing, the budget cap, the runner's lease;
* :class:`~spotwise.engine.run.driver.Driver`: the submitted Ray job;
* :class:`~spotwise.engine.run.fleet.Fleet`: the nodes, through ``Cloud`` and the failover;
* :class:`~spotwise.engine.run.recovery.Recovery`: what a lost node means for the run;
* :mod:`~spotwise.engine.run.views`: the run as the policy, the steering and the display see it;

and :class:`Orchestrator` is the run's algorithm over them, with the one stop latch
(:class:`~spotwise.engine.run.purse.StopLatch`):

1. **plan** (:mod:`spotwise.engine.plan.planner`): every offer that fits, ranked by expected total cost;
2. **provision**: the cluster's on-demand head, then the workers, walking the plan on capacity
   errors (:meth:`Fleet.provision`);
3. **submit**: ``python -m spotwise.runtime.node.job`` to the head through the Jobs API
   (:meth:`Driver.submit`), and the lease attached to it;
4. **monitor**, a few times a second (:meth:`Orchestrator._tick`): progress, then money (billing,
   the cap: nothing below launches past it), then the nodes (gone, drained, not joined) and their
   replacements, then the policy, then the job's own end;
5. **teardown** (``finally``): end every node of the cluster, close every bill, delete what the
   cluster shared; then the final status and report.

Nodes carry the job and cluster ids, so ``spotwise gc`` can end them even after a crash here.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spotwise.engine.display.progress import Pace
from spotwise.engine.plan.options import (LaunchOptions, check_options, check_training_data, parse_clouds,
                                          pin_training_data, task_as_run)
from spotwise.engine.plan.planner import Plan, make_plan
from spotwise.engine.run.curves import CurveRecorder
from spotwise.engine.run.driver import TERMINAL, Control, Driver, control_client, jobs_client
from spotwise.engine.run.fleet import DRAIN_DEADLINE_S, Fleet
from spotwise.engine.run.joblogs import OutputRecorder
from spotwise.engine.run.journal import JobRow, Journal, fallback_report, outcome, report
from spotwise.engine.run.market_watch import (MarketWatch, run_history, show_history,
                                              show_recorded_history, site_of)
from spotwise.engine.run.purse import Lease, Money, Purse, StopLatch, check_budget_floor, runner_lease
from spotwise.engine.run.run_stores import (RunStores, _storage_uri, bring_checkpoint, run_stores, stage_code,
                                            storage_uri)
from spotwise.engine.run.recovery import Interrupted, Recovery
from spotwise.engine.run.steering import (Command, MarketMove, Migrate, NoOp, Steering, TopUp, View, Wait,
                                          transfer_read_usd)
from spotwise.engine.run.views import fixed_market, observation, progress, speed, steering_view
from spotwise.engine.state.ledger import Ledger
from spotwise.engine.state.lease import node_lease_s
from spotwise.engine.state.spot_log import SpotLog
from spotwise.errors import SpotwiseError
from spotwise.policies.base import SPOT, get_policy
from spotwise.provisioner.base import Cloud, Node, cloud_class
from spotwise.provisioner.failover import Failover
from spotwise.taskcode import runtime_env
from spotwise.taskspec import TaskSpec, user_code

# the names other modules import from here
__all__ = ["Factories", "Interrupted", "LaunchOptions", "Orchestrator", "_storage_uri", "parse_clouds",
           "show_history", "show_recorded_history", "storage_uri"]

log = logging.getLogger("spotwise.orchestrator")


@dataclass(kw_only=True)
class Factories:
    """How the orchestrator makes what reaches outside this process; tests replace them.
    ``cloud`` None: each cloud's class, configured for the task (``Cloud.for_task``)."""

    cloud: Callable[[str], Cloud] | None = None                          # cloud name -> its Cloud
    failover: Callable[[Callable[[str], Cloud]], Failover] = lambda clouds: Failover(cloud_factory=clouds)
    lease: Callable[[str, float | None], Lease] = runner_lease           # (job id, budget) -> the runner's lease
    jobs_client: Callable[[str, Mapping[str, str]], Any] = jobs_client   # (dashboard URL, headers) -> Jobs API client
    control: Callable[[str, str], Control] = control_client             # (control URL, token) -> control endpoint


class Orchestrator:
    """One run of ``spec``: :meth:`run` does it all and returns the report.

    Building one checks the options and the task against what the plan can offer, before
    anything launches (an :class:`~spotwise.errors.InputError` naming the field, or a
    :class:`~spotwise.errors.SpotwiseError` for a budget that cannot pay one billing minute). The
    parts are public attributes; their factories come from ``factories``.

    ``resume``: this run continues the job ``job_id`` (:mod:`spotwise.engine.work.resume`): its ledger
    starts from the job's earlier spend (the cap ``budget_usd`` is the whole job's), the floor
    check is made against what is left of it, and the preemptions count on from the job's."""

    def __init__(self, spec: TaskSpec, opts: LaunchOptions, *, job_id: str | None = None,
                 cluster_id: str | None = None, factories: Factories | None = None,
                 resume: bool = False) -> None:
        make = factories or Factories()
        self.spec, self.opts = spec, opts
        self.clouds = parse_clouds(opts.cloud, spec)
        self.budget = check_options(spec, opts)
        self.job_id = job_id or f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.cluster_id = cluster_id or f"sw{uuid.uuid4().hex[:10]}"
        self.stores: RunStores = run_stores(spec, opts, self.clouds)   # each cloud's checkpoint store
        data_meta = check_training_data(spec, self.clouds)
        policy = get_policy(spec.policy_name)
        self.num_workers = spec.resources.nodes
        # the run's own cloud objects (one per cloud) ask the plan's questions too, so what the plan
        # read of a cloud (AWS: its subnets and route tables) is not read again at launch (issue 51)
        run_clouds: dict[str, Cloud] = {}

        def run_cloud(name: str) -> Cloud:
            if name not in run_clouds:
                run_clouds[name] = cloud_class(name).for_task(spec, dataclasses.replace(opts, storage=self.stores.of(name)))
            return run_clouds[name]

        self.plan: Plan = make_plan(spec, self.clouds, budget=self.budget, storage=self.stores.by_cloud,
                                    resuming=resume, resume_from=self.stores.holder(self.job_id) if resume else None,
                                    cloud_factory=None if make.cloud else run_cloud)
        spot_log = SpotLog(self.job_id, opts.policy_interval_s)
        self.history: dict | None = run_history(policy, spec, self.plan, tick_s=opts.policy_interval_s)
        self.sites = list(dict.fromkeys(site_of(o) for o in self.plan.offers))
        best = self.plan.chosen
        ledger = Ledger(self.job_id)
        self.resuming = resume
        spent = ledger.carry_over() if resume else 0.0
        check_budget_floor(None if self.budget is None else self.budget - spent, best.head_usd_per_hour + self.num_workers * best.offer.usd_per_hour
                           + best.carried_usd_per_hour)
        node_lease_s()                        # a bad $SPOTWISE_NODE_LEASE_S is refused before anything launches

        self.row = JobRow(job_id=self.job_id, spec=spec, clouds=self.clouds, cluster_id=self.cluster_id,
                          budget_usd=self.budget, doc=task_as_run(spec, opts, self.clouds, self.stores.as_task()))
        self.journal = Journal(self.job_id, progress=opts.progress)
        self.curve = CurveRecorder(self.job_id)
        self.output = OutputRecorder(self.job_id)
        if resume:
            self.journal.preemptions = self.row.preemptions()
        self.watch = MarketWatch(offers={o.key: o for o in self.plan.offers}, log=spot_log)
        self.steering = Steering(policy, spec.policy_name, interval_s=opts.policy_interval_s,
                                 transfer_read_usd=lambda site: transfer_read_usd(self.storage, spec, site,
                                                                                  self.stores.by_cloud))
        self.stop = StopLatch()               # why the run is stopping: the first reason wins
        self.purse = Purse(ledger, self.budget, lease=lambda: make.lease(self.job_id, self.budget),
                           event=self.journal.event)
        self.driver = Driver(job_id=self.job_id, storage=self.stores.of(best.offer.cloud),
                             training=pin_training_data(spec.training, data_meta),
                             runtime_env=runtime_env(user_code(spec)),
                             num_workers=self.num_workers, boot_timeout_s=opts.boot_timeout_s,
                             event=self.journal.event, jobs_client=make.jobs_client, control=make.control)
        self.fleet = Fleet(cluster_id=self.cluster_id, job_id=self.job_id, workers=self.num_workers,
                           offers=self.plan.offers, default_site=site_of(best.offer),
                           cloud=make.cloud or run_cloud,
                           failover=make.failover, bills=self.purse.ledger, journal=self.journal,
                           watch=self.watch, join_timeout_s=opts.join_timeout_s, node_poll_s=opts.node_poll_s)
        self.recovery = Recovery(fleet=self.fleet, journal=self.journal, watch=self.watch, driver=self.driver,
                                 purse=self.purse, max_replacements=max(10, 5 * self.num_workers), join_timeout_s=opts.join_timeout_s)
        self.pace, self.begun = Pace(), time.time()       # the deadline counts from here
        self.code_envs: dict[str, dict] = {}             # store URI -> the runtime env of the workdir staged there
        self.progress = progress(time.time(), spec=spec, begun=self.begun, pace=self.pace, driver=self.driver,
                                 purse=self.purse, fleet=self.fleet)   # what `spotwise launch` shows on a terminal

    # -- the run ------------------------------------------------------------------------------------
    def run(self) -> dict:
        """The whole run. Whatever happens after the job row is written — an error of any kind,
        Ctrl-C, SIGTERM — the cluster is torn down and the job ends in a final status; teardown
        itself defers SIGINT/SIGTERM (:mod:`spotwise.engine.run.signals`). The runner's lease
        (:mod:`spotwise.engine.state.lease`) is held from the first write to the last. Ctrl-C asks
        training to stop at a checkpoint; a second one, or SIGTERM (:class:`~spotwise.engine.run.signals.Terminated`,
        a ``KeyboardInterrupt`` — hence caught first), ends it at once."""
        from spotwise.engine.run import signals

        result = None
        status, message, crash, interrupted = "failed", None, None, False
        with signals.sigterm_raises():
            try:
                self.row.record("running")
                self.purse.hold()            # claimed and renewing before the first node launches
                try:
                    self.journal.event("plan", chosen=self.plan.chosen.offer.key, reason=self.plan.reason)
                    self.code_envs = stage_code(self.spec, self.stores, self.clouds, self.journal.event)
                    self.fleet.provision()
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
            except Interrupted as e:
                status, message, interrupted = "failed", str(e), True
            except SpotwiseError as e:
                status, message = "failed", str(e)
            except Exception as e:  # noqa: BLE001 - not ours to expect, but the job must not stay running
                status, message, crash = "failed", f"{type(e).__name__}: {e}", e
            finally:
                with signals.deferred() as late:
                    final = self._finish(status, message, result, interrupted=interrupted)
                    if late:
                        self.journal.event("signals_deferred_during_teardown", signals=late)
        if crash is not None:
            raise crash
        return final

    def _finish(self, status: str, message: str | None, result, *, interrupted: bool = False) -> dict:
        """Teardown, then the final status and report (every step tried even if one fails)."""
        try:
            self.fleet.teardown()
        except Exception as e:  # noqa: BLE001 - gc and the nodes' dead man's switch end what is left
            log.exception("teardown of %s failed", self.cluster_id)
            status, message = "failed", f"{message + '; ' if message else ''}teardown failed: {e}"
        self.watch.close()                # logs its own write errors: never fails the run
        if status != "cancelled" and message is None:
            status, message = outcome(result, stop_reason=self.stop.reason, steps=self.spec.training.steps,
                                      note=self.driver.end_note)
        try:
            final = report(self.journal, status=status, message=message, result=result, job_id=self.job_id,
                           cluster_id=self.cluster_id, spec=self.spec, plan=self.plan, storage=self.storage,
                           budget_usd=self.budget, history=self.history, head=self.fleet.head,
                           drivers=self.driver.drivers(), hours=self.purse.ledger.hours_by_market(),
                           probes=self.watch.probes, restart_s=self.driver.restart_s, interrupted=interrupted)
        except Exception as e:  # noqa: BLE001 - a report bug must not keep the job from its final status
            log.exception("could not build the report")
            final = fallback_report(self.journal, job_id=self.job_id, cluster_id=self.cluster_id, status=status,
                                    message=f"{message}; report failed: {e}", clouds=self.clouds)
        self.purse.release()              # before the final status: a renewal must not race it
        self.curve.sample(time.time(), self.driver.snapshot, self.purse.ledger.spend(), final=True,
                          speed=speed(self.driver.snapshot, self.fleet.workers()))
        self.output.finish(final, self.storage)
        self.row.record(status, final)
        return final

    @property
    def storage(self) -> str:
        """The checkpoint store of the cloud the cluster is on (before it is up: the plan's choice)."""
        return self.stores.of(self.fleet.site().split("/", 1)[0])

    def _submit(self) -> None:
        """Training to the head (:meth:`Driver.submit`) with the store of the head's cloud (and the
        workdir staged there); the job's newest checkpoint copied into that store first when
        another cloud's holds it (:func:`~spotwise.engine.run.run_stores.bring_checkpoint`). The join
        watch asks the same dashboard."""
        self.driver.storage = self.storage
        if self.storage in self.code_envs:
            self.driver.runtime_env = self.code_envs[self.storage]
        bring_checkpoint(self.stores, job_id=self.job_id, spec=self.spec, cloud=self.fleet.site().split("/", 1)[0],
                         budget=self.budget, ledger=self.purse.ledger, event=self.journal.event)
        ep, notice_window_s = self.fleet.endpoint()
        self.driver.submit(ep, notice_window_s=notice_window_s)
        self.fleet.dashboard = (ep.dashboard_url, dict(ep.headers))

    # -- the monitor ------------------------------------------------------------------------------------
    def _monitor(self):
        while True:
            time.sleep(self.opts.tick_s)
            done, result = self._tick(time.time())
            if done:
                return result

    def _tick(self, now: float) -> tuple[bool, Any]:
        """One tick; ``(True, training's result)`` once the run is over. Each part keeps its own
        cadence (:class:`~spotwise.engine.run.cadence.Every`)."""
        # sync: what training reports, then money — before anything below can launch
        self._read_progress()
        self.output.pull(self.driver, now)
        if self._hard_stop(self.purse.tick(now, self.stop, self.driver.request_stop)):
            return True, self.driver.result(hard_stopped=True)
        fast = speed(self.driver.snapshot, self.fleet.workers())
        self.curve.sample(now, self.driver.snapshot, self.purse.ledger.spend(now), speed=fast)
        try:
            self.progress = progress(now, spec=self.spec, begun=self.begun, pace=self.pace, driver=self.driver,
                                     purse=self.purse, fleet=self.fleet, fast=fast)
        except Exception:  # noqa: BLE001 - the display is a view: a bug in it must not stop a run
            log.exception("could not update the progress display of %s", self.job_id)
        # sync what the cloud (every node_poll_s, or at once when Ray lost a worker) and Ray report
        # of the nodes, then replace the missing ones
        self.fleet.poll(now, self.recovery.lost)
        if self.fleet.upkeep.due(now):
            self.fleet.finish_drains(now, self.driver.snapshot.get("checkpoints") or [])
            self.recovery.check_notices(now)
            if self.fleet.join_poll.due(now):
                self.check_joins(now)
            if self.stop.reason is None:
                self.top_up(now)
        # every policy interval: record what was seen of spot, then ask where the run should be
        if self.steering.policy_poll.due(now):
            self.watch.record_tick(now, self.fleet.spot_sites())
            if self.stop.reason is None:
                self.consult_policy(now)
        # the job's own end
        self.driver.check_boot(now)
        if self.driver.status_poll.due(now) and self.driver.poll_status() in TERMINAL:
            self._read_progress()
            return True, self.driver.result(hard_stopped=self.purse.hard_stopped)
        return False, None

    def _read_progress(self) -> None:
        """Training's progress (:meth:`Driver.poll`), and what the head's cloud saw in it (the local
        cloud's simulated market: its notices) as events."""
        snap = self.driver.poll()
        if snap is None:
            return
        self.fleet.observe(snap)
        self.recovery.notice(snap.get("events") or [], time.time())

    def _hard_stop(self, money: Money) -> bool:
        """The budget's hard stop (:meth:`Purse.check`): every node is ended at once."""
        if money is not Money.HARD_STOP:
            return False
        self.fleet.end_all("budget")
        return True

    # -- losses ---------------------------------------------------------------------------------------
    def check_nodes(self) -> None:
        """Nodes that went away without us ending them (:meth:`Fleet.sync`): preempted or lost."""
        self.fleet.sync(self.recovery.lost)

    def check_joins(self, now: float) -> None:
        """End the workers whose Ray has not been ALIVE in the cluster for ``join_timeout_s``
        (:meth:`Fleet.check_joins`): the cloud still lists them, so nothing else would replace
        them. Counted as lost (:meth:`Recovery.not_joined`); :meth:`top_up` replaces them."""
        self.fleet.check_joins(now, lambda o: self.recovery.not_joined(o, now))

    # -- steering ----------------------------------------------------------------------------------------
    def top_up(self, now: float) -> None:
        """Replace missing workers where the policy says now (:meth:`Steering.replace`: a replacement,
        a wait, or a migration, never while every missing worker still runs out a notice); one that
        overlaps a noticed worker only when the cap pays both (:meth:`Recovery.overlap`)."""
        self._act(self.recovery.overlap(self.steering.replace(self._view(now)), self.steering, now), now)

    def consult_policy(self, now: float) -> None:
        """Ask the policy whether the run should be elsewhere (:meth:`Steering.consult`): another
        market (a move) or another site (a migration). Task ``market: auto`` only, once training
        runs and no move is under way. First a spot probe when one is due (:meth:`probe_spot`):
        kept as the first new worker if the policy moves to spot, ended at once otherwise."""
        if self.fleet.draining or not self.driver.training_started or self.spec.resources.market != "auto":
            return
        probe = self.probe_spot(now)
        decision, cmd = self.steering.consult(self._view(now))
        probe = self.fleet.settle_probe(probe, keep=decision.market == SPOT, why=self.steering.why(decision))
        self._act(cmd, now, probe=probe)

    def probe_spot(self, now: float) -> Node | None:
        """On on-demand, with spot last seen unobtainable, one spot worker as a probe
        (:meth:`Fleet.probe_spot`); only where the policy chooses the market at one site, and not
        while the run is stopping."""
        if len(self.sites) > 1 or fixed_market(self.spec) is not None or self.stop.reason is not None:
            return None
        return self.fleet.probe_spot(now, self.opts.spot_probe_s)

    def _act(self, cmd: Command, now: float, *, probe: Node | None = None) -> None:
        """Carry out one of :class:`Steering`'s commands."""
        if isinstance(cmd, Migrate):
            self.migrate(cmd, now)
        elif isinstance(cmd, Wait):
            if cmd.announce:
                self.journal.event("waiting", missing=cmd.missing, reason=cmd.reason)
        elif isinstance(cmd, TopUp):
            early = self.recovery.at_notice()        # which noticed nodes it overlaps, and when it was asked for
            for n in self.fleet.add(cmd.count, cmd.market, why=cmd.reason):
                self.steering.waiting = False
                self.journal.event("replaced", by=n.instance_id, market=n.market, reason=cmd.reason, **early)
        elif isinstance(cmd, MarketMove):
            self._move(cmd, now, probe)
        else:
            assert isinstance(cmd, NoOp)

    def _move(self, cmd: MarketMove, now: float, probe: Node | None) -> None:
        """Move the workers to ``cmd.to`` (:meth:`Fleet.move`): once the new ones are up, the old
        ones are drained through the head (a just-in-time checkpoint) and ended once it is committed."""
        old = self.fleet.move(cmd.to, now, why=cmd.reason, probe=probe)
        if old is None:
            self.journal.event("move_abandoned", to=cmd.to, reason=cmd.reason)
            return
        self.driver.drain([n.instance_id for n in old], DRAIN_DEADLINE_S)
        self.journal.moved({"t": round(now, 3), "from": cmd.frm, "to": cmd.to, "reason": cmd.reason,
                            "step": self.driver.step})

    def _view(self, now: float) -> View:
        """The run as :class:`Steering` sees it (:func:`~spotwise.engine.run.views.steering_view`)."""
        obs = observation(spec=self.spec, plan=self.plan, sites=self.sites, tick_s=self.opts.policy_interval_s,
                          driver=self.driver, fleet=self.fleet, watch=self.watch, journal=self.journal,
                          purse=self.purse)
        return steering_view(obs, now=now, spec=self.spec, sites=self.sites, fleet=self.fleet, watch=self.watch,
                             journal=self.journal, stopping=self.stop.reason is not None)

    # -- moving the whole job to another site -----------------------------------------------------------
    def migrate(self, cmd: Migrate, now: float) -> None:
        """Checkpoint, end this cluster, bring one up in ``cmd.target`` (or the next site that has
        capacity) and resubmit; training resumes from the checkpoint. Every node is billed to the
        second it ends, and the budget rule holds throughout (the stop is a checkpoint stop; a
        hard budget stop during it ends the move)."""
        here, step = self.fleet.site(), self.driver.step
        self.journal.event("migrate_requested", frm=here, to=cmd.target, market=cmd.market, reason=cmd.reason,
                           step=step)
        self._stop_for_move()
        if self.stop.reason == "budget":
            return                                              # the budget, not the move, decides
        self.stop.clear()
        self.output.pull(self.driver, time.time(), force=True)   # this cluster's last lines, while it is up
        self.driver.archive()
        self.fleet.end_all("migrated")
        self.fleet.head = None
        self.driver.fresh(time.time())
        self.fleet.provision(prefer=(cmd.target, cmd.market))
        self._submit()
        self.purse.attach(self.driver.lease_push())   # the new nodes' dead man's switch hears from us at once
        self.journal.migrated({"t": round(time.time(), 3), "from": here, "to": self.fleet.site(),
                               "market": cmd.market, "reason": cmd.reason, "step": step})

    def _stop_for_move(self) -> None:
        """End training before a move: at a stop checkpoint when every worker is up; else at once
        (training waits for the missing workers; its last committed checkpoint — the lost node's
        just-in-time one — is the resume point)."""
        if self.fleet.missing() <= 0:
            self._stop_gracefully("migrate", wait_s=DRAIN_DEADLINE_S * 3)   # a checkpoint now
            return
        try:
            self.driver.request_stop("migrate")
            self.driver.stop_job()
        except Exception as e:  # noqa: BLE001 - the cluster is ended after this either way
            log.warning("stopping the job before a move: %s", e)

    def _stop_gracefully(self, reason: str, wait_s: float = 180.0):
        """Ask training to stop at a checkpoint and wait for the job to end (billing on, and the
        budget's hard stop still holds)."""
        if self.fleet.head is None or self.driver.control is None:
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
            self.output.pull(self.driver, time.time())       # the driver waits for its last lines to be read
            if self._hard_stop(self.purse.check(time.time(), self.stop, self.driver.request_stop)):
                break
            if self.driver.status() in TERMINAL:
                break
        self._read_progress()
        return self.driver.result(wait_s=10, hard_stopped=self.purse.hard_stopped)

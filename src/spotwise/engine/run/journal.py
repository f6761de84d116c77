"""What happened in a run: its events, its counters, the job's row and the final report.

Three things here are a public contract, read by people, the HTTP API, the dashboard and the
end-to-end tests (docs/orchestrator.md, "Report"): the event names (``launched``, ``preempted``,
``move``, ``migrated``, ``budget_hard_stop``, ...), the report's keys, and the job row's columns.
Every other part reports through :meth:`Journal.event` and the counters; nothing else writes
them, so the contract lives in one module.

* :class:`Journal`: events (each also stored in the ``events`` table and logged as a sentence;
  printed to stderr as one sentence (:mod:`spotwise.engine.display.sentences`) with ``--progress``; a failed write is
  logged, never fatal), the attempts of every launch, the moves and migrations, and the counts of
  preempted and lost nodes.
* :class:`JobRow`: the job's identity, written as ``running`` when the run starts and with its
  final status and report when it ends.
* :func:`outcome` and :func:`report`: the final status from what training returned, and the
  report itself.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from spotwise.engine.state import db
from spotwise.engine.plan.planner import Plan
from spotwise.engine.display.sentences import sentence
from spotwise.provisioner.base import Node
from spotwise.provisioner.failover import Attempt
from spotwise.runtime.training.trainfunc import STOP_GUARANTEE
from spotwise.taskspec import TaskSpec, task_doc

log = logging.getLogger("spotwise.orchestrator")

#: the event ``spotwise resume`` writes when a stopped run continues (:mod:`spotwise.engine.work.resume`)
RESUMED = "resumed"


@dataclass
class Journal:
    """The run's record as it goes. ``progress``: also print each event to stderr, as one plain
    line a person reads (``[spotwise 12:01:07Z] preempted: spot worker sw...-e296d7 in local-a``;
    :func:`~spotwise.engine.display.sentences.sentence`): no control codes, so a terminal, a pipe and a log
    file get the same text. The event's data stays whole in the report and the database."""

    job_id: str
    progress: bool = False
    events: list[dict] = field(default_factory=list)
    attempts: list[dict] = field(default_factory=list)     # every launch attempt but the cached ones
    moves: list[dict] = field(default_factory=list)        # moves between markets
    migrations: list[dict] = field(default_factory=list)   # whole-job moves to another region/cloud
    preemptions: int = 0
    lost_nodes: int = 0                                     # workers preempted, gone, or never in Ray

    def event(self, kind: str, **detail: Any) -> None:
        ev = {"t": round(time.time(), 3), "event": kind, **detail}
        self.events.append(ev)
        log.info("%s [%s]", sentence(ev), kind)     # a service job's log is read by people too
        if self.progress:
            stamp = time.strftime("%H:%M:%SZ", time.gmtime(ev["t"]))     # UTC, as every spotwise time
            print(f"[spotwise {stamp}] {sentence(ev)}", file=sys.stderr, flush=True)
        try:
            with db.session() as s:
                s.add(db.Event(job_id=self.job_id, t=ev["t"], kind=kind, detail=detail))
                s.commit()
        except Exception:  # noqa: BLE001 - an event we could not store must not stop the run
            log.exception("could not record event %s", kind)

    def saw_attempts(self, attempts: Iterable[Attempt]) -> None:
        """A launch's attempts, for the report (``cached`` ones are not new tries); a
        ``capacity_error`` event for each capacity error."""
        for a in attempts:
            if a.outcome != "cached":
                self.attempts.append({"offer": a.offer_key, "outcome": a.outcome, "nodes": a.nodes,
                                      "message": a.message})
            if a.outcome == "capacity":
                self.event("capacity_error", offer=a.offer_key, error=a.message)

    def moved(self, move: dict) -> None:
        """A move between markets (``{t, from, to, reason, step}``)."""
        self.moves.append(move)
        self.event("move", **{k: v for k, v in move.items() if k != "t"})

    def migrated(self, move: dict) -> None:
        """A whole-job move (``{t, from, to, market, reason, step}``)."""
        self.migrations.append(move)
        self.event("migrated", **{k: v for k, v in move.items() if k != "t"})

    def clouds_used(self) -> list[str]:
        """Every cloud that ran a node of this run."""
        return sorted({e["cloud"] for e in self.events if e["event"] == "launched"})


@dataclass(frozen=True, kw_only=True)
class JobRow:
    """The job's row (``jobs`` table): created with the run's identity on the first write; the
    final write adds the outcome from the report. Every write takes the database's write lock and
    is retried on a lost race (:func:`spotwise.engine.state.db.write`); the owner is this process."""

    job_id: str
    spec: TaskSpec
    clouds: list[str]
    cluster_id: str
    budget_usd: float | None
    doc: dict | None = None      # the task as stored with a new row (default: the spec's own keys)

    def preemptions(self) -> int:
        """The preemptions recorded on the job's row so far (a resumed job counts on from them)."""
        with db.session() as s:
            job = s.get(db.Job, self.job_id)
            return int(job.preemptions or 0) if job is not None else 0

    def record(self, status: str, report: dict | None = None) -> None:
        db.write(lambda s: self._write(s, status, report))

    def _write(self, s, status: str, report: dict | None) -> None:
        job = db.lock_row(s, db.Job, self.job_id)
        if job is None:
            job = db.Job(id=self.job_id, name=self.spec.name, status=status, cloud=",".join(self.clouds),
                         cluster_id=self.cluster_id, spec=self.doc or task_doc(self.spec),
                         budget_usd=self.budget_usd, deadline_hours=self.spec.deadline_hours,
                         created_at=time.time(), started_at=time.time(), owner_pid=os.getpid())
            s.add(job)
        job.status = status
        job.owner_pid = os.getpid()
        if report is not None:
            job.cloud = report["cloud"]
            job.finished_at = time.time()
            job.steps_completed = report["steps_completed"] or 0
            job.preemptions = report["preemptions"]
            job.resumes = report["resumes"]
            job.final_checkpoint = report["final_checkpoint"]
            job.model_sha256 = report["model_sha256"]
            job.message = report["message"]
            job.report = report


def outcome(result, *, stop_reason: str | None, steps: int, note: str | None = None) -> tuple[str, str | None]:
    """The final status and message from training's result (``TrainResult`` or None) and why the
    run stopped: a budget stop is ``budget_exhausted`` whatever training said. ``note``: what the
    Jobs API said of a job that ended without a result (:attr:`Driver.end_note`)."""
    if stop_reason == "budget":
        return "budget_exhausted", ("stopped before the next billing minute would pass the budget; `spotwise resume` "
                                    "with --budget continues it from the final checkpoint")
    if result is None:
        return "failed", "training did not return a result" + (f" ({note})" if note else "")
    if result.error:
        return "failed", result.error
    if result.stopped:
        return ("budget_exhausted" if result.stopped == "budget" else "failed"), f"stopped: {result.stopped}"
    if result.steps_completed >= steps or getattr(result, "returned", False):
        return "succeeded", None          # (a Ray Train function's end is its own: it returned)
    return "failed", f"training ended after {result.steps_completed}/{steps} steps"


def resumes_of(job_id: str) -> list[dict]:
    """Every resume of the job, oldest first (the report's ``resumed``). Here, not in
    :mod:`spotwise.engine.work.resume`, which needs the launch options: the report reads only events."""
    from sqlalchemy import select

    with db.session() as s:
        evs = s.scalars(select(db.Event).where(db.Event.job_id == job_id, db.Event.kind == RESUMED)
                        .order_by(db.Event.id)).all()
        return [{"t": e.t, **{k: (e.detail or {}).get(k) for k in ("from_status", "from_step", "spent_usd",
                                                                    "budget_usd", "added_usd")}} for e in evs]


def lost_steps(drivers: list[dict], resumes: list[dict]) -> int:
    """Steps trained twice: those after each resume point up to the step reached before it, and,
    across a migration, those between the old driver's last step and the new one's first resume."""
    lost = sum(max(0, r["max_step_before"] - r["from_step"]) for r in resumes)
    for before, after in zip(drivers, drivers[1:]):
        first = (after.get("resumes") or [{}])[0]
        if "from_step" in first:
            lost += max(0, int(before.get("step") or 0) - int(first["from_step"]))
    return lost


def eval_losses(drivers: list[dict]) -> list[dict]:
    """The held-out losses of all the job's clusters, one per step (a later cluster's measurement of
    a step replaces an earlier one's: the run resumed from before it), by step: ``{step, loss,
    train_loss}`` (``train_loss``: that step's training loss averaged over all ranks)."""
    by_step: dict[int, dict] = {}
    for snap in drivers:
        for e in snap.get("eval_loss") or []:
            by_step[int(e["step"])] = {"step": int(e["step"]), "loss": e.get("loss"),
                                       "train_loss": e.get("train_loss")}
    return [by_step[k] for k in sorted(by_step)]


def report(journal: Journal, *, status: str, message: str | None, result, job_id: str, cluster_id: str,
           spec: TaskSpec, plan: Plan, storage: str, budget_usd: float | None, history: dict | None,
           head: Node | None, drivers: list[dict], hours: dict[str, float], probes: dict[str, int],
           restart_s: list[float], interrupted: bool = False) -> dict:
    """The run's report (``--format json``; docs/orchestrator.md lists its keys). ``drivers``: the
    last control snapshot of each cluster the job ran on, oldest first; ``hours``: node-hours by
    market from the ledger; the cost is the ledger's, read back from the database (the whole job's:
    a resumed job's earlier legs included). ``interrupted``: the run failed because its cloud took
    its head or too many workers (such a failure can be resumed)."""
    snapshot = drivers[-1] if drivers else {}
    resumes = [r for snap in drivers for r in snap.get("resumes", [])]
    from sqlalchemy import func, select

    with db.session() as s:
        cost = db.job_spend(s, job_id)
        L = db.LedgerEntry
        by_market = dict(s.execute(select(L.market, func.sum(L.usd)).where(L.job_id == job_id)
                                   .group_by(L.market)).all())
    steps_completed = result.steps_completed if result else (snapshot.get("step", 0) if snapshot else 0)
    final_ckpt = result.final_checkpoint if result else None
    if not final_ckpt and snapshot and snapshot.get("checkpoints"):
        final_ckpt = snapshot["checkpoints"][-1]["uri"]
    chosen = plan.chosen
    return {
        "job_id": job_id,
        "cluster_id": cluster_id,
        "cloud": head.cloud if head else chosen.offer.cloud,
        "region": head.region if head else chosen.offer.region,
        "status": status,
        "message": message,
        "steps_total": spec.training.steps,
        "steps_completed": steps_completed,
        # the training loss last reported (rank 0's; a Ray Train function's ``loss`` metric)
        "loss": snapshot.get("loss") if snapshot else None,
        # training.eval's held-out loss, [{step, loss}, ...] over every cluster the job ran on
        "eval_loss": eval_losses(drivers),
        "preemptions": journal.preemptions,
        "lost_nodes": journal.lost_nodes,
        "resumes": len(resumes),
        "lost_steps": lost_steps(drivers, resumes),
        "checkpoint_interval": spec.training.checkpoint.interval_steps,
        "cost_usd": round(cost, 6),
        # the ledger's spend by what was billed: instances, the disks and addresses they carried, and
        # the egress of checkpoints copied between clouds' stores
        "cost_by_item": {"instances": round(sum(v or 0.0 for k, v in by_market.items() if k in ("spot", "on-demand")), 6),
                         "disks": round(by_market.get("disk") or 0.0, 6), "ipv4": round(by_market.get("ipv4") or 0.0, 6),
                         "egress": round(by_market.get("egress") or 0.0, 6)},
        "budget_usd": budget_usd,
        "hours_by_market": {"spot": round(hours.get("spot", 0.0), 6),
                            "on_demand": round(hours.get("on-demand", 0.0), 6)},
        "final_checkpoint": final_ckpt,
        "model_sha256": result.model_sha256 if result else None,
        "precision": result.precision if result else None,
        "storage": storage,
        "policy": spec.policy_name,
        "spot_history": history,
        "spot_probes": dict(probes),
        "plan": {"chosen": chosen.offer.key, "expected_hours": chosen.expected_hours,
                 "expected_cost_usd": chosen.expected_cost_usd, "reason": plan.reason},
        "attempts": journal.attempts,
        "moves": journal.moves,
        "migrations": journal.migrations,
        "cloud_used": journal.clouds_used(),
        "restart_seconds": [round(x, 1) for x in restart_s],
        "checkpoint_window": result.checkpoint_window if result else None,
        # what a stop promises: a TrainSpec's stop checkpoints at the step the stop came; a Ray
        # Train function is stopped at its next report, at the last checkpoint it reported
        "stop_guarantee": STOP_GUARANTEE if spec.training.train_func is not None else "checkpoint at the stop",
        "checkpoints": [{"step": c["step"], "kind": c["kind"]} for snap in drivers
                        for c in snap.get("checkpoints", [])],
        # world_size: the ranks the resumed group ran on (None from a snapshot that predates it);
        # t: when the resumed group restored its checkpoint (the head's clock)
        "resume_points": [{"from_step": r["from_step"], "max_step_before": r["max_step_before"],
                           "world_size": r.get("world_size"), "t": r.get("t")} for r in resumes],
        "interrupted": interrupted,
        # every `spotwise resume` of this job: from which status and step, the spend before it, the new cap
        "resumed": resumes_of(job_id),
        "events": journal.events,
    }


def fallback_report(journal: Journal, *, job_id: str, cluster_id: str, status: str, message: str,
                    clouds: list[str]) -> dict:
    """The report when :func:`report` itself failed: the job's identity, its status and why, and
    its events, so a report bug never keeps the job from its final status."""
    return {"job_id": job_id, "cluster_id": cluster_id, "status": status, "message": message, "steps_completed": 0,
            "preemptions": 0, "resumes": 0, "final_checkpoint": None, "model_sha256": None,
            "cloud": ",".join(clouds), "events": journal.events}

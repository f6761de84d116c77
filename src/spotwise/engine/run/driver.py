"""The submitted training job, as the orchestrator sees it: the Jobs API and the control endpoint.

Training runs on the cluster's head as ``python -m spotwise.runtime.node.job`` (:mod:`spotwise.runtime.node.job`),
submitted through Ray's Jobs API. The orchestrator reaches it two ways only: the Jobs API client
(submit, status, logs, stop) and the job's control endpoint (progress snapshots, the job's own
output, stop at a checkpoint, drain nodes, renew the node lease). :class:`Driver` holds both, the run's progress
as the control endpoint last reported it, and two clocks:

* **boot**: from submission to training's first step, bounded by ``boot_timeout_s``
  (:meth:`Driver.check_boot`);
* **restart**: from the loss of a node (:meth:`Driver.lost`) to training resuming (a new entry
  in the snapshot's ``resumes``), measured per loss in :attr:`Driver.restart_s` — what the policy
  is shown as the restart overhead of this run. When the ranks end their wait after a notice's
  checkpoint because the noticed node's replacement has joined (the job's ``preemption_wait_ended``,
  :mod:`spotwise.runtime.training.session`; issue 51), the clock runs from that moment, the
  restart is journalled (``notice_restart``), and the noticed node's loss, seen later, starts none.

A migration ends one cluster and submits again on another: :meth:`Driver.archive` keeps the old
job's last snapshot (the report counts every cluster's checkpoints and resumes), :meth:`Driver.fresh`
starts the new one's. The clients come from injectable factories, so all of this is testable
without Ray.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol
from urllib.parse import urlparse

from spotwise.engine.run.cadence import Every
from spotwise.errors import SpotwiseError
from spotwise.provisioner.head_path import HeadEndpoint
from spotwise.runtime.config import TrainConfig

log = logging.getLogger("spotwise.orchestrator")

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")   # the Jobs API's final job statuses
#: the job's event when the ranks restart before a noticed node's deadline
#: (``spotwise.runtime.training.session.WAIT_ENDED``; not imported: that module needs torch)
WAIT_ENDED = "preemption_wait_ended"
STATUS_EVERY_S = 1.0                           # the monitor asks the job's status this often
END_LINES = 12                                 # the job's last lines a failed run's message quotes
END_CHARS = 3000                               # and at most this much of them


class Control(Protocol):
    """The job's control endpoint (:class:`spotwise.runtime.node.job.ControlClient`)."""

    def snapshot(self) -> dict: ...

    def output(self, after: int) -> dict: ...

    def request_stop(self, reason: str) -> None: ...

    def drain(self, instance_ids: list[str], deadline_s: float) -> Any: ...

    def renew_lease(self, expires_at: float) -> Any: ...


def jobs_client(url: str, headers: Mapping[str, str]) -> Any:
    """Ray's Jobs API client for the head's dashboard (raises while the head is still booting)."""
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(url, headers=dict(headers) or None)


def control_client(url: str, token: str) -> Control:
    from spotwise.runtime.node.job import ControlClient

    return ControlClient(url, token)


def worker_env() -> dict[str, str]:
    """What the job needs from here: the S3 endpoint when one is set (never credentials: nodes
    on a cloud use their instance role; local nodes inherit this process's environment)."""
    return {k: os.environ[k] for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3") if os.environ.get(k)}


class Driver:
    """One run's training job, across the clusters it runs on.

    ``event`` records ``submitted``; ``jobs_client(url, headers)`` and ``control(url, token)``
    make the two clients (defaults: Ray's and spotwise's)."""

    def __init__(self, *, job_id: str, storage: str, training: TrainConfig, num_workers: int,
                 boot_timeout_s: float, event: Callable[..., None], runtime_env: Mapping[str, Any] | None = None,
                 jobs_client: Callable[[str, Mapping[str, str]], Any] = jobs_client,
                 control: Callable[[str, str], Control] = control_client) -> None:
        self.job_id, self.storage, self.training = job_id, storage, training
        self.runtime_env = dict(runtime_env or {})   # the task's own code (spotwise.taskcode.runtime_env)
        self.num_workers, self.boot_timeout_s = num_workers, boot_timeout_s
        self._event, self._jobs_client, self._control = event, jobs_client, control
        self.submission_id = f"spotwise-{job_id}"
        self.client: Any = None                  # None until the first submit; replaced by a migration's
        self.control: Control | None = None
        self.snapshot: dict = {}                 # the control endpoint's last answer
        self.past: list[dict] = []               # the last snapshot of each cluster before a migration
        self.started = 0.0                       # when the job was (last) submitted
        self.lost_at: float | None = None        # a node was lost and training has not resumed since
        self.resumes_seen = 0
        self.restart_s: list[float] = []         # node loss -> training resumed, measured
        self.events_seen = 0                     # the snapshot's events read so far (this cluster's)
        self.restarted_for: set[str] = set()     # noticed instances training already restarted without
        self.last_status: str | None = None
        self.status_poll = Every(STATUS_EVERY_S)
        self.end_note: str | None = None         # why the job ended without a result (:meth:`result`)
        self.output_after = 0                    # the job's output read so far (this cluster's cursor)

    # -- progress ---------------------------------------------------------------------------------
    @property
    def training_started(self) -> bool:
        return bool(self.snapshot.get("started_at"))

    @property
    def step(self) -> int:
        return int(self.snapshot.get("step") or 0)

    def drivers(self) -> list[dict]:
        """The last snapshot of every cluster the job ran on, oldest first (for the report)."""
        return [*self.past, self.snapshot or {}]

    def poll(self) -> dict | None:
        """Read progress from the control endpoint; the new snapshot, or None when it did not
        answer (not up yet, or a hiccup: the last one is kept). A new resume closes the restart
        clock."""
        try:
            snap = self.control.snapshot() if self.control is not None else None
        except Exception:  # noqa: BLE001 - driver not up yet, or a hiccup: keep the last one
            return None
        if snap is None:
            return None
        self.snapshot = snap
        self._early_restarts(snap.get("events") or [])
        resumes = len(snap.get("resumes") or [])
        if resumes > self.resumes_seen and self.lost_at is not None:
            self.restart_s.append(time.time() - self.lost_at)
            self.lost_at = None
        self.resumes_seen = resumes
        return snap

    def read_output(self) -> list[dict]:
        """The job's output lines printed since the last read (:meth:`Control.output`; the cursor
        passed back tells the head they were read). Raises when the endpoint does not answer."""
        if self.control is None:
            return []
        page = self.control.output(self.output_after)
        self.output_after = int(page.get("next") or self.output_after)
        return list(page.get("lines") or [])

    def _early_restarts(self, events: list[dict]) -> None:
        """The ranks ended their notice wait (the replacement joined): journal it once, and run
        the restart clock from then."""
        for e in events[self.events_seen:]:
            if e.get("event") != WAIT_ENDED:
                continue
            at, instances = float(e.get("at") or e["t"]), list(e.get("instances") or [])
            deadline_ms = e.get("deadline_ms")
            self._event("notice_restart", instances=instances, at=round(at, 3),
                        before_deadline_s=round(deadline_ms / 1000 - at, 1) if deadline_ms else None)
            self.restarted_for.update(instances)
            self.lost_at = self.lost_at or at
        self.events_seen = len(events)

    def lost(self, now: float, instance_id: str | None = None) -> None:
        """A node was lost at ``now``: the restart clock runs until training resumes (the first
        loss of several counts) — unless training already restarted without it (a noticed
        ``instance_id`` whose replacement had joined)."""
        if instance_id is not None and instance_id in self.restarted_for:
            self.restarted_for.discard(instance_id)
            return
        self.lost_at = self.lost_at or now

    def check_boot(self, now: float) -> None:
        """Fail the run when training has not started within ``boot_timeout_s`` of submission."""
        if not self.training_started and now - self.started > self.boot_timeout_s:
            raise SpotwiseError(f"training did not start within {self.boot_timeout_s:.0f} s of submission "
                                f"(job {self.submission_id}: status {self.last_status}); a node may have failed to "
                                "boot or join Ray — see its boot log")

    # -- the job --------------------------------------------------------------------------------------
    def submit(self, ep: HeadEndpoint, *, notice_window_s: float | None) -> None:
        """Submit training to the head at ``ep`` (waiting, up to ``boot_timeout_s``, for its
        Jobs API to answer and its job agent to take the job); the control endpoint is then
        ``ep.control_url`` with a fresh per-run token."""
        from spotwise.runtime.api import WORKER_RESOURCE, TrainJob
        from spotwise.runtime.node.job import encode_job

        os.environ.update(ep.env)
        client = self._wait_for_dashboard(ep.dashboard_url, ep.headers)
        token = secrets.token_urlsafe(24)
        job = TrainJob(run_name=self.job_id, storage_uri=self.storage, config=self.training,
                       num_workers=self.num_workers, resources_per_worker={"CPU": 1, WORKER_RESOURCE: 1},
                       control_run_name=self.job_id, env=worker_env(), notice_window_s=notice_window_s)
        listen = urlparse(f"//{ep.control_listen}" if ep.control_listen else ep.control_url)
        port, host = listen.port or 80, listen.hostname     # where the head binds it (ep.control_listen)
        entrypoint = f"python -m spotwise.runtime.node.job {encode_job(job, control_port=port, control_host=host)}"
        deadline = time.time() + self.boot_timeout_s
        from requests.exceptions import ConnectionError as Unreached

        sent = False            # a POST that may have reached the head before its connection broke
        while True:
            try:
                client.submit_job(entrypoint=entrypoint, submission_id=self.submission_id,
                                  runtime_env=self.job_runtime_env(token))
                break
            except Unreached as e:
                # the connection broke mid-request (a head still starting its dashboard, an ssh
                # forward reset on a loaded link): the same submission id is sent again, and
                # Ray's "already exists" then says the first one arrived
                if time.time() > deadline:
                    raise SpotwiseError(f"the head's Jobs API at {ep.dashboard_url} could not be reached to submit "
                                        f"the job: {e}") from None
                sent = True
                log.info("submitting the job: %s; sending it again", e)
                time.sleep(2.0)
            except RuntimeError as e:
                if sent and "already exists" in str(e):
                    break
                # the dashboard answers before its job agent is up ("No available agent to submit
                # job, please try again later"): a booting head, not a failure
                if "try again" not in str(e) or time.time() > deadline:
                    raise SpotwiseError(f"the head's Jobs API refused the job: {e}") from None
                time.sleep(2.0)
        self.started = time.time()
        self._event("submitted", submission_id=self.submission_id, dashboard=ep.dashboard_url)
        self.client, self.control = client, self._control(ep.control_url, token)

    def job_runtime_env(self, token: str) -> dict[str, Any]:
        """The submission's runtime environment: the task's code (workdir, pip, env: Ray hands
        the job's to every worker it starts) plus the control token, the launcher's build id (a head
        of another build refuses the job) and the S3 endpoint, which the task's ``env`` cannot
        replace."""
        from spotwise.build import build_id
        from spotwise.runtime.node.job import BUILD_ENV, TOKEN_ENV

        env = {**self.runtime_env.get("env_vars", {}), TOKEN_ENV: token, BUILD_ENV: build_id(), **worker_env()}
        return {**self.runtime_env, "env_vars": env}

    def _wait_for_dashboard(self, url: str, headers: Mapping[str, str]) -> Any:
        deadline = time.time() + self.boot_timeout_s
        last: Exception | None = None
        while time.time() < deadline:
            try:
                return self._jobs_client(url, headers)
            except Exception as e:  # noqa: BLE001 - the head is still booting
                last = e
                time.sleep(1.0)
        raise SpotwiseError(f"the head's Jobs API at {url} did not answer within {self.boot_timeout_s:.0f} s: {last}")

    def status(self) -> str | None:
        """The job's status (``RUNNING``, ``SUCCEEDED``, ...), or None when it cannot be told now."""
        try:
            return str(self.client.get_job_status(self.submission_id)).split(".")[-1]
        except Exception:  # noqa: BLE001 - any client error means "status unknown this tick": asked again next one
            return None

    def poll_status(self) -> str | None:
        """:meth:`status`, remembered for the boot-timeout message."""
        self.last_status = self.status()
        return self.last_status

    def result(self, *, wait_s: float = 30.0, hard_stopped: bool = False):
        """Training's result (``TrainResult``) from the job's logs, waiting up to ``wait_s`` for it
        to be printed; None when there is none (or at once after a hard stop: the head is gone).
        The final snapshot the job printed replaces the last one read. Without a result (and not
        after a hard stop), :attr:`end_note` says what the Jobs API knows of why."""
        from spotwise.runtime.node.job import parse_result, parse_snapshot

        deadline = time.time() + wait_s
        logs: str | None = None
        while True:
            try:
                logs = self.client.get_job_logs(self.submission_id)
                res = parse_result(logs)
                snap = parse_snapshot(logs)
                if snap is not None:
                    self.snapshot = snap
            except Exception:  # noqa: BLE001 - the head may be gone (hard stop)
                res = None
            if res is not None or time.time() > deadline or hard_stopped:
                if res is None and not hard_stopped:
                    self.end_note = self._why_no_result(logs)
                return res
            time.sleep(1.0)

    def _why_no_result(self, logs: str | None) -> str | None:
        """What the Jobs API says of a job that ended without a result: Ray's status message (the
        entrypoint's exit code, a runtime environment that failed to set up, a stop) and the last
        lines the job printed (its own traceback, when it crashed), so that a failed run says why
        in its message and report, not only that it failed. None when the head cannot say."""
        from spotwise.runtime.node.job import RESULT_PREFIX, SNAPSHOT_PREFIX

        parts: list[str] = []
        try:
            message = str(getattr(self.client.get_job_info(self.submission_id), "message", None) or "").strip()
        except Exception:  # noqa: BLE001 - the head may be gone: the logs may still say why
            message = ""
        if message:
            parts.append(f"Ray: {message.splitlines()[0]}")
        lines = [ln.rstrip() for ln in (logs or "").splitlines()
                 if ln.strip() and not ln.startswith((RESULT_PREFIX, SNAPSHOT_PREFIX))]
        if lines:
            parts.append("the job's last lines: " + " | ".join(lines[-END_LINES:]))
        note = "; ".join(parts)
        return note[-END_CHARS:] if note else None

    def lease_push(self) -> Callable[[float], object]:
        """Where the node lease goes: this job's control endpoint (the one of the cluster it runs
        on now; a migration attaches the new one)."""
        if self.control is None:
            raise SpotwiseError("no training job to push the lease to")
        return self.control.renew_lease

    def request_stop(self, reason: str) -> None:
        """Ask training to stop at a checkpoint (raises when the endpoint does not take it)."""
        if self.control is None:
            raise SpotwiseError("no training job to stop")
        self.control.request_stop(reason)

    def stop_job(self) -> None:
        """End the job through the Jobs API (no checkpoint; raises on failure)."""
        self.client.stop_job(self.submission_id)

    def drain(self, instance_ids: list[str], deadline_s: float) -> None:
        """Ask the head to drain these nodes (just-in-time checkpoint, as on a spot notice); a
        failure is logged: the nodes are ended at the deadline anyway."""
        try:
            if self.control is None:
                raise SpotwiseError("no training job")
            self.control.drain(instance_ids, deadline_s)
        except Exception as e:  # noqa: BLE001 - ended at the deadline anyway (periodic checkpoint)
            log.warning("drain request failed: %s", e)

    # -- across a migration ------------------------------------------------------------------------
    def archive(self) -> None:
        """Keep this cluster's last snapshot (its checkpoints and resumes stay in the report)."""
        self.past.append(dict(self.snapshot))

    def fresh(self, now: float) -> None:
        """The old cluster is gone: no progress yet on the next one, and the restart clock runs."""
        self.snapshot, self.resumes_seen, self.output_after, self.events_seen = {}, 0, 0, 0
        self.lost(now)

"""The submitted training job (:class:`spotwise.engine.run.driver.Driver`) against a recorded Jobs API
client and control endpoint: no Ray, no cluster."""

from __future__ import annotations

import json
import logging
import time
import types

import pytest

from spotwise.engine.run.driver import Driver
from spotwise.errors import SpotwiseError
from spotwise.provisioner.head_path import HeadEndpoint
from spotwise.runtime.config import TrainConfig
from spotwise.runtime.node.job import RESULT_PREFIX, SNAPSHOT_PREFIX, TOKEN_ENV, decode_job

EP = HeadEndpoint(dashboard_url="http://10.0.0.1:8265", control_url="http://10.0.0.1:8266",
                  env={"SPOTWISE_TEST_DRIVER_ENV": "1"}, headers={"Authorization": "Bearer x"})


class Jobs:
    """The Jobs API: ``refusals`` submit errors first, then takes the job; status and logs as set."""

    def __init__(self, refusals: list[str] = (), status: str = "JobStatus.RUNNING", logs: str = "") -> None:
        self.refusals, self.status, self.logs = list(refusals), status, logs
        self.message: str | None = None
        self.submitted: list[dict] = []
        self.stopped: list[str] = []

    def submit_job(self, **kw):
        if self.refusals:
            raise RuntimeError(self.refusals.pop(0))
        self.submitted.append(kw)

    def get_job_status(self, sid):
        if self.status is None:
            raise ConnectionError("head gone")
        return self.status

    def get_job_logs(self, sid):
        if self.logs is None:
            raise ConnectionError("head gone")
        return self.logs

    def get_job_info(self, sid):
        if self.status is None:
            raise ConnectionError("head gone")
        return types.SimpleNamespace(status=self.status, message=self.message)

    def stop_job(self, sid):
        self.stopped.append(sid)


class Control:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.snap: dict | None = None           # None: not answering
        self.calls: list = []

    def snapshot(self):
        if self.snap is None:
            raise ConnectionRefusedError("not up")
        return self.snap

    def request_stop(self, reason):
        self.calls.append(("stop", reason))

    def drain(self, ids, deadline_s):
        raise ConnectionRefusedError("not up")

    def renew_lease(self, expires_at):
        self.calls.append(("lease", expires_at))


@pytest.fixture
def no_sleep(monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)


def driver(jobs: Jobs, *, boot_timeout_s: float = 60.0, dashboard_fails: int = 0) -> tuple[Driver, list]:
    events: list = []
    fails = [dashboard_fails]

    def client(url, headers):
        assert (url, dict(headers)) == (EP.dashboard_url, EP.headers)
        if fails[0]:
            fails[0] -= 1
            raise ConnectionRefusedError("booting")
        return jobs

    d = Driver(job_id="job-1", storage="s3://b/p", training=TrainConfig(steps=10), num_workers=2,
               boot_timeout_s=boot_timeout_s, event=lambda kind, **kw: events.append((kind, kw)),
               jobs_client=client, control=Control)
    return d, events


def test_submit_waits_for_the_head_and_its_job_agent_then_hands_the_job_its_token(no_sleep, monkeypatch):
    monkeypatch.delenv("SPOTWISE_TEST_DRIVER_ENV", raising=False)
    jobs = Jobs(refusals=["No available agent to submit job, please try again later"])
    d, events = driver(jobs, dashboard_fails=2)
    with pytest.raises(SpotwiseError):
        d.lease_push()                                          # nothing submitted yet
    d.submit(EP, notice_window_s=120.0)
    import os

    assert os.environ["SPOTWISE_TEST_DRIVER_ENV"] == "1"        # the endpoint's environment, for the clients
    [sub] = jobs.submitted
    assert sub["submission_id"] == d.submission_id == "spotwise-job-1"
    token = sub["runtime_env"]["env_vars"][TOKEN_ENV]
    assert isinstance(d.control, Control) and (d.control.url, d.control.token) == (EP.control_url, token)
    job, port, host, _ = decode_job(sub["entrypoint"].split()[-1])
    assert (port, host) == (8266, "10.0.0.1") and job.notice_window_s == 120.0 and job.num_workers == 2
    assert job.storage_uri == "s3://b/p" and job.run_name == "job-1"
    assert events == [("submitted", {"submission_id": "spotwise-job-1", "dashboard": EP.dashboard_url})]
    assert d.started > 0 and d.lease_push() == d.control.renew_lease


def test_behind_a_port_forward_the_job_binds_the_heads_address_and_the_client_uses_the_forward(no_sleep):
    # a Slurm cluster over ssh: control_url is this machine's end of the tunnel, the head binds its own
    jobs = Jobs()
    d, _ = driver(jobs)
    ep = HeadEndpoint(dashboard_url=EP.dashboard_url, headers=EP.headers, control_url="http://127.0.0.1:24001",
                      control_listen="10.0.0.7:8266")
    d.submit(ep, notice_window_s=None)
    _, port, host, _ = decode_job(jobs.submitted[0]["entrypoint"].split()[-1])
    assert (port, host) == (8266, "10.0.0.7")
    assert isinstance(d.control, Control) and d.control.url == "http://127.0.0.1:24001"


def test_a_job_the_head_refuses_or_a_dashboard_that_never_answers_fails_the_run(no_sleep):
    d, _ = driver(Jobs(refusals=["runtime env is invalid"]))
    with pytest.raises(SpotwiseError, match="refused the job: runtime env is invalid"):
        d.submit(EP, notice_window_s=30.0)
    d, _ = driver(Jobs(), boot_timeout_s=0.0, dashboard_fails=1)
    with pytest.raises(SpotwiseError, match="did not answer within 0 s"):
        d.submit(EP, notice_window_s=30.0)


def test_progress_keeps_the_last_snapshot_and_measures_each_restart(no_sleep):
    d, _ = driver(Jobs())
    d.submit(EP, notice_window_s=30.0)
    assert d.poll() is None and d.snapshot == {}                 # the endpoint is not up yet
    d.control.snap = {"step": 3, "started_at": 1.0, "resumes": []}
    assert d.poll() == d.control.snap and d.step == 3 and d.training_started
    t = time.time()
    d.lost(t - 30)
    d.lost(t - 10)                                               # the first loss of several counts
    d.control.snap = None
    d.poll()
    assert d.step == 3 and d.restart_s == []                     # kept; no resume seen yet
    d.control.snap = {"step": 3, "started_at": 1.0, "resumes": [{"from_step": 2}]}
    d.poll()
    assert len(d.restart_s) == 1 and 29 < d.restart_s[0] < 60 and d.lost_at is None
    d.poll()
    assert len(d.restart_s) == 1                                 # the same resume is not counted twice


def test_a_restart_before_the_noticed_node_went_is_measured_from_the_wait_ended_and_its_loss_starts_no_clock(no_sleep):
    """Issue 51: the ranks end their notice wait once the replacement has joined (the job's
    ``preemption_wait_ended``), so training resumes before the noticed node goes: the restart is
    measured from the end of the wait to the resume, journalled once (``notice_restart``), and the
    node's loss seen afterwards starts no restart clock (the next resume would have closed it over
    the whole time in between)."""
    d, events = driver(Jobs())
    d.submit(EP, notice_window_s=30.0)
    t = time.time()
    ended = {"t": t - 8, "event": "preemption_wait_ended", "at": t - 8.5, "deadline_ms": (t + 20) * 1000,
             "instances": ["i-1"]}
    d.control.snap = {"step": 9, "started_at": 1.0, "resumes": [], "events": [{"t": t - 9, "event": "preemption_wait"},
                                                                              ended]}
    d.poll()
    d.poll()                                                      # seen once
    assert [k for k, _ in events] == ["submitted", "notice_restart"]
    assert events[1][1] == {"instances": ["i-1"], "at": round(t - 8.5, 3), "before_deadline_s": 28.5}
    assert d.lost_at == t - 8.5 and d.restart_s == []
    d.control.snap = {**d.control.snap, "resumes": [{"from_step": 9, "t": t}]}
    d.poll()
    assert len(d.restart_s) == 1 and 8 <= d.restart_s[0] < 60 and d.lost_at is None
    d.lost(t + 20, instance_id="i-1")                              # the noticed node goes at its deadline
    assert d.lost_at is None
    d.lost(t + 30, instance_id="i-2")                              # another loss starts the clock as before
    assert d.lost_at == t + 30


def test_status_result_and_stop_through_the_jobs_api(no_sleep):
    snap = {"step": 10, "checkpoints": [{"step": 10, "kind": "final", "uri": "u"}]}
    res = {"steps_completed": 10, "final_checkpoint": "u", "model_sha256": "abc"}
    jobs = Jobs(status="JobStatus.SUCCEEDED", logs=f"noise\n{SNAPSHOT_PREFIX}{json.dumps(snap)}\n"
                                                   f"{RESULT_PREFIX}{json.dumps(res)}\n")
    d, _ = driver(jobs)
    d.submit(EP, notice_window_s=30.0)
    assert d.status() == "SUCCEEDED" and d.poll_status() == "SUCCEEDED" and d.last_status == "SUCCEEDED"
    r = d.result()
    assert r.steps_completed == 10 and d.snapshot == snap        # the job's final snapshot replaces the last one
    d.request_stop("cancel")
    d.stop_job()
    assert d.control.calls == [("stop", "cancel")] and jobs.stopped == ["spotwise-job-1"]
    jobs.status, jobs.logs = None, None                          # the head is gone
    assert d.status() is None
    t0 = time.monotonic()
    assert d.result(wait_s=30.0, hard_stopped=True) is None and time.monotonic() - t0 < 5
    assert d.result(wait_s=0.0) is None


def test_no_job_yet_means_no_stop_and_a_drain_that_fails_is_only_logged(no_sleep, caplog):
    d, _ = driver(Jobs())
    with pytest.raises(SpotwiseError):
        d.request_stop("budget")
    assert d.status() is None and d.poll() is None
    d.submit(EP, notice_window_s=30.0)
    with caplog.at_level(logging.WARNING, logger="spotwise.orchestrator"):
        d.drain(["i-1"], 60.0)
    assert "drain request failed" in caplog.text


def test_training_that_does_not_start_in_time_fails_the_run(no_sleep):
    d, _ = driver(Jobs(), boot_timeout_s=100.0)
    d.submit(EP, notice_window_s=30.0)
    d.poll_status()
    d.check_boot(d.started + 100)                                 # not yet past it
    with pytest.raises(SpotwiseError, match=r"did not start within 100 s .*status RUNNING"):
        d.check_boot(d.started + 101)
    d.snapshot = {"started_at": d.started + 50}
    d.check_boot(d.started + 10_000)                              # it started: no boot clock any more


def test_a_migration_keeps_the_old_clusters_snapshot_and_starts_the_restart_clock(no_sleep):
    d, _ = driver(Jobs())
    d.snapshot, d.resumes_seen = {"step": 7, "resumes": [{"from_step": 5}]}, 1
    d.archive()
    d.fresh(123.0)
    assert d.past == [{"step": 7, "resumes": [{"from_step": 5}]}] and d.snapshot == {} and d.resumes_seen == 0
    assert d.lost_at == 123.0 and d.drivers() == [{"step": 7, "resumes": [{"from_step": 5}]}, {}]


def test_a_job_that_ends_without_a_result_says_why_from_the_jobs_api(no_sleep):
    """Ray's status message and the job's own last lines (its traceback), not the snapshots, and
    nothing when the result came, when the head is gone, or after a hard stop."""
    snap = {"step": 3}
    lines = [f"line {i}" for i in range(30)] + ["Traceback (most recent call last):", "RuntimeError: boom"]
    jobs = Jobs(status="JobStatus.FAILED", logs="\n".join([*lines[:5], f"{SNAPSHOT_PREFIX}{json.dumps(snap)}",
                                                            *lines[5:]]) + "\n")
    jobs.message = "Job entrypoint command failed with exit code 1, last available logs:\n..."
    d, _ = driver(jobs)
    d.submit(EP, notice_window_s=30.0)
    assert d.result(wait_s=0.0) is None
    assert d.end_note.startswith("Ray: Job entrypoint command failed with exit code 1, last available logs:;")
    assert d.end_note.endswith("Traceback (most recent call last): | RuntimeError: boom")
    assert "line 19" not in d.end_note and "line 20" in d.end_note and SNAPSHOT_PREFIX not in d.end_note
    assert d.snapshot == snap

    jobs.logs = "x" * 10_000
    d.result(wait_s=0.0)
    assert len(d.end_note) == 3000                            # bounded: it goes into the job's message
    jobs.status = jobs.logs = None                            # the head is gone: nothing to say
    d.result(wait_s=0.0)
    assert d.end_note is None
    d.end_note = "kept"
    d.result(wait_s=0.0, hard_stopped=True)
    assert d.end_note == "kept"


class BrokenOnce(Jobs):
    """The first POST breaks mid-request (requests' ``Connection aborted``), after the head took
    the job (``arrived``) or before; a second POST of the same id then gets Ray's answer."""

    def __init__(self, arrived: bool) -> None:
        super().__init__()
        self.arrived, self.posts = arrived, 0

    def submit_job(self, **kw):
        import requests

        self.posts += 1
        if self.posts == 1:
            if self.arrived:
                self.submitted.append(kw)
            raise requests.exceptions.ConnectionError("('Connection aborted.', RemoteDisconnected('Remote end "
                                                      "closed connection without response'))")
        if self.submitted:
            raise RuntimeError(f"Request failed with status code 500: Job with submission_id "
                               f"{kw['submission_id']} already exists. Please use a different submission_id.")
        self.submitted.append(kw)


@pytest.mark.parametrize("arrived", [True, False])
def test_a_submission_whose_connection_breaks_is_sent_again_and_already_exists_means_it_arrived(no_sleep, arrived):
    """Failed before: the launcher ended with exit 70 (internal error) on the first broken POST,
    seen in the GCP e2e through its ssh forward on a loaded machine."""
    jobs = BrokenOnce(arrived)
    d, events = driver(jobs)
    d.submit(EP, notice_window_s=30.0)
    assert jobs.posts == 2 and len(jobs.submitted) == 1
    assert [k for k, _ in events] == ["submitted"]


def test_a_head_that_keeps_breaking_the_submission_fails_the_run_naming_it(no_sleep, monkeypatch):
    import requests

    class Never(Jobs):
        def submit_job(self, **kw):
            raise requests.exceptions.ConnectionError("Connection aborted.")

    clock = iter(range(0, 10_000, 30))
    monkeypatch.setattr(time, "time", lambda: float(next(clock)))
    d, _ = driver(Never(), boot_timeout_s=60.0)
    with pytest.raises(SpotwiseError, match="could not be reached to submit the job: Connection aborted"):
        d.submit(EP, notice_window_s=30.0)

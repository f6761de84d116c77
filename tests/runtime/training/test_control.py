"""The control actor's contract as a plain object: progress rides on the stop poll, checkpoints
prove progress, and a resume records the highest step heard of before it."""

from spotwise.runtime.training.control import Control


def test_poll_carries_progress_and_returns_stop_reason():
    c = Control()
    assert c.poll() is None
    assert c.snapshot()["step"] == 0 and c.snapshot()["started_at"] is None
    assert c.poll(7) is None
    assert c.snapshot()["step"] == 7 and c.snapshot()["started_at"] is not None
    c.poll(3)                                   # a late, stale poll never lowers the step
    assert c.snapshot()["step"] == 7
    c.request_stop("budget_exhausted")
    assert c.poll(9) == "budget_exhausted"
    assert c.snapshot()["step"] == 9


def test_checkpoint_raises_step_so_resume_counts_no_lost_work():
    c = Control()
    c.poll(40)                                  # last poll before the notice
    c.report_checkpoint(43, "file:///x/step-43", "preemption")
    c.report_resume(43, 2)
    r = c.snapshot()["resumes"][0]
    assert r["from_step"] == 43 and r["max_step_before"] == 43


def test_resume_after_hard_loss_counts_steps_past_the_checkpoint():
    c = Control()
    c.report_checkpoint(20, "file:///x/step-20")
    c.poll(27)
    c.report_resume(20, 1)
    r = c.snapshot()["resumes"][0]
    assert r["max_step_before"] - r["from_step"] == 7


def _rec(i, rank="0"):
    return {"t": float(i), "rank": rank, "node": "n1", "stream": "stdout", "line": f"line {i}"}


def test_output_is_numbered_read_by_cursor_and_acknowledged_by_the_next_read():
    c = Control()
    assert c.output(0) == {"lines": [], "next": 0} and c.output_unread() == 0
    assert c.append_output([_rec(1), _rec(2, "driver")]) == 2
    page = c.output(0)
    assert [(r["seq"], r["rank"], r["line"]) for r in page["lines"]] == [(1, "0", "line 1"), (2, "driver", "line 2")]
    assert page["next"] == 2 and c.output_unread() == 2        # handed out, not yet acknowledged
    c.append_output([_rec(3)])
    assert [r["seq"] for r in c.output(2)["lines"]] == [3] and c.output_unread() == 1
    assert c.output(3) == {"lines": [], "next": 3} and c.output_unread() == 0
    assert [r["seq"] for r in c.output(0, limit=2)["lines"]] == [1, 2]
    assert "output" not in c.snapshot()                         # the snapshot stays small


def test_output_the_head_could_not_hold_comes_back_as_one_note(monkeypatch):
    from spotwise.runtime.training import control

    monkeypatch.setattr(control, "OUTPUT_KEEP", 3)
    c = Control()
    c.append_output([_rec(i) for i in range(1, 6)])                 # 1 and 2 fall out
    page = c.output(0)
    assert page["lines"][0]["rank"] == "spotwise" and "2 lines dropped" in page["lines"][0]["line"]
    assert [r["seq"] for r in page["lines"]] == [2, 3, 4, 5] and page["next"] == 5
    assert [r["seq"] for r in c.output(3)["lines"]] == [4, 5]       # no gap after 3


class _InProcess:
    """The control actor's handle, called in this process: ``.method.remote(...)`` runs it (``ray.get``
    is then the identity)."""

    def __init__(self, control: Control) -> None:
        self.control = control

    def __getattr__(self, name):
        return type("Remote", (), {"remote": staticmethod(getattr(self.control, name))})


def test_the_control_endpoint_serves_the_output_by_cursor(monkeypatch):
    import urllib.error
    import urllib.request

    import pytest
    import ray

    from spotwise.runtime.node.job import ControlClient, ControlServer

    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref)
    c = Control()
    c.append_output([_rec(1), _rec(2, "1")])
    srv = ControlServer(_InProcess(c), host="127.0.0.1", port=0, token="tok").start()
    try:
        url = f"http://127.0.0.1:{srv.port}"
        page = ControlClient(url, "tok").output(0)
        assert [(r["seq"], r["rank"]) for r in page["lines"]] == [(1, "0"), (2, "1")] and page["next"] == 2
        assert ControlClient(url, "tok").output(2) == {"lines": [], "next": 2} and c.output_unread() == 0
        req = urllib.request.Request(f"{url}/v1/output?after=x", headers={"Authorization": "Bearer tok"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        assert e.value.code == 400 and b"after" in e.value.read()
        with pytest.raises(urllib.error.HTTPError) as e:
            ControlClient(url, "wrong").output(0)
        assert e.value.code == 401
    finally:
        srv.stop()


def test_the_driver_ends_once_the_orchestrator_has_read_every_line(monkeypatch):
    import ray

    from spotwise.runtime.node.job import wait_until_read

    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref)
    c = Control()
    assert wait_until_read(_InProcess(c), 30.0) is True                 # nothing printed: at once
    c.append_output([_rec(1)])
    assert wait_until_read(_InProcess(c), 0.0) is False                 # unread, and no time to wait
    page = c.output(0)                                                  # the orchestrator reads ...
    assert wait_until_read(_InProcess(c), 0.0) is False
    c.output(page["next"])                                              # ... and its next read acknowledges
    assert wait_until_read(_InProcess(c), 30.0) is True


def test_every_process_of_the_job_is_told_its_own_cluster():
    """The driver passes the GCS address the job supervisor gave it to every process of the job,
    so none of them finds a cluster by scanning the machine (two local clusters at once)."""
    from spotwise.runtime.node.job import own_cluster_env

    assert own_cluster_env({"RAY_ADDRESS": "127.0.0.1:52011"}) == {"env_vars": {"RAY_ADDRESS": "127.0.0.1:52011"}}
    assert own_cluster_env({"RAY_ADDRESS": "auto"}) is None
    assert own_cluster_env({"RAY_ADDRESS": "http://127.0.0.1:8265"}) is None
    assert own_cluster_env({}) is None


def test_held_out_losses_are_kept_by_step_and_a_remeasured_step_replaces_its_value():
    c = Control()
    c.report_eval(0, 5.5)
    c.report_eval(4, 4.0, 4.2)
    c.report_eval(4, 3.9, float("nan"))          # resumed from before step 4: measured again
    assert c.snapshot()["eval_loss"] == [{"step": 0, "loss": 5.5, "train_loss": None},
                                         {"step": 4, "loss": 3.9, "train_loss": None}]

"""The control actor's contract as a plain object: progress rides on the stop poll, checkpoints
prove progress, and a resume records the highest step heard of before it."""

from spotwise.runtime.control import Control


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

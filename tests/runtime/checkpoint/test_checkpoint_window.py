"""Checkpoints that cannot fit the cloud's notice window: the loop shortens the periodic interval
so a lost node loses about one window of work, and says so (one gloo rank, in-process)."""

from spotwise.runtime.api import CheckpointConfig, ModelConfig, TrainConfig
from spotwise.runtime.training.builtin import gpt_spec
from spotwise.runtime.checkpoint.checkpointer import committed_steps, run_storage
from spotwise.runtime.training.loop import LocalSession, run_loop

TINY = ModelConfig(seq_len=16, d_model=32, n_layers=2, n_heads=2)


def cfg(steps, interval):
    return TrainConfig(model=TINY, steps=steps, batch_size=4, checkpoint=CheckpointConfig(interval_steps=interval, keep_last=50))


def test_a_save_longer_than_the_window_shortens_the_interval(pg1, tmp_path):
    st = run_storage(f"file://{tmp_path}", "tight")
    # no save fits in a nanosecond: from the first periodic save on, checkpoints come as often as
    # one background write allows (here: every step), never less often than before
    res = run_loop(gpt_spec(cfg(steps=14, interval=6), notice_window_s=1e-9, async_save=False), LocalSession(), st)
    w = res.checkpoint_window
    # how short depends on this machine's write time (never below one write): at most as long as before
    assert w is not None and w["interval_before"] == 6 and 1 <= w["interval"] <= 6 and w["save_s"] > w["window_s"]
    steps = committed_steps(st)
    assert 6 in steps and 14 in steps
    # step 6 was saved on the old interval (and measured the save): it need not be a multiple of
    # the new one (an interval of 4 or 5 on a loaded machine), the saves after it are
    assert all(s % w["interval"] == 0 for s in steps if s not in (6, 14))


def test_a_save_that_fits_the_window_changes_nothing(pg1, tmp_path):
    st = run_storage(f"file://{tmp_path}", "roomy")
    res = run_loop(gpt_spec(cfg(steps=14, interval=6), notice_window_s=1e6, async_save=False), LocalSession(), st)
    assert res.checkpoint_window is None
    assert committed_steps(st) == [6, 12, 14]


class _Timed:
    """What :func:`_bound_to_window` reads of the saver: the last save's (stall, write) seconds."""

    def __init__(self, stall: float, write: float) -> None:
        self.cost = (stall, write)

    def save_cost(self) -> tuple[float, float]:
        return self.cost


def test_the_bound_is_one_window_of_work_but_never_below_one_write():
    from spotwise.runtime.training.loop import TrainSpec
    from spotwise.runtime.training.saving import _bound_to_window

    spec = TrainSpec(model_fn=None, batch_fn=None, loss_fn=None, optimizer_fn=None, steps=1000,
                     checkpoint_interval=100, notice_window_s=30.0)
    # a 45 s save at 1 s/step with a 30 s window: every 30 steps (one window of work)
    assert _bound_to_window(_Timed(20.0, 25.0), spec, 1.0, 100) == (
        30, {"window_s": 30.0, "save_s": 45.0, "step_s": 1.0, "interval_before": 100, "interval": 30})
    # the write itself takes 60 s: saves cannot be closer than that
    assert _bound_to_window(_Timed(1.0, 60.0), spec, 1.0, 100)[0] == 60
    # never longer than it was
    assert _bound_to_window(_Timed(1.0, 60.0), spec, 1.0, 20)[0] == 20
    # a save that fits the window changes nothing
    assert _bound_to_window(_Timed(2.0, 20.0), spec, 1.0, 100) == (100, None)

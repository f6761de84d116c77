"""Checkpoints that cannot fit the cloud's notice window: the loop shortens the periodic interval
so a lost node loses about one window of work, and says so (one gloo rank, in-process)."""

from spotwise.runtime.api import ModelConfig, TrainConfig
from spotwise.runtime.builtin import gpt_spec
from spotwise.runtime.checkpoint import committed_steps, run_storage
from spotwise.runtime.loop import LocalSession, run_loop

TINY = ModelConfig(seq_len=16, d_model=32, n_layers=2, n_heads=2)


def cfg(steps, interval):
    return TrainConfig(model_config=TINY, steps=steps, batch_size=4, checkpoint_interval=interval, keep_last=50)


def test_a_save_longer_than_the_window_shortens_the_interval(pg1, tmp_path):
    st = run_storage(f"file://{tmp_path}", "tight")
    # no save fits in a nanosecond: from the first periodic save on, checkpoints come as often as
    # one background write allows (here: every step), never less often than before
    res = run_loop(gpt_spec(cfg(steps=14, interval=6), notice_window_s=1e-9, async_save=False), LocalSession(), st)
    w = res.checkpoint_window
    assert w is not None and w["interval_before"] == 6 and 1 <= w["interval"] < 6 and w["save_s"] > w["window_s"]
    steps = committed_steps(st)
    assert 6 in steps and 14 in steps
    assert all(s % w["interval"] == 0 for s in steps if 6 < s < 14) and len([s for s in steps if 6 < s < 14]) >= 1


def test_a_save_that_fits_the_window_changes_nothing(pg1, tmp_path):
    st = run_storage(f"file://{tmp_path}", "roomy")
    res = run_loop(gpt_spec(cfg(steps=14, interval=6), notice_window_s=1e6, async_save=False), LocalSession(), st)
    assert res.checkpoint_window is None
    assert committed_steps(st) == [6, 12, 14]

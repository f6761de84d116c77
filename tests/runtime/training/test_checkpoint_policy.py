"""CheckpointPolicy: which save a step needs, and what each kind of save does on failure."""

import pytest

from spotwise.runtime.checkpoint.checkpointer import CheckpointInfo, SaveFailed
from spotwise.runtime.training.loop import TrainSpec
from spotwise.runtime.training.saving import CheckpointPolicy


def _spec(**kw) -> TrainSpec:
    return TrainSpec(model_fn=None, batch_fn=None, loss_fn=None, optimizer_fn=None, steps=100, **kw)


class _FakeSaver:
    def __init__(self, fail: bool = False, cost: tuple[float, float] = (0.01, 0.01)) -> None:
        self.fail, self.cost = fail, cost
        self.saved: list[tuple[int, str]] = []

    def periodic(self, step: int) -> None:
        self.saved.append((step, "periodic"))

    def save_sync(self, step: int, kind: str) -> CheckpointInfo:
        if self.fail:
            raise SaveFailed("storage down")
        self.saved.append((step, kind))
        return CheckpointInfo(step=step, uri=f"file:///ck/{step}", kind=kind, world_size=1)

    def save_cost(self) -> tuple[float, float]:
        return self.cost


def test_preemption_outranks_stop_which_outranks_a_periodic_save():
    p = CheckpointPolicy(_spec(checkpoint_interval=5), _FakeSaver())
    assert p.due(10, stop=True, preempt=True) == "preemption"
    assert p.due(10, stop=True, preempt=False) == "stop"
    assert p.due(10, stop=False, preempt=False) == "periodic"
    assert [p.due(s, stop=False, preempt=False) for s in (1, 4, 6, 9)] == [None] * 4


def test_a_failed_just_in_time_save_is_survived_but_a_failed_stop_save_raises():
    p = CheckpointPolicy(_spec(), _FakeSaver(fail=True))
    assert p.save("preemption", 3, 0.1) is None
    with pytest.raises(SaveFailed):
        p.save("stop", 3, 0.1)


def test_without_an_interval_the_first_save_measures_it():
    saver = _FakeSaver(cost=(0.5, 0.5))
    p = CheckpointPolicy(_spec(checkpoint_interval=None, mtbi_s=3600.0), saver)
    assert p.due(1, stop=False, preempt=False) == "periodic"
    assert p.save("periodic", 1, 1.0) is None
    assert saver.saved == [(1, "periodic")]
    assert p.interval == 60         # sqrt(2 * 0.5 s * 3600 s) / 1 s per step
    assert p.due(60, stop=False, preempt=False) == "periodic" and p.due(61, stop=False, preempt=False) is None


def test_the_notice_window_shortens_the_interval_once_on_the_first_timed_save():
    p = CheckpointPolicy(_spec(checkpoint_interval=100, notice_window_s=30.0), _FakeSaver(cost=(20.0, 25.0)))
    p.save("periodic", 100, 1.0)
    assert p.interval == 30 and p.window is not None and p.window["interval_before"] == 100
    p.saver.cost = (100.0, 100.0)
    p.save("periodic", 120, 1.0)
    assert p.interval == 30         # checked once

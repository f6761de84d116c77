"""Issue 51: after the just-in-time checkpoint of a notice, the ranks wait for the noticed node's
deadline (Ray Train restarts the worker group then) — unless the group already fits again without
the draining node(s), e.g. because the noticed node's replacement has joined: then the wait ends at
once. No Ray cluster: the rule is :class:`NoticeWait` over fakes, and :func:`group_fits` over what
``ray.nodes()`` answers. The real thing: tests/e2e/test_launch.py."""

from __future__ import annotations

import types

from ray.train.v2.api.preemption import PreemptionInfo

from spotwise.runtime.training.session import NoticeWait, advance_deadline, group_fits

WORKER = {"CPU": 1.0, "spotwise-worker": 1.0}


def node(nid: str, alive: bool = True, **resources: float) -> dict:
    return {"NodeID": nid, "Alive": alive, "Resources": resources}


HEAD = node("head", **{"spotwise-head": 1.0, "memory": 1e9})
A = node("a", CPU=1.0, **{"spotwise-worker": 1.0})
B = node("b", CPU=1.0, **{"spotwise-worker": 1.0})
C = node("c", CPU=1.0, **{"spotwise-worker": 1.0})


def test_the_group_fits_on_the_nodes_that_are_alive_and_not_draining_by_their_total_resources():
    # a and b run the group now (their resources are taken: totals count, the group's own go back at the
    # restart); b is under notice
    assert not group_fits([HEAD, A, B], {"b"}, WORKER, 2)            # no replacement yet
    assert group_fits([HEAD, A, B, C], {"b"}, WORKER, 2)             # c, the replacement, has joined
    assert not group_fits([HEAD, A, B, node("c", alive=False, CPU=1.0, **{"spotwise-worker": 1.0})], {"b"}, WORKER, 2)
    assert not group_fits([HEAD, A, B, node("c", CPU=1.0)], {"b"}, WORKER, 2)   # not a worker node
    assert not group_fits([HEAD, A, B, C], {"b", "c"}, WORKER, 2)    # the replacement is being drained too
    # GPU nodes: one rank per GPU
    g8 = [node("g1", GPU=8.0, CPU=96.0), node("g2", GPU=8.0, CPU=96.0), node("g3", GPU=8.0, CPU=96.0)]
    assert group_fits(g8, {"g2"}, {"GPU": 1.0}, 16)
    assert not group_fits(g8, {"g2", "g3"}, {"GPU": 1.0}, 16)
    assert not group_fits([HEAD, A, B, C], set(), {}, 2)              # nothing known of the need: never early


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_the_wait_ends_once_the_checkpoint_is_committed_and_the_group_fits_without_the_draining_node():
    fits = [False]
    ended: list[int] = []
    clock = Clock()
    w = NoticeWait(committed=True, fits=lambda: fits[0], end_wait=ended.append, clock=clock)
    assert not w.check() and ended == []                              # the replacement has not joined
    clock.t += 2
    fits[0] = True
    assert w.check() and ended == [1002000]                           # now: the deadline is now
    clock.t += 1
    fits[0] = False                                                    # (a later look does not undo it)
    assert w.check() and ended == [1002000, 1002000] and w.ended_at == 1002.0


def test_without_a_committed_checkpoint_the_ranks_wait_for_the_deadline_as_before():
    asked: list[bool] = []
    ended: list[int] = []
    w = NoticeWait(committed=False, fits=lambda: asked.append(True) or True, end_wait=ended.append, clock=Clock())
    for _ in range(3):
        assert not w.check()
    assert ended == [] and w.ended_at is None


def test_a_ray_that_does_not_answer_is_no_reason_to_restart():
    def fails() -> bool:
        raise ConnectionError("GCS busy")

    ended: list[int] = []
    w = NoticeWait(committed=True, fits=fails, end_wait=ended.append, clock=Clock())
    assert not w.check() and ended == []


def test_advancing_the_deadline_is_what_ray_train_restarts_on():
    # Ray Train's controller restarts the group once the preemption's deadline_ms has passed
    # (PreemptingState); the worker's mark is what it reads
    info = PreemptionInfo(deadline_ms=5_000_000, preempted_node_to_ranks={"b": [1]})
    ctx = types.SimpleNamespace(preemption_info=info)
    assert advance_deadline(ctx, 4_000_000)
    assert ctx.preemption_info == PreemptionInfo(deadline_ms=4_000_000, preempted_node_to_ranks={"b": [1]})
    assert advance_deadline(ctx, 4_500_000)                            # never later than it is
    assert ctx.preemption_info.deadline_ms == 4_000_000
    none = types.SimpleNamespace(preemption_info=PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={}))
    assert advance_deadline(none, 4_000_000) and none.preemption_info.deadline_ms == 4_000_000
    assert not advance_deadline(types.SimpleNamespace(preemption_info=None), 4_000_000)   # no notice: nothing to end


def test_ray_trains_controller_looks_at_the_workers_and_the_drains_twice_a_second_unless_told_otherwise(monkeypatch):
    """What the restart waits on before it starts: the controller's poll of the workers (Ray's default
    every 2 s: on average 1 s between the ranks ending their wait and the restart) and, before the
    checkpoint, its watcher's look at the drains (every 5 s by default). fit() sets both to 0.5 s for
    its controller (Ray Train propagates them from the driver) and leaves a value set by hand alone."""
    import os

    from spotwise.runtime.training.trainer import RAY_TRAIN_POLLS, ray_train_polls

    monkeypatch.delenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", raising=False)
    monkeypatch.setenv("RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "0.2")
    with ray_train_polls():
        assert os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == RAY_TRAIN_POLLS["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.5"
        assert os.environ["RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"] == "0.2"
    assert "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S" not in os.environ
    assert os.environ["RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"] == "0.2"


def test_a_rank_marks_the_notices_checkpoint_committed_where_its_node_asks_before_it_waits(monkeypatch, tmp_path):
    """A Slurm node names a file (``runtime.api.CHECKPOINTED_FILE_ENV``) its batch script waits for
    to end the job: every rank creates it once the notice's checkpoint is committed, before waiting;
    a checkpoint that did not commit marks nothing."""
    import pytest

    from spotwise.runtime.api import CHECKPOINTED_FILE_ENV
    from spotwise.runtime.training import session as sess

    class Waited(Exception):
        pass

    def waiting(**kw):
        raise Waited

    monkeypatch.setattr(sess, "_local_preemption_info", lambda: None)
    monkeypatch.setattr(sess, "NoticeWait", waiting)
    rank = sess.RaySession.__new__(sess.RaySession)
    rank.rank, rank.world_size, rank.need, rank.actor, rank.output = 1, 2, {}, None, None
    for committed in (False, True):
        mark = tmp_path / f"job.{committed}.checkpointed"
        monkeypatch.setenv(CHECKPOINTED_FILE_ENV, str(mark))
        with pytest.raises(Waited):
            rank.after_preemption_checkpoint(committed=committed)
        assert mark.exists() is committed

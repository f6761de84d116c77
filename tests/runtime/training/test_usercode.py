"""A user's ``make_spec`` through the real loop, in process (one gloo rank, no Ray): the task's
settings override the spec's, a preempted run resumes to the uninterrupted run's weights, and an
exception in user code comes out as a ``UserCodeError`` with its traceback's tail."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from spotwise.runtime.api import TrainConfig, TrainJob
from spotwise.runtime.training.control import Control
from spotwise.runtime.node.job import decode_job, encode_job, preflight
from spotwise.runtime.training.loop import LocalSession, run_loop
from spotwise.runtime.storage.base import open_storage
from spotwise.runtime.training.usercode import UserCodeError, load_entrypoint, spec_for

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "own-code" / "regress"
FAILING = '''
from regress.train import make_spec as base


def make_spec(config):
    mode = config["fail_at"]
    spec = base(config)
    inner = spec.loss_fn

    def loss(model, batch):
        if mode == "now":
            raise ValueError("bad batch")
        return inner(model, batch)
    spec.loss_fn = loss
    return spec
'''


@pytest.fixture
def user_pkg(tmp_path, monkeypatch):
    """The example's package copied to a temporary directory on sys.path (as a workdir is)."""
    shutil.copytree(EXAMPLE, tmp_path / "regress")
    (tmp_path / "regress" / "failing.py").write_text(FAILING)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "regress" or m.startswith("regress.")]:
        del sys.modules[name]


def _cfg(**training) -> TrainConfig:
    return TrainConfig.model_validate({"entrypoint": "regress.train:make_spec",
                                       "config": {"width": 16, "batch": 8}, **training})


def test_task_settings_override_the_spec_only_when_given(user_pkg):
    spec = spec_for(_cfg())
    assert (spec.steps, spec.checkpoint_interval, spec.precision) == (300, 25, "fp32")
    spec = spec_for(_cfg(steps=12, precision="auto", checkpoint={"interval_steps": 4, "keep_last": 3}),
                    notice_window_s=30.0)
    assert (spec.steps, spec.checkpoint_interval, spec.keep_last, spec.precision, spec.notice_window_s) == \
        (12, 4, 3, "auto", 30.0)


def test_the_wire_keeps_what_the_task_set(user_pkg):
    job = TrainJob(run_name="r", storage_uri="file:///tmp/x", config=_cfg(steps=12))
    back = decode_job(encode_job(job, control_port=1))[0].config
    assert back.overrides() == {"steps": 12} and back.config == job.config.config


def test_a_preempted_user_run_resumes_to_the_uninterrupted_weights(user_pkg, pg1, tmp_path):
    cfg = _cfg(steps=12, checkpoint={"interval_steps": 5})
    full = run_loop(spec_for(cfg, agree_interval_s=0), LocalSession(), open_storage(f"file://{tmp_path}/a"))
    assert full.steps_completed == 12 and full.model_sha256

    store = open_storage(f"file://{tmp_path}/b")
    session = LocalSession()
    session.preempted = True                  # a notice from the start: JIT checkpoint after step 1
    first = run_loop(spec_for(cfg, agree_interval_s=0), session, store)
    assert first.preempted and first.steps_completed == 1
    again = run_loop(spec_for(cfg, agree_interval_s=0), LocalSession(), store)
    assert again.resumed_from == 1 and again.steps_completed == 12
    assert again.model_sha256 == full.model_sha256


def test_an_exception_in_user_code_is_a_user_error_with_its_traceback(user_pkg, pg1, tmp_path):
    cfg = TrainConfig.model_validate({"entrypoint": "regress.failing:make_spec", "steps": 3,
                                      "config": {"width": 16, "batch": 8, "fail_at": "now"}})
    with pytest.raises(UserCodeError) as e:
        run_loop(spec_for(cfg), LocalSession(), open_storage(f"file://{tmp_path}/c"))
    assert "TrainSpec.loss_fn raised ValueError: bad batch" in str(e.value)
    assert "failing.py" in e.value.tail and "raise ValueError" in e.value.tail


def test_make_spec_errors_and_wrong_returns_are_user_errors(user_pkg):
    with pytest.raises(UserCodeError, match="KeyError"):
        spec_for(TrainConfig.model_validate({"entrypoint": "regress.failing:make_spec", "config": {}}))
    with pytest.raises(UserCodeError, match="returned int, not a spotwise.train.TrainSpec"):
        spec_for(TrainConfig.model_validate({"entrypoint": "builtins:len", "config": {}}))


def test_load_entrypoint_names_what_the_module_has(user_pkg):
    with pytest.raises(UserCodeError, match=r"no function 'nope'; it has: .*make_spec"):
        load_entrypoint("regress.train:nope")
    with pytest.raises(UserCodeError, match="ModuleNotFoundError"):
        load_entrypoint("regress.absent:make_spec")


def test_preflight_fails_a_job_whose_entrypoint_does_not_import(user_pkg):
    ok = TrainJob(run_name="r", storage_uri="file:///tmp/x", config=_cfg())
    assert preflight(ok) is None
    bad = TrainJob(run_name="r", storage_uri="file:///tmp/x",
                   config=TrainConfig.model_validate({"entrypoint": "regress.absent:make_spec"}))
    res = preflight(bad)
    assert res is not None and res.error and res.error.startswith("preflight on the head")
    assert "No module named 'regress.absent'" in res.error


def test_the_control_actor_counts_each_failed_attempt_once():
    c = Control()
    c.report_user_error("a1", 1, "ValueError: x", "tail-1")
    c.report_user_error("a1", 0, "ValueError: x", "tail-0")     # the same attempt, another rank
    c.report_user_error("a2", 0, "ValueError: y", "tail-2")
    assert [(e["rank"], e["tail"]) for e in c.user_errors()] == [(1, "tail-1"), (0, "tail-2")]
    snap = c.snapshot()
    assert len(snap["user_errors"]) == 2 and "tail" not in snap["user_errors"][0]
    assert [e["event"] for e in snap["events"]] == ["user_error", "user_error"]


# -- an exception at step 5: 1 + max_restarts_on_errors attempts, then the run's error -------------
AT_STEP = '''
from regress.train import make_spec as base


def make_spec(config):
    spec = base(config)
    batch = spec.batch_fn

    def batch_fn(step, rank, world):
        if step + 1 == config["fail_at"]:          # while training step 5
            raise ValueError(f"bad batch at step {step + 1}")
        return batch(step, rank, world)
    spec.batch_fn = batch_fn
    return spec
'''


class _Remote:
    """A control actor method called in process: ``.remote(...)`` runs it, ``ray.get`` is identity."""

    def __init__(self, fn) -> None:
        self.remote = fn


class _Actor:
    def __init__(self, control: Control) -> None:
        self.control = control

    def __getattr__(self, name):
        return _Remote(getattr(self.control, name))


class _Session:
    """The worker's RaySession with the run's control actor in this process."""

    def __init__(self, control: Control) -> None:
        self.rank, self.world_size, self.actor = 0, 1, _Actor(control)
        self.stop_reason = None

    local_stop_reason = agreed_stop_reason = lambda self: None
    local_preempted = lambda self: False           # noqa: E731
    report_progress = lambda self, step, loss, perf=None: None   # noqa: E731
    report_checkpoint = lambda self, info: None   # noqa: E731
    report_resume = lambda self, from_step, world: None   # noqa: E731
    close = lambda self: None                     # noqa: E731


@pytest.mark.parametrize("restarts", [0, 2])
def test_an_exception_at_step_5_fails_the_run_after_1_plus_max_restarts_attempts(user_pkg, pg1, tmp_path,
                                                                                monkeypatch, restarts):
    """What Ray Train does with a worker group whose user code raised (it starts a new one, each
    running ``_train_worker`` again) played in process: every attempt up to ``1 +
    max_restarts_on_errors`` trains to step 5 and fails there, the next one gives up before
    training, and its result is the run's error with the traceback's tail. (The orchestrator's half,
    ``failed`` and every node ended, is tests/engine/run/test_orchestrator_run.py's.)"""
    import ray

    from spotwise.runtime.training import session as session_mod
    from spotwise.runtime.training import trainer

    (user_pkg / "regress" / "atstep.py").write_text(AT_STEP)
    control = Control()
    monkeypatch.setattr(session_mod, "RaySession", lambda name, need=None: _Session(control))
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref)
    cfg = TrainConfig.model_validate({"entrypoint": "regress.atstep:make_spec", "steps": 20,
                                      "max_restarts_on_errors": restarts,
                                      "config": {"width": 16, "batch": 8, "fail_at": 5}})
    job = TrainJob(run_name="r", storage_uri=f"file://{tmp_path}/s", config=cfg, control_run_name="r")
    attempts = 0
    while True:                                   # Ray Train's restarts (its max_failures has room)
        try:
            result = trainer._train_worker({"job": job, "overrides": {"agree_interval_s": 0}})
            break
        except UserCodeError as e:
            attempts += 1
            assert "bad batch at step 5" in str(e) and attempts <= 1 + restarts
    assert attempts == 1 + restarts and len(control.user_errors()) == 1 + restarts
    assert result.steps_completed == 0 and result.error is not None
    assert result.error.startswith(f"user code failed in {1 + restarts} attempt(s) (training.max_restarts_on_errors: "
                                   f"{restarts}): TrainSpec.batch_fn raised ValueError: bad batch at step 5")
    assert "atstep.py" in result.error and 'raise ValueError(f"bad batch at step {step + 1}")' in result.error
    # each failed attempt's traceback went to the rank's stderr, and from there into the job's output
    err = [r["line"] for r in control.output(0)["lines"] if r["rank"] == "0" and r["stream"] == "stderr"]
    assert sum("rank 0: TrainSpec.batch_fn raised ValueError: bad batch at step 5" in x for x in err) == 1 + restarts
    assert any(x.strip() == 'raise ValueError(f"bad batch at step {step + 1}")' for x in err)


ON_TOKENS = '''
import torch
from torch import nn

from spotwise.train import TrainSpec, token_batches


class Bigram(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.emb = nn.Embedding(vocab, 16)
        self.blocks = nn.ModuleList([nn.Linear(16, 16)])
        self.out = nn.Linear(16, vocab)

    def forward(self, x):
        return self.out(torch.tanh(self.blocks[0](self.emb(x))))


def make_spec(config):
    vocab = config["vocab"]
    batches = token_batches(seq_len=16, batch_size=8, vocab_size=vocab, seed=3)

    def model():
        torch.manual_seed(0)
        return Bigram(vocab)

    def loss(m, b):
        x, y = b
        return nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten())

    return TrainSpec(model_fn=model, batch_fn=batches, loss_fn=loss,
                     optimizer_fn=lambda p: torch.optim.SGD(p, lr=0.1), steps=12, seed=0, precision="fp32")
'''


@pytest.fixture
def token_file(tmp_path):
    import sysconfig

    from spotwise.cli import main

    out = tmp_path / "data" / "tokens.bin"
    files = sorted((Path(sysconfig.get_paths()["stdlib"]) / "json").glob("*.py"))
    assert main(["data", "tokenize", *map(str, files), str(out)]) == 0
    return out


def test_your_model_on_the_tasks_token_file_resumes_to_the_uninterrupted_weights(user_pkg, pg1, tmp_path,
                                                                                  token_file, monkeypatch):
    """``training.data`` with your own make_spec: ``spotwise.train.token_batches`` gives it the
    built-in models' batches of the task's token file (fetched into the node's cache, a pure
    function of the step), so a preempted run resumes to the uninterrupted weights; the weights
    depend on the file (another seed of its windows trains to others)."""
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    (user_pkg / "regress" / "ontokens.py").write_text(ON_TOKENS)
    cfg = TrainConfig.model_validate({"entrypoint": "regress.ontokens:make_spec", "config": {"vocab": 256},
                                      "data": {"uri": token_file.as_uri()}, "checkpoint": {"interval_steps": 5}})
    full = run_loop(spec_for(cfg, agree_interval_s=0), LocalSession(), open_storage(f"file://{tmp_path}/a"))
    assert full.steps_completed == 12 and full.model_sha256
    store = open_storage(f"file://{tmp_path}/b")
    session = LocalSession()
    session.preempted = True
    first = run_loop(spec_for(cfg, agree_interval_s=0), session, store)
    assert first.preempted and first.steps_completed == 1
    again = run_loop(spec_for(cfg, agree_interval_s=0), LocalSession(), store)
    assert again.resumed_from == 1 and again.model_sha256 == full.model_sha256
    (user_pkg / "regress" / "ontokens.py").write_text(ON_TOKENS.replace("seed=3)", "seed=4)"))
    del sys.modules["regress.ontokens"]
    other = run_loop(spec_for(cfg, agree_interval_s=0), LocalSession(), open_storage(f"file://{tmp_path}/c"))
    assert other.model_sha256 != full.model_sha256


def test_token_batches_refuses_a_file_past_your_vocabulary_and_a_task_without_data(user_pkg, pg1, tmp_path,
                                                                                   token_file, monkeypatch):
    from spotwise.train import token_batches

    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    (user_pkg / "regress" / "ontokens.py").write_text(ON_TOKENS)
    cfg = TrainConfig.model_validate({"entrypoint": "regress.ontokens:make_spec", "config": {"vocab": 100},
                                      "data": {"uri": token_file.as_uri()}})
    with pytest.raises(UserCodeError) as e:          # bytes up to 255 against a vocabulary of 100
        run_loop(spec_for(cfg, agree_interval_s=0), LocalSession(), open_storage(f"file://{tmp_path}/a"))
    assert "training.data.uri" in str(e.value) and "vocabulary of 100" in str(e.value)
    with pytest.raises(ValueError, match="the task has no training.data"):
        token_batches(seq_len=16, batch_size=8, vocab_size=256)
    with pytest.raises(UserCodeError, match="the task has no training.data"):
        spec_for(cfg.model_copy(update={"data": None}))

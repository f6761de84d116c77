"""Your own model through the loop: ``training.entrypoint: "package.module:make_spec"``.

On each rank (a Ray Train worker, or any process with the user's code on ``sys.path``),
:func:`user_spec` imports the function, calls it as ``make_spec(config)`` with the task's
``training.config`` and takes the :class:`~spotwise.runtime.training.spec.TrainSpec` it returns; the task's
``steps``, ``precision`` and checkpoint settings, when given, replace the spec's
(:meth:`~spotwise.runtime.config.TrainConfig.overrides`). The run then goes through the same
:func:`~spotwise.runtime.training.loop.run_loop` as the built-in model, which is what gives it the same
guarantees: exact resume, the just-in-time checkpoint on a notice, the stop at a checkpoint.

An exception raised *by the user's code* (``make_spec`` or any callable of its spec) is an
error, not a preemption: it comes out of the loop as :class:`UserCodeError`, which the trainer
counts against ``training.max_restarts_on_errors``. Errors of the collectives themselves
(``torch.distributed.DistError``: a peer's node went away mid-step) are not wrapped, since a
lost node must be retried like any other preemption even when the user's forward was running.
"""

from __future__ import annotations

import functools
import importlib
import traceback
from dataclasses import fields, replace
from typing import Any, Callable

from spotwise.runtime.config import TrainConfig
from spotwise.runtime.training.spec import TrainSpec

#: how much of a traceback the run's report carries (its tail: the frames nearest the error)
TAIL_CHARS = 4000
#: the spec's callables; an exception raised inside one of them is the user's
USER_CALLABLES = ("model_fn", "batch_fn", "loss_fn", "optimizer_fn", "lr_fn", "shard_blocks")


class UserCodeError(Exception):
    """An exception raised by the user's code; ``tail`` is the end of its traceback."""

    def __init__(self, where: str, error: BaseException) -> None:
        self.where = where
        self.tail = traceback_tail(error)
        super().__init__(f"{where} raised {type(error).__name__}: {error}")


def traceback_tail(error: BaseException, limit: int = TAIL_CHARS) -> str:
    """The last ``limit`` characters of ``error``'s formatted traceback (where it was raised)."""
    text = "".join(traceback.format_exception(error))
    return text if len(text) <= limit else "..." + text[-limit:]


def _infrastructure(error: BaseException) -> bool:
    """A failure of the cluster, not of the user's code: a collective's peer went away."""
    import torch.distributed as dist

    return isinstance(error, getattr(dist, "DistError", ()))


def _guard(where: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserCodeError:
            raise
        except Exception as e:
            if _infrastructure(e):
                raise
            raise UserCodeError(where, e) from e
    return call


def load_entrypoint(ref: str, *, field: str = "training.entrypoint") -> Callable:
    """The function named by ``ref`` (``package.module:function``, the task's ``field``), imported.
    Errors say which of the module or the function is missing (the launch checked both before
    anything ran; this is the nodes' view, which differs only when their environment does)."""
    module_name, _, func = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise UserCodeError(f"importing {module_name}", e) from e
    fn = getattr(module, func, None)
    if not callable(fn):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise UserCodeError(field, AttributeError(
            f"module {module_name!r} has no function {func!r}; it has: {', '.join(names) or '(none)'}"))
    return fn


def guarded(spec: TrainSpec) -> TrainSpec:
    """``spec`` with each user callable wrapped so its exceptions become :class:`UserCodeError`."""
    wrapped: dict[str, Any] = {name: _guard(f"TrainSpec.{name}", getattr(spec, name))
               for name in USER_CALLABLES if getattr(spec, name) is not None and name != "shard_blocks"}
    if spec.shard_blocks is not None:       # what it returns is checked inside the guard: a bad list is its error
        from spotwise.runtime.training.parallel import check_units

        hook = spec.shard_blocks
        wrapped["shard_blocks"] = _guard("TrainSpec.shard_blocks", lambda model: check_units(model, hook(model)))
    return replace(spec, **wrapped)


def user_spec(cfg: TrainConfig, **overrides: Any) -> TrainSpec:
    """The :class:`TrainSpec` of ``cfg``'s user entrypoint: ``make_spec(cfg.config)`` (with the task's
    ``training.data`` bound for :func:`spotwise.train.token_batches`), then the
    task's settings (:meth:`TrainConfig.overrides`), then ``overrides`` (the runtime's own, e.g.
    ``notice_window_s``), with every user callable guarded."""
    from spotwise.runtime.data.dataset import bound

    make_spec = load_entrypoint(cfg.entrypoint)
    try:
        with bound(cfg.data):                 # what spotwise.train.token_batches reads
            spec = make_spec(dict(cfg.config))
    except Exception as e:
        raise UserCodeError(f"{cfg.entrypoint}(config)", e) from e
    if not isinstance(spec, TrainSpec):
        raise UserCodeError("training.entrypoint", TypeError(
            f"{cfg.entrypoint} returned {type(spec).__name__}, not a spotwise.train.TrainSpec"))
    known = {f.name for f in fields(TrainSpec)}
    try:
        spec = replace(spec, **{k: v for k, v in {**cfg.overrides(), **overrides}.items() if k in known})
    except ValueError as e:      # TrainSpec.__post_init__ refused a value
        raise UserCodeError("training", e) from e
    return guarded(spec)


def spec_for(cfg: TrainConfig, **overrides: Any) -> TrainSpec:
    """The spec a run of ``cfg`` trains: a built-in model's (by entrypoint) or the user's."""
    if cfg.user_code:
        return user_spec(cfg, **overrides)
    from spotwise.runtime.training.builtin import builtin_spec

    return builtin_spec(cfg, **overrides)

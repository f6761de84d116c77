"""What a launch was asked for: :class:`LaunchOptions`, and the checks that run before anything else.

``spotwise launch`` (and the service's runner) turn their flags into :class:`LaunchOptions`; the
orchestrator resolves them against the task file once, when it is built, and refuses bad input
with an :class:`~spotwise.errors.InputError` naming the field — before a plan is made or any
node launched: the clouds (:func:`parse_clouds`), the checkpoint storage (:func:`check_storage`,
per cloud in :mod:`spotwise.engine.run.run_stores`), the budget and the options' own timers
(:func:`check_options`), and the task's token file (:func:`check_training_data`).
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Iterator
from pathlib import Path
from urllib.parse import urlparse

from spotwise.config import setting, where
from spotwise.errors import InputError, Problem
from spotwise.paths import home
from spotwise.provisioner.base import cloud_class, known_clouds
from spotwise.runtime.config import TrainConfig
from spotwise.taskspec import TaskSpec

NODE_POLL_S = 20.0         # the monitor asks each cloud which nodes it still lists this often (LaunchOptions.node_poll_s)
MAX_NODE_POLL_S = 300.0   # a node listing rarer than this would leave a lost worker unreplaced too long
NODE_POLL_ENV = "SPOTWISE_NODE_POLL_S"
#: how a store of each scheme is spelt, for errors
_FORM = {"s3": "s3://BUCKET/PREFIX", "gs": "gs://BUCKET/PREFIX", "az": "az://ACCOUNT/CONTAINER/PREFIX"}
#: what a launched run's storage may be (each cloud's nodes reach only some schemes with their own
#: identity: :func:`node_storage_problem`)
REMOTE_STORAGE = ", ".join(list(_FORM.values())[:-1]) + " or " + list(_FORM.values())[-1]


def default_node_poll_s() -> float:
    """``$SPOTWISE_NODE_POLL_S`` when set (an emulated cloud can afford a listing every few
    seconds, and its end-to-end runs should not wait out a real account's period), else
    :data:`NODE_POLL_S`. A value that is not seconds in (0, :data:`MAX_NODE_POLL_S`] is refused,
    naming the variable."""
    raw = setting(NODE_POLL_ENV)
    if not raw:
        return NODE_POLL_S
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not 0 < v <= MAX_NODE_POLL_S:                 # NaN fails this too
        raise InputError(Problem(where(NODE_POLL_ENV), raw, f"seconds between node listings, > 0 and <= "
                                 f"{MAX_NODE_POLL_S:.0f} (15-30 on a real account)"), source="environment")
    return v


@dataclass(kw_only=True)
class LaunchOptions:
    cloud: str | None = None            # comma-separated clouds (overrides the task's); None: the task's, else local
    budget_usd: float | None = None
    preempt_at: list[float] | None = None
    no_preempt: bool = False
    storage: str | dict[str, str] | None = None   # one URI, or cloud -> URI (run_stores.parse_storage_flags)
    trace: str | None = None
    notice_seconds: float | None = None
    progress: bool = False
    tick_s: float = 0.25
    policy_interval_s: float = 5.0
    boot_timeout_s: float = 900.0       # submission -> first training step, or the run fails
    join_timeout_s: float = 600.0       # a worker not ALIVE in Ray this long (since launch or last seen) is replaced
    spot_probe_s: float = 60.0          # on on-demand with spot last seen unobtainable: ask for one spot worker this often
    node_poll_s: float = field(default_factory=default_node_poll_s)  # ask each cloud which nodes it still lists this often


def parse_clouds(value: str | None, spec: TaskSpec) -> list[str]:
    raw = [c.strip() for c in value.split(",") if c.strip()] if value else list(spec.resources.clouds)
    clouds = raw or ["local"]
    bad = [c for c in clouds if c not in known_clouds()]
    if bad:
        raise InputError(Problem("--cloud", ",".join(bad), ", ".join(known_clouds())))
    return list(dict.fromkeys(clouds))


def check_options(spec: TaskSpec, opts: LaunchOptions) -> float | None:
    """The run's budget (the launch's, else the task's), after checking it and the options' timers."""
    budget = opts.budget_usd if opts.budget_usd is not None else spec.budget_usd
    if budget is not None and not (budget > 0 and math.isfinite(budget)):
        raise InputError(Problem("--budget", budget, "a positive, finite number of US dollars"))
    if not (opts.join_timeout_s > 0 and math.isfinite(opts.join_timeout_s)):
        raise InputError(Problem("join_timeout_s", opts.join_timeout_s, "a positive, finite number of seconds"))
    if not (0 < opts.node_poll_s <= MAX_NODE_POLL_S):
        raise InputError(Problem("node_poll_s", opts.node_poll_s,
                                 f"seconds between node listings, > 0 and <= {MAX_NODE_POLL_S:.0f} "
                                 "(15-30 on a real account; shorter only against an emulator)"))
    if not (opts.spot_probe_s > 0 and math.isfinite(opts.spot_probe_s)):
        raise InputError(Problem("spot_probe_s", opts.spot_probe_s, "a positive, finite number of seconds"))
    return budget


#: the node identity settings a dry run found missing (None outside :func:`identity_deferred`)
_DEFERRED: ContextVar[list[Problem] | None] = ContextVar("spotwise_deferred_identity", default=None)


@contextmanager
def identity_deferred() -> Iterator[list[Problem]]:
    """Within it, a node identity setting that is not set at all (``SPOTWISE_AWS_INSTANCE_PROFILE``,
    the GCP service account, the Azure identity) is collected in the yielded list instead of
    refused: ``launch --dry-run`` plans before any infra exists and ends with what a real launch
    still needs. A setting given with a bad value is still refused (bad input, exit 2)."""
    needs: list[Problem] = []
    token = _DEFERRED.set(needs)
    try:
        yield needs
    finally:
        _DEFERRED.reset(token)


def _identity_problems(uri: str, clouds: list[str]) -> list[Problem]:
    """What each cloud's nodes lack to reach ``uri`` as themselves: all of it, or, inside
    :func:`identity_deferred`, only the bad values (the unset settings go to its list)."""
    missing = [p for c in clouds if (p := cloud_class(c).storage_identity_problem(uri)) is not None]
    needs = _DEFERRED.get()
    if needs is None:
        return missing
    needs.extend(p for p in missing if p.given is None and p not in needs)
    return [p for p in missing if p.given is not None]


def check_storage(uri: str, field_name: str, clouds: list[str]) -> str:
    """``uri`` resolved (``${SPOTWISE_HOME}`` and ``~`` expanded, a ``file://`` directory made) as
    the checkpoint storage of a run on ``clouds``, or an :class:`InputError` naming ``field_name``:
    ``file://`` only when every node runs on this machine, a bucket name, a scheme every cloud's
    nodes reach with their own identity, and what each cloud needs for that identity."""
    if uri.startswith("file://"):
        remote = [c for c in clouds if not cloud_class(c).on_this_machine]
        if remote:
            raise InputError(Problem(field_name, uri, f"an s3://, gs:// or az:// URI for a run on {', '.join(remote)}: "
                                                      "nodes on a cloud cannot share this machine's disk"))
        raw = uri[len("file://"):].replace("${SPOTWISE_HOME}", str(home()))
        path = Path(os.path.expanduser(raw)).absolute()
        path.mkdir(parents=True, exist_ok=True)
        return f"file://{path}"
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if scheme not in ("s3", "gs", "az"):
        raise InputError(Problem(field_name, uri, f"file://PATH, {REMOTE_STORAGE} for a launched run"))
    unreadable = node_storage_problem(uri, clouds)
    if unreadable:
        raise InputError(Problem(field_name, uri, unreadable))
    if not urlparse(uri).netloc:
        raise InputError(Problem(field_name, uri, "a URI with a bucket name, e.g. s3://my-bucket/ckpt"))
    if scheme == "az":
        from spotwise.runtime.storage.base import BadStorageUri, check_uri

        try:
            check_uri(uri)
        except BadStorageUri as e:
            raise InputError(Problem(field_name, uri, str(e))) from None
    missing = _identity_problems(uri, clouds)
    if missing:
        raise InputError(missing)
    return uri


def node_storage_problem(uri: str, clouds: list[str]) -> str | None:
    """What ``uri`` should be instead when some of ``clouds`` launch nodes that cannot reach its
    scheme with their own identity (each cloud's ``node_storage_schemes``: an AWS node has its
    instance profile for ``s3://``, a GCP node its service account for ``gs://``, an Azure node its
    managed identity for ``az://``; keys baked into an image are not an identity); None when every
    cloud's nodes can."""
    scheme = uri.split("://", 1)[0]
    remote = [c for c in clouds if not cloud_class(c).on_this_machine]
    bad = [c for c in remote if scheme not in cloud_class(c).node_storage_schemes]
    if not bad:
        return None
    why = f"({', '.join(bad)} nodes cannot reach {scheme}:// with their own identity)"
    common = set.intersection(*(set(cloud_class(c).node_storage_schemes) for c in remote))
    if len(remote) > 1 and not common:
        each = ", ".join(f"{c}: {_FORM[cloud_class(c).node_storage_schemes[0]]}" for c in remote)
        return (f"one store per cloud, each reachable by that cloud's nodes: training.checkpoint.storage: "
                f"{{{each}}} or --storage {' --storage '.join(c + '=URI' for c in remote)} {why}")
    wanted = sorted(common)
    return f"a URI whose nodes have an identity for it: {' or '.join(_FORM[s] for s in wanted)} {why}"


def check_eval_data(spec: TaskSpec) -> None:
    """``training.eval.data`` checked before launch like ``training.data`` (its meta.json, its
    vocabulary against the model's, at least one window, the file's size; not downloaded): an
    :class:`InputError` naming ``training.eval.data``."""
    from spotwise.runtime.data.dataset import check_data, data_needs

    ev = spec.training.eval
    needs = data_needs(spec.training)
    if ev is None or needs is None:
        return
    import dataclasses

    try:
        check_data(ev.data, dataclasses.replace(needs, batch_size=1))
    except InputError as e:
        raise InputError([Problem("training.eval.data", p.given, p.allowed) for p in e.problems],
                         source="data") from None


def check_training_data(spec: TaskSpec, clouds: list[str]) -> dict | None:
    """The task's ``training.data`` checked before anything launches: a ``file://`` token file only
    when every node runs on this machine, then its ``meta.json`` and size against the built-in
    model (:func:`spotwise.runtime.data.dataset.check_data`; the token file is not downloaded). Returns
    the meta (None without ``training.data``). An :class:`InputError` naming ``training.data.uri``
    for what the run could not train on; a :class:`~spotwise.errors.SpotwiseError` (exit 1) when
    the store cannot be read at all (no bucket, no credentials, no network)."""
    from spotwise.errors import SpotwiseError
    from spotwise.runtime.data.dataset import check_data, data_needs

    check_eval_data(spec)
    data = spec.training.data
    if data is None:
        return None
    if data.uri.startswith("file://"):
        remote = [c for c in clouds if not cloud_class(c).on_this_machine]
        if remote:
            raise InputError(Problem("training.data.uri", data.uri, f"an s3://, gs:// or az:// URI for a run on "
                                     f"{', '.join(remote)}: nodes on a cloud cannot read this machine's disk"))
    if "://" in data.uri and not data.uri.startswith("file://"):
        if bad := node_storage_problem(data.uri, clouds):
            raise InputError(Problem("training.data.uri", data.uri, bad))
        missing = _identity_problems(data.uri, clouds)
        if missing:
            raise InputError(missing)
    try:
        return check_data(data.uri, data_needs(spec.training), sha256=data.sha256)
    except SpotwiseError:
        raise
    except Exception as e:  # noqa: BLE001 - any storage failure: one line naming the field, no traceback
        raise SpotwiseError(f"training.data.uri {data.uri}: cannot read it ({type(e).__name__}: "
                            f"{str(e)[:200]})") from None


def pin_training_data(training: TrainConfig, meta: dict | None) -> TrainConfig:
    """``training`` with ``data.sha256`` set to the checked meta's, so every node of the run, and
    every resume, trains on the file that was checked (a file tokenized again to the same URI
    mid-run is refused by the runtime rather than trained on); unchanged without ``data``."""
    if training.data is None or meta is None:
        return training
    return training.model_copy(update={"data": training.data.model_copy(update={"sha256": meta["sha256"]})})


def task_as_run(spec: TaskSpec, opts: LaunchOptions, clouds: list[str], storage: str | dict[str, str]) -> dict:
    """The task as a launch runs it, as stored with its job: the task file's keys plus what the
    launch's flags decided — the clouds, the checkpoint storage (resolved: ``${SPOTWISE_HOME}``
    and ``~`` expanded; one URI, or each cloud's) and the local cloud's simulated market. A resume
    (:mod:`spotwise.engine.work.resume`) runs this task again under the same job id, so it finds the
    run's checkpoints where the first leg wrote them, on the clouds it ran on."""
    from spotwise.taskspec import task_doc

    doc = task_doc(spec)
    doc.setdefault("resources", {})["clouds"] = list(clouds)
    doc.setdefault("training", {}).setdefault("checkpoint", {})["storage"] = storage
    local = doc.setdefault("local", {})
    if opts.no_preempt:
        local["preempt_at"] = []
        local.pop("trace", None)
    else:
        if opts.preempt_at is not None:
            local["preempt_at"] = list(opts.preempt_at)
        if opts.trace:
            local["trace"] = str(Path(opts.trace).absolute())
    if opts.notice_seconds is not None:
        local["notice_seconds"] = opts.notice_seconds
    if not local:
        doc.pop("local")
    return doc

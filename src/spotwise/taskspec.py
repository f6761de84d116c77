"""``TaskSpec``: the YAML task file — what to train, on what, within which budget and deadline.

Validated with pydantic; every problem in a file is reported at once as (field path, what was
given, what is allowed) through :class:`~spotwise.errors.InputError`, never as a traceback.

Numbers are finite everywhere (``allow_inf_nan=False`` on every model): a ``budget_usd: .nan``
would make every cap comparison false, and ``1e400`` (YAML reads it as infinity) once stored made
every later read of the job fail. The checkpoint storage URI is checked for what no node could
use (a host in a ``file://`` URI, a bucket name the cloud refuses) and ``policy`` is ``auto`` or names a
registered policy, so a bad file is refused before anything launches.

The ``training:`` section is the runtime's own :class:`~spotwise.runtime.config.TrainConfig`
(with its ``model:`` and ``checkpoint:``), not a copy of it: the component that uses a setting
owns its declaration, bounds and error messages, and the orchestrator passes the section on as is.
This module owns what only the task has: its name, resources, budget, deadline, policy and the
local cloud's simulated market.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from spotwise.errors import InputError, Problem
from spotwise.runtime.config import StrictModel, TrainConfig

if TYPE_CHECKING:
    from spotwise.policies.traces import Trace
    from spotwise.taskcode import UserCode

KNOWN_ACCELERATORS = ("A100", "A100-80GB", "H100", "H100-NVL", "H200", "L4", "L40S", "A10G", "A10",
                      "V100", "V100-32GB", "cpu")
STORAGE_SCHEMES = ("file://", "s3://")


def parse_accelerators(value: Any) -> dict[str, int]:
    """``"H100:8"`` or ``{"H100": 8, "A100-80GB": 8}`` (alternatives) -> ``{name: count}``."""
    if isinstance(value, str):
        items: dict[str, Any] = {}
        for part in value.split(","):
            name, _, count = part.strip().partition(":")
            items[name.strip()] = count.strip() or 1
        value = items
    if not isinstance(value, dict) or not value:
        raise ValueError("expected 'NAME:COUNT' or a mapping {NAME: COUNT}")
    out: dict[str, int] = {}
    canon = {a.lower(): a for a in KNOWN_ACCELERATORS}
    for name, count in value.items():
        key = canon.get(str(name).lower())
        if key is None:
            raise ValueError(f"unknown accelerator {name!r}; allowed: {', '.join(KNOWN_ACCELERATORS)}")
        try:
            n = int(count)
        except (TypeError, ValueError):
            raise ValueError(f"count for {name} must be a whole number, got {count!r}") from None
        if n < 1 or n > 16:
            raise ValueError(f"count for {name} must be 1..16, got {n}")
        out[key] = n
    return out


class Resources(StrictModel):
    accelerators: dict[str, int] = Field(default_factory=lambda: {"cpu": 1})
    nodes: int = Field(default=1, ge=1, le=256)
    clouds: list[str] = Field(default_factory=list)
    regions: list[str] = Field(default_factory=list)
    market: Literal["spot", "on-demand", "auto"] = "auto"
    max_price_per_hour: float | None = Field(default=None, gt=0)

    @field_validator("accelerators", mode="before")
    @classmethod
    def _acc(cls, v: Any) -> dict[str, int]:
        return parse_accelerators(v)

    @field_validator("clouds", mode="before")
    @classmethod
    def _clouds(cls, v: Any) -> list[str]:
        from spotwise.provisioner.base import known_clouds

        if isinstance(v, str):
            v = [c.strip() for c in v.split(",") if c.strip()]
        allowed = known_clouds()
        bad = [c for c in v if c not in allowed]
        if bad:
            raise ValueError(f"unknown cloud(s) {bad}; allowed: {', '.join(allowed)}")
        return list(v)


class LocalMarket(StrictModel):
    """The local cloud's simulated spot market (ignored by real clouds)."""

    preempt_at: list[float] = Field(default_factory=list)   # seconds after training starts
    trace: str | None = None                                # spot trace JSON (1 = available)
    trace_tick_seconds: float | None = Field(default=None, gt=0)  # replay speed: wall s per trace tick
    notice_seconds: float = Field(default=5.0, ge=0, le=120)

    @field_validator("preempt_at")
    @classmethod
    def _times(cls, v: list[float]) -> list[float]:
        if any(t < 0 for t in v):
            raise ValueError("times must be >= 0 seconds")
        return sorted(v)


class TaskSpec(StrictModel):
    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9-]*$")
    resources: Resources = Field(default_factory=Resources)
    training: TrainConfig = Field(default_factory=TrainConfig)
    budget_usd: float | None = Field(default=None, gt=0)
    deadline_hours: float | None = Field(default=None, gt=0)
    priority: Literal["deadline", "budget"] = "budget"
    # a registered policy, or ``auto`` (the default): see ``policy_name``
    policy: str = Field(default="auto", max_length=64)
    local: LocalMarket = Field(default_factory=LocalMarket)
    # the zone's spot availability before the job starts (a trace JSON: data + metadata.gap_seconds);
    # shown to the policy before its first tick (Policy.observe_history); spotwise learns from it
    spot_history: str | None = Field(default=None, min_length=1)
    # without spot_history: how many hours of what earlier runs recorded at the plan's site and
    # instance type the policy is shown (spotwise.engine.state.spot_log); 0 shows none
    spot_history_hours: float = Field(default=168.0, ge=0, le=2160)
    # the task's own code (``training.entrypoint: package.module:function``): the directory that
    # holds it (shipped to the nodes), its requirements (a list, or a requirements file) and
    # environment variables; see spotwise.taskcode
    workdir: str | None = Field(default=None, min_length=1)
    pip: list[str] | str | None = None
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        import re

        for k in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"{k!r}: environment variable names are letters, digits and _, not starting with a digit")
            if k.upper().startswith(("SPOTWISE_", "RAY_")):
                raise ValueError(f"{k!r}: SPOTWISE_* and RAY_* variables are the cluster's own; choose another name")
        return v

    @model_validator(mode="after")
    def _code_needs_entrypoint(self) -> TaskSpec:
        if not self.training.user_code and (self.workdir is not None or self.pip is not None):
            raise ValueError("workdir and pip ship your own code: set training.entrypoint (or training.train_func) "
                             "to 'package.module:function' (the built-in tiny-gpt needs neither)")
        # that the batch splits over the ranks is checked per offer when the run is planned: the world
        # size is nodes x the offer's GPUs per node, not nodes (spotwise.engine.plan.ranks)
        return self

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        from spotwise.policies.base import known_policies

        allowed = known_policies()
        if v != "auto" and v not in allowed:
            raise ValueError(f"auto or a registered policy: {', '.join(allowed)}")
        return v

    @property
    def policy_name(self) -> str:
        """The policy that steers a ``market: auto`` run: the one the task names; for ``auto``,
        ``spotwise`` when the task has a deadline (least expected cost that still meets it, issue 19),
        else ``spot-fallback`` (spot, on-demand after repeated capacity errors: with no deadline a
        cost-only policy would wait out every outage, however long). Resolved here rather than when
        the file is read, so a deadline given later (the API's, a schedule's) chooses it too."""
        if self.policy != "auto":
            return self.policy
        return "spotwise" if self.deadline_hours is not None else "spot-fallback"


def task_doc(spec: TaskSpec) -> dict[str, Any]:
    """``spec`` as stored (a job's or a schedule's task): the keys the task *set*, as JSON.

    Not the whole model: a stored task is validated again when it runs, and every key in it is
    then "set" (``model_fields_set``); a user entrypoint's spec would have its own steps,
    precision and checkpoint settings replaced by the defaults (``TrainConfig.overrides``), and
    a check of what a task sets (the service's user-code gate) would see defaults as given."""
    return spec.model_dump(mode="json", exclude_unset=True)


def _problems(err: ValidationError, data: Any) -> list[Problem]:
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(file)"
        given = e.get("input", None)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "this field is not part of a task file (check its spelling)"
        elif e["type"] == "missing":
            given, msg = None, "this field is required"
        out.append(Problem(loc, given, msg))
    return out


def resolve_init_from(data: Any, *, source: str = "task") -> Any:
    """``data`` (a raw task mapping) with ``training.model`` filled from the ``config.json`` of the
    directory that ``training.init_from`` names (:func:`spotwise.runtime.weights.config.resolve_training`):
    read once, when a task file or an API body comes in, so the stored spec carries the whole
    architecture. A missing or unusable config.json, or a flavor or dimension that conflicts
    with it, is an :class:`InputError` naming ``training.init_from``."""
    training = data.get("training") if isinstance(data, dict) else None
    if not isinstance(training, dict) or not isinstance(training.get("init_from"), str):
        return data
    from spotwise.runtime.weights.config import HFConfigError, resolve_training
    from spotwise.runtime.storage.base import BadStorageUri

    try:
        return {**data, "training": resolve_training(training)}
    except (HFConfigError, BadStorageUri) as e:
        raise InputError(Problem("training.init_from", training["init_from"], str(e)), source=source) from None


def parse_taskspec(data: Any, *, source: str = "task") -> TaskSpec:
    if not isinstance(data, dict):
        raise InputError(Problem("(file)", type(data).__name__, "a YAML mapping with at least 'name'"),
                         source=source)
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as e:
        raise InputError(_problems(e, data), source=source) from None


TRACE_ALLOWED = 'a spot trace JSON file this process can read: {"data": [1, 0, ...]} (1 = spot available)'
MAX_TRACE_BYTES = 64 << 20


def check_trace_file(path: str, *, field: str = "local.trace") -> str:
    """``path`` when it is a spot trace the local market can replay; else an :class:`InputError`.

    The message is the same whether the file is missing, a directory, unreadable or not a trace,
    so a caller of the API cannot use this check to learn which files exist on the server."""
    try:
        p = Path(path)
        if p.stat().st_size > MAX_TRACE_BYTES:
            raise ValueError("too large")
        import json

        data = json.loads(p.read_bytes())
        ticks = data["data"]
        if not isinstance(ticks, list) or not ticks or any(x not in (0, 1) or isinstance(x, float) for x in ticks):
            raise ValueError("not a trace")
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        raise InputError(Problem(field, path, TRACE_ALLOWED), source="task") from None
    return path


HISTORY_ALLOWED = ('a spot trace JSON file this process can read: {"data": [1, 0, ...], '
                   '"metadata": {"gap_seconds": 600}} (1 = spot available)')


def load_history(path: str, *, field: str = "spot_history") -> Trace:
    """The spot trace at ``path`` (:func:`~spotwise.policies.traces.load_trace`), for ``spot_history``;
    else an :class:`InputError` naming ``field``, with the same message whatever the failure (as
    :func:`check_trace_file`)."""
    from spotwise.policies.traces import load_trace

    try:
        if Path(path).stat().st_size > MAX_TRACE_BYTES:
            raise ValueError("too large")
        return load_trace(path)
    except (OSError, ValueError, TypeError, KeyError, RecursionError, InputError):
        raise InputError(Problem(field, path, HISTORY_ALLOWED), source="task") from None


def user_code(spec: TaskSpec, *, base: Path | None = None, source: str = "task") -> UserCode:
    """The task's own code, checked (:func:`spotwise.taskcode.check_code`): a relative ``workdir``
    or requirements file is relative to ``base`` (the task file's directory; by default the
    current one). Every problem at once as an :class:`InputError`, before anything launches."""
    from spotwise.taskcode import check_code

    field, ref = spec.training.user_ref
    code, problems = check_code(entrypoint=ref, user_code=spec.training.user_code, field=field,
                                workdir=spec.workdir, pip=spec.pip, env=spec.env, base=base or Path.cwd())
    if problems:
        raise InputError(problems, source=source)
    return code


def load_taskspec(path: str | Path) -> TaskSpec:
    """Read and validate a task file; a ``local.trace`` or ``spot_history`` it names must be a
    readable trace, and the task's own code (workdir, pip, entrypoint) must pass
    :func:`user_code`'s checks. The returned spec holds the workdir as an absolute path and
    ``pip`` as the list of requirements (read from the file it named)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(Problem("TASK", str(path), "an existing YAML task file"), source="task")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(Problem("TASK", str(path), f"a UTF-8 text file (byte {e.start} is not UTF-8)"),
                         source="task") from None
    except OSError as e:
        raise InputError(Problem("TASK", str(path), f"a readable YAML task file ({e.strerror})"),
                         source="task") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        raise InputError(Problem(where, str(getattr(e, "problem", e)), "valid YAML"), source=str(p)) from None
    spec = parse_taskspec(resolve_init_from(data, source=str(p)), source=str(p))
    code = user_code(spec, base=p.resolve().parent, source=str(p))
    if code.workdir is not None or code.pip:
        spec = spec.model_copy(update={"workdir": str(code.workdir.path) if code.workdir else code.workdir_uri,
                                       "pip": list(code.pip) if spec.pip is not None else None})
    if spec.local.trace:
        check_trace_file(spec.local.trace)
    if spec.spot_history:
        load_history(spec.spot_history)
    return spec

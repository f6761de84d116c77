"""spotwise's configuration file: ``$SPOTWISE_CONFIG``, else ``~/.config/spotwise/config.yaml``.

One YAML file, validated with the same field-path errors as task files (:class:`InputError`). A
missing file is an empty configuration; a file that exists but does not parse or validate is an
error naming the field, never a silent default.

Skeleton (sixth session): the ``slurm.clusters`` section and the file's loading. Issue 36 grows it to
every per-cloud setting (the environment still wins) and ``spotwise config show``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from spotwise.errors import InputError, Problem


class SlurmPartitionConfig(BaseModel):
    """What the team charges itself for one GPU-hour on a partition (0 allowed; shown in plans)."""

    model_config = ConfigDict(extra="forbid")

    price_per_gpu_hour: float = Field(ge=0)

    @field_validator("price_per_gpu_hour")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("a finite number of dollars per GPU-hour, >= 0")
        return v


class SlurmClusterConfig(BaseModel):
    """One Slurm cluster: ``name`` becomes its offers' region, each partition named here a zone.

    What the cluster has (partitions, nodes, gres, time limits, preemption) is read from the cluster
    itself, never retyped here; only the price is the team's own."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,39}$")
    slurm_conf: str | None = None   # Slurm's own default (SLURM_CONF or /etc/slurm/slurm.conf) when None
    ssh: str | None = None          # user@login-host: the same commands over ssh; None runs them here
    partitions: dict[str, SlurmPartitionConfig] = Field(min_length=1)


class SlurmSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    clusters: list[SlurmClusterConfig] = Field(default_factory=list)


class ConfigFile(BaseModel):
    """The whole file. Unknown keys are errors (a misspelt key must not be ignored)."""

    model_config = ConfigDict(extra="forbid")

    slurm: SlurmSection = Field(default_factory=SlurmSection)


def config_path() -> Path:
    """``$SPOTWISE_CONFIG`` when set, else ``~/.config/spotwise/config.yaml``."""
    env = os.environ.get("SPOTWISE_CONFIG")
    return Path(env) if env else Path.home() / ".config" / "spotwise" / "config.yaml"


def _problems(err: ValidationError) -> list[Problem]:
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(file)"
        given: Any = e.get("input", None)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "this key is not part of spotwise's config file (check its spelling)"
        elif e["type"] == "missing":
            given, msg = None, "this key is required"
        out.append(Problem(loc, given, msg))
    return out


def load(path: Path | None = None) -> ConfigFile:
    """The configuration file at ``path`` (default :func:`config_path`), validated; an empty
    :class:`ConfigFile` when there is none. A set ``$SPOTWISE_CONFIG`` naming a missing file is an
    error: the user pointed at it."""
    p = path or config_path()
    explicit = path is not None or bool(os.environ.get("SPOTWISE_CONFIG"))
    if not p.is_file():
        if explicit:
            raise InputError(Problem("SPOTWISE_CONFIG", str(p), "an existing YAML config file"), source="config")
        return ConfigFile()
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(Problem("(file)", str(p), f"a readable UTF-8 YAML file ({e})"), source=str(p)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        raise InputError(Problem(where, str(getattr(e, "problem", e)), "valid YAML"), source=str(p)) from None
    if data is None:
        return ConfigFile()
    if not isinstance(data, dict):
        raise InputError(Problem("(file)", type(data).__name__, "a YAML mapping"), source=str(p))
    try:
        return ConfigFile.model_validate(data)
    except ValidationError as e:
        raise InputError(_problems(e), source=str(p)) from None


def slurm_clusters() -> list[SlurmClusterConfig]:
    """The Slurm clusters the effective config file names ([] when none)."""
    return load().slurm.clusters

"""spotwise's configuration file: ``$SPOTWISE_CONFIG``, else ``~/.config/spotwise/config.yaml``.

One YAML file, validated with the same field-path errors as task files (:class:`InputError`). A
missing file is an empty configuration; a file that exists but does not parse or validate is an
error naming the field, never a silent default.

Every user-facing ``SPOTWISE_*`` environment variable is one :class:`Setting` in :data:`SETTINGS`,
which pairs it with its key in the file (``SPOTWISE_AWS_REGIONS`` ↔ ``aws.regions``); the file's
schema is built from that list, so a setting cannot be readable from one and not the other. The
product reads a setting only through :func:`setting`: the environment when set (non-empty), else
the file, rendered as the variable would be spelt (a list comma-joined, a bool ``1``/``0``), so
every existing parser (and its error) keeps working unchanged. The environment wins so that one
shell, one test or one CI job can override the file without editing it.

The file is parsed once per (path, mtime, size): hot paths (each API request, each monitor tick)
pay an ``os.stat``, not a YAML parse.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, create_model, field_validator

from spotwise.errors import InputError, Problem
from spotwise.utils.ssh import parse_destination


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
    # user@login-host or ssh://user@login-host:port: the same commands (and the launch, its head
    # reached through ssh port forwards) over ssh; None runs them here (spotwise.utils.ssh)
    ssh: str | None = None
    partitions: dict[str, SlurmPartitionConfig] = Field(min_length=1)
    # The nodes' base Python (absolute path on the nodes; >= 3.11, with torch and Ray): each node
    # makes a venv over it and installs the build the launch shipped. None: the first Python >= 3.11
    # a node finds, as on a cloud image (docs/slurm.md).
    python: str | None = None

    @field_validator("ssh")
    @classmethod
    def _ssh(cls, v: str | None) -> str | None:
        if v is not None:
            parse_destination(v)        # its ValueError names what is accepted
        return v

    @field_validator("python")
    @classmethod
    def _python(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"/[^\s'\"$`\\]+", v):
            raise ValueError("an absolute path to a Python >= 3.11 on the nodes (with torch and Ray), "
                             "without spaces or quotes, or null to use the first one a node finds")
        return v


class SlurmSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    clusters: list[SlurmClusterConfig] = Field(default_factory=list)


class ConfigFile(BaseModel):
    """The whole file. Unknown keys are errors (a misspelt key must not be ignored).

    :func:`load` returns an instance of a subclass that adds one section per group of
    :data:`SETTINGS` (``aws``, ``gcp``...), built from that registry."""

    model_config = ConfigDict(extra="forbid")

    slurm: SlurmSection = Field(default_factory=SlurmSection)


# -- the settings: one registry, env name <-> file key ---------------------------------------------

#: What each kind of setting is in the file, in the words an error uses.
KINDS = {
    "str": "a string",
    "path": "a path (a string; ~ is expanded)",
    "list": "a list of strings, e.g. [a, b]",
    "int": "a whole number",
    "float": "a finite number",
    "bool": "true or false",
    "port": "a TCP port, a whole number 1..65535",
}


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: its environment variable, its key in the file (``section.name``, or a bare
    ``name`` at the top), its kind (:data:`KINDS`), what it is for (with its default), and how
    ``config show`` masks it (``"all"``: a secret; ``"url"``: a URL's password; None: shown)."""

    env: str
    key: str
    kind: str
    help: str
    mask: str | None = None


def _s(env: str, key: str, kind: str, help: str, mask: str | None = None) -> Setting:
    return Setting(env, key, kind, help, mask)


#: Every user-facing setting, in the order ``config show`` prints them.
SETTINGS: tuple[Setting, ...] = (
    _s("SPOTWISE_HOME", "home", "path", "state directory: database, price cache, logs (default ~/.local/share/spotwise)"),
    _s("SPOTWISE_DATABASE_URL", "database.url", "str",
       "SQLAlchemy URL of the database (default SQLite in the home); PostgreSQL for a shared server", "url"),
    _s("SPOTWISE_STORAGE_REGION", "storage.region", "str",
       "region of the checkpoint store, for egress prices (s3: else AWS_REGION)"),
    _s("SPOTWISE_FILE_STORAGE_ROOT", "storage.file_root", "path",
       "where file:// storage of API-submitted jobs must live (default <home>/checkpoints)"),
    _s("SPOTWISE_MAX_BODY_BYTES", "service.max_body_bytes", "int", "largest API request body (default 1 MiB)"),
    _s("SPOTWISE_SERVE_USER_CODE", "service.serve_user_code", "bool",
       "whether the API server runs tasks with code of their own (default false)"),
    _s("SPOTWISE_NODE_POLL_S", "nodes.poll_s", "float", "seconds between node listings during a run (default 20)"),
    _s("SPOTWISE_LOCAL_EMULATED_GPUS", "local.emulated_gpus", "int",
       "tests and benchmarks only: each local worker node declares this many GPUs to Ray and trains as many CPU "
       "ranks over gloo, so an 8-GPU node's per-rank arithmetic runs on a CPU (default 0: one rank a node)"),
    _s("SPOTWISE_NODE_LEASE_S", "nodes.lease_s", "float",
       "the node lease's term: a dead runner's nodes end after it (default 60, 15..3600)"),
    _s("SPOTWISE_RAY_PORT", "nodes.ray_port", "port", "Ray's GCS port on a cloud's nodes (default 6379)"),
    _s("SPOTWISE_RAY_DASHBOARD_PORT", "nodes.ray_dashboard_port", "port",
       "Ray dashboard/Jobs API port on a cloud's nodes (default 8265)"),
    _s("SPOTWISE_CONTROL_PORT", "nodes.control_port", "port",
       "the job's control endpoint port on a cloud's head (default 8266)"),
    _s("SPOTWISE_HEAD_PATH", "nodes.head_path", "str",
       "how the launcher reaches a cloud's head: ssh (default: its public address, a key per cluster) "
       "or private[:REGION,...] (this launcher is inside those regions' networks)"),
    _s("SPOTWISE_HEAD_SSH_USER", "nodes.head_ssh_user", "str",
       "the head's user the launcher's ssh logs in as (default spotwise, made by the boot script)"),
    _s("SPOTWISE_LAUNCHER_CIDR", "nodes.launcher_cidr", "str",
       "the CIDR a head's port 22 opens to (default this launcher's public IPv4 address, /32)"),
    _s("SPOTWISE_AWS_REGIONS", "aws.regions", "list", "AWS regions gc/down scan (default: the enabled GPU regions)"),
    _s("SPOTWISE_AWS_SUBNETS", "aws.subnets", "list", "subnet ids nodes launch into (infra/aws)"),
    _s("SPOTWISE_AWS_HEAD_SUBNETS", "aws.head_subnets", "list",
       "public subnet ids a head reached over ssh launches into (infra/aws head_subnet_ids)"),
    _s("SPOTWISE_AWS_SECURITY_GROUPS", "aws.security_groups", "list", "extra security groups for nodes"),
    _s("SPOTWISE_AWS_INSTANCE_PROFILE", "aws.instance_profile", "str",
       "instance profile nodes carry (needed for s3:// storage)"),
    _s("SPOTWISE_AWS_STORAGE", "aws.storage", "str",
       "checkpoint store of runs on AWS that name none: s3://BUCKET/PREFIX (infra/aws bucket)"),
    _s("SPOTWISE_AWS_AMI", "aws.ami", "str", "AMI id for nodes (default: from aws.ami_parameter)"),
    _s("SPOTWISE_AWS_AMI_PARAMETER", "aws.ami_parameter", "str",
       "SSM parameter naming the AMI (default: the Deep Learning AMI's)"),
    _s("SPOTWISE_AWS_SPOT_STRATEGY", "aws.spot_strategy", "str",
       "EC2 Fleet spot allocation strategy (default price-capacity-optimized)"),
    _s("SPOTWISE_AWS_HEAD_TYPE", "aws.head_type", "str", "instance type of the Ray head (default m6i.large)"),
    _s("SPOTWISE_AWS_CLIENT_CIDRS", "aws.client_cidrs", "list",
       "CIDRs allowed to reach the head's dashboard/control ports (default the VPC)"),
    _s("SPOTWISE_GCP_PROJECT", "gcp.project", "str", "GCP project to launch in and price for"),
    _s("SPOTWISE_GCP_IMAGE", "gcp.image", "str", "boot image (default the Deep Learning VM CUDA family)"),
    _s("SPOTWISE_GCP_NETWORK", "gcp.network", "str", "VPC network (default global/networks/default)"),
    _s("SPOTWISE_GCP_SUBNETWORK", "gcp.subnetwork", "str", "subnetwork (default the network's auto one)"),
    _s("SPOTWISE_GCP_SERVICE_ACCOUNT", "gcp.service_account", "str",
       "service account nodes carry: an email, or 'default' (required for gs:// storage)"),
    _s("SPOTWISE_GCP_STORAGE", "gcp.storage", "str",
       "checkpoint store of runs on GCP that name none: gs://BUCKET/PREFIX"),
    _s("SPOTWISE_GCP_NODE_SCOPES", "gcp.node_scopes", "list",
       "OAuth scopes of the nodes' service account (default devstorage.read_write,compute)"),
    _s("SPOTWISE_GCP_EXTERNAL_IP", "gcp.external_ip", "bool", "give nodes an external IP (default false)"),
    _s("SPOTWISE_GCP_HEAD_TYPE", "gcp.head_type", "str", "machine type of the Ray head"),
    _s("SPOTWISE_GCP_CLIENT_CIDRS", "gcp.client_cidrs", "list",
       "CIDRs allowed to reach the head's dashboard/control ports (default the subnet)"),
    _s("SPOTWISE_GCP_API_KEY", "gcp.api_key", "str", "Cloud Billing API key for live prices (else GOOGLE_API_KEY)",
       "all"),
    _s("SPOTWISE_GCP_ENDPOINT", "gcp.endpoint", "str", "Compute API endpoint (tests: a local fake)"),
    _s("SPOTWISE_GCP_BILLING_ENDPOINT", "gcp.billing_endpoint", "str", "Cloud Billing API endpoint (tests)"),
    _s("SPOTWISE_GCS_ENDPOINT", "gcp.gcs_endpoint", "str",
       "GCS JSON API endpoint for gs:// storage, with the usual credentials (tests: an emulator)"),
    _s("SPOTWISE_GCP_ANONYMOUS", "gcp.anonymous", "bool", "anonymous credentials, for a local fake (tests)"),
    _s("SPOTWISE_AZURE_SUBSCRIPTION_ID", "azure.subscription_id", "str",
       "subscription to launch in (else AZURE_SUBSCRIPTION_ID)"),
    _s("SPOTWISE_AZURE_RESOURCE_GROUP", "azure.resource_group", "str", "resource group (default spotwise)"),
    _s("SPOTWISE_AZURE_NODE_IDENTITY", "azure.node_identity", "str",
       "user-assigned identity nodes carry (infra/azure node_identity_id; required for az:// storage)"),
    _s("SPOTWISE_AZURE_STORAGE", "azure.storage", "str",
       "checkpoint store of runs on Azure that name none: az://ACCOUNT/CONTAINER/PREFIX (infra/azure)"),
    _s("SPOTWISE_AZURE_BLOB_ENDPOINT", "azure.blob_endpoint", "str",
       "blob endpoint of az:// storage, {account} filled in (default https://{account}.blob.core.windows.net)"),
    _s("SPOTWISE_AZURE_SSH_PUBLIC_KEY", "azure.ssh_public_key", "str",
       "OpenSSH public key for the nodes' admin user (default a throwaway one)"),
    _s("SPOTWISE_AZURE_HEAD_TYPE", "azure.head_type", "str", "VM size of the Ray head"),
    _s("SPOTWISE_AZURE_LOCATIONS", "azure.locations", "list",
       "regions whose VNet has outbound access (infra/azure's var.locations; default its default list)"),
    _s("SPOTWISE_AZURE_VNET_CIDR", "azure.vnet_cidr", "str", "address space of the VNet spotwise creates"),
    _s("SPOTWISE_AZURE_CLIENT_CIDRS", "azure.client_cidrs", "list",
       "CIDRs allowed to reach the head's dashboard/control ports (default the VNet)"),
    _s("SPOTWISE_AZURE_ENDPOINT", "azure.endpoint", "str", "Resource Manager endpoint (tests: a local fake)"),
    _s("SPOTWISE_AZURE_PRICES_ENDPOINT", "azure.prices_endpoint", "str", "Retail Prices API endpoint (tests)"),
    _s("SPOTWISE_AZURE_ANONYMOUS", "azure.anonymous", "bool",
       "anonymous credentials, only with an http:// azure.endpoint (tests)"),
)

BY_ENV: dict[str, Setting] = {s.env: s for s in SETTINGS}
BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}

_TYPES: dict[str, Any] = {
    "str": Annotated[str, Strict()],
    "path": Annotated[str, Strict()],
    "list": list[Annotated[str, Strict(), Field(pattern=r"^[^,]+$")]],
    "int": Annotated[int, Strict()],          # strict: a YAML true is not 1
    "float": Annotated[float, Strict(), Field(allow_inf_nan=False)],
    "bool": Annotated[bool, Strict()],
    "port": Annotated[int, Strict(), Field(ge=1, le=65535)],
}


def _file_model() -> type[ConfigFile]:
    """:class:`ConfigFile` plus one optional field per setting (sections for dotted keys)."""
    sections: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for s in SETTINGS:
        section, _, leaf = s.key.rpartition(".")
        (sections.setdefault(section, {}) if section else top)[leaf] = (_TYPES[s.kind] | None, None)
    fields: dict[str, Any] = dict(top)
    for name, leaves in sections.items():
        model = create_model(f"{name.title()}Section", __config__=ConfigDict(extra="forbid"), **leaves)
        fields[name] = (model, Field(default_factory=model))
    return create_model("ConfigFile", __base__=ConfigFile, **fields)


_FILE_MODEL = _file_model()


def _render(s: Setting, value: Any) -> str:
    """A file value spelt the way its environment variable would be."""
    if s.kind == "list":
        return ",".join(value)
    if s.kind == "bool":
        return "1" if value else "0"
    if s.kind == "path":
        return os.path.expanduser(value)
    return str(value)


def _file_value(cfg: ConfigFile, s: Setting) -> Any:
    node: Any = cfg
    for part in s.key.split("."):
        node = getattr(node, part)
    return node


# -- loading ---------------------------------------------------------------------------------------

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
        s = BY_KEY.get(".".join(str(p) for p in e["loc"][:2])) or BY_KEY.get(str(e["loc"][0]) if e["loc"] else "")
        if e["type"] == "extra_forbidden":
            msg = "this key is not part of spotwise's config file (check its spelling)"
            known = _keys_under(".".join(str(p) for p in e["loc"][:-1]))
            if known:
                msg += "; known keys here: " + ", ".join(known)
        elif e["type"] == "missing":
            given, msg = None, "this key is required"
        elif s is not None:
            msg = KINDS[s.kind] + (" without commas (one item each)" if s.kind == "list" else "") + f": {s.help}"
        elif e["type"] == "model_type":
            msg = "a mapping of keys (README: Configuration file)"
        out.append(Problem(loc, given, msg))
    return out


def _keys_under(section: str) -> list[str]:
    """The keys a section of the file may hold (the top level when ``section`` is empty)."""
    if not section:
        return sorted(_FILE_MODEL.model_fields)
    return sorted(s.key.split(".", 1)[1] for s in SETTINGS if s.key.startswith(section + "."))


_CACHE: dict[Path, tuple[tuple[int, int], ConfigFile]] = {}


def load(path: Path | None = None) -> ConfigFile:
    """The configuration file at ``path`` (default :func:`config_path`), validated; an empty
    configuration when there is none. A set ``$SPOTWISE_CONFIG`` naming a missing file is an
    error: the user pointed at it (``/dev/null`` reads as an empty file). Parsed once per
    (path, mtime, size)."""
    p = path or config_path()
    explicit = path is not None or bool(os.environ.get("SPOTWISE_CONFIG"))
    try:
        st = p.stat()
    except OSError:
        if explicit:
            raise InputError(Problem("SPOTWISE_CONFIG", str(p), "an existing YAML config file"), source="config") from None
        return _FILE_MODEL()
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _CACHE.get(p)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    cfg = _parse(p)
    _CACHE[p] = (stamp, cfg)
    return cfg


def _parse(p: Path) -> ConfigFile:
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(Problem("(file)", str(p), f"a readable UTF-8 YAML file ({e})"), source=str(p)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        raise InputError(Problem(where, str(getattr(e, "problem", e)), "valid YAML"), source=str(p)) from None
    if data is None:
        return _FILE_MODEL()
    if not isinstance(data, dict):
        raise InputError(Problem("(file)", type(data).__name__, "a YAML mapping"), source=str(p))
    try:
        return _FILE_MODEL.model_validate(data)
    except ValidationError as e:
        raise InputError(_problems(e), source=str(p)) from None


def slurm_clusters() -> list[SlurmClusterConfig]:
    """The Slurm clusters the effective config file names ([] when none)."""
    return load().slurm.clusters


# -- reading a setting -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Effective:
    """A setting's effective value (None: unset) and where it came from: ``env SPOTWISE_X``,
    ``file PATH: key``, or ``default`` (neither: the code's default applies)."""

    setting: Setting
    value: str | None
    source: str


def effective(env: str) -> Effective:
    """The registered setting ``env``: the environment when set and non-empty (the way the code
    always read it: ``os.environ.get(X) or default``), else the file, else unset. The file is
    read (and must be valid) either way, so a broken file never hides behind the environment
    for some commands and not others. A name that is not in :data:`SETTINGS` is a KeyError (a bug: register it)."""
    s = BY_ENV[env]
    cfg = load()           # even when the environment wins: a bad file is an error wherever settings are read
    raw = os.environ.get(env)
    if raw:
        return Effective(s, raw, f"env {env}")
    value = _file_value(cfg, s)
    if value is None:
        return Effective(s, None, "default")
    return Effective(s, _render(s, value), f"file {config_path()}: {s.key}")


def setting(env: str) -> str | None:
    """The effective value of the registered setting ``env`` as its variable would spell it, or
    None when neither the environment nor the file sets it."""
    return effective(env).value


def where(env: str) -> str:
    """What a user should fix for the setting ``env``: its key in the file when the value came from
    there, else the variable's name (for :class:`Problem`'s field)."""
    eff = effective(env)
    return eff.source.removeprefix("file ") if eff.source.startswith("file ") else env


def file_key(env: str) -> str:
    """The key the registered setting ``env`` has in the config file (``gcp.storage`` for
    ``SPOTWISE_GCP_STORAGE``), wherever its value comes from."""
    return BY_ENV[env].key


def environ() -> dict[str, str]:
    """``os.environ`` with every setting at its effective value (the file's where the variable is
    unset): for code that reads a mapping of variables rather than one setting."""
    out = dict(os.environ)
    for s in SETTINGS:
        value = setting(s.env)
        if value is not None:
            out[s.env] = value
    return out


_URL_PASSWORD = re.compile(r"(://[^/@:]*:)[^/@]*@")


def masked(eff: Effective) -> str | None:
    """The value as ``config show`` prints it: a secret as ``****``, a URL's password as ``****``."""
    if eff.value is None or eff.setting.mask is None:
        return eff.value
    if eff.setting.mask == "url":
        return _URL_PASSWORD.sub(r"\1****@", eff.value)
    return "****"

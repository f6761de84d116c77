"""What a Slurm cluster has, read from the cluster: partitions, nodes, GPU gres, limits, preemption.

Nothing here is retyped by the user (issue 36): :func:`discover` asks the cluster with
``scontrol show partition -o`` and ``scontrol show node -o`` and parses their one-line-per-record
``Key=Value`` text. The text form, not ``--json``, on purpose: it is the same on every Slurm from
14.x to today, while ``--json`` exists only from 21.08, needs the ``serializer/json`` plugin, and
its schema changed with each of Slurm's OpenAPI versions (v0.0.36 ... v0.0.41); the fields read
here (``PriorityTier``, ``PreemptMode``, ``GraceTime``, ``MaxTime``, ``DefaultTime``, ``Gres``,
``CPUTot``, ``RealMemory``, ``State``, ``Partitions``) have kept their names throughout.

Which nodes a partition holds is read from each node's ``Partitions=`` (so no hostlist expression
such as ``gpu[01-16,20]`` needs expanding here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from spotwise.provisioner.clouds.slurm.cli import SlurmRunner

_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9_:/.]*)=(.*)$")

#: node states (the base state, before any ``+FLAG``) a job can be scheduled on
USABLE_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING", "PLANNED"})
#: state flags that take a node out of scheduling
UNUSABLE_FLAGS = frozenset({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING", "INVAL",
                            "NOT_RESPONDING", "MAINTENANCE", "REBOOT_REQUESTED", "POWERED_DOWN", "POWERING_DOWN"})
#: PreemptMode values under which a partition's jobs are ended (and maybe requeued) by preemption:
#: market ``spot``; anything else (OFF, SUSPEND, GANG) keeps a started job running: ``on-demand``
PREEMPTIBLE_MODES = frozenset({"REQUEUE", "CANCEL"})


def parse_records(text: str) -> list[dict[str, str]]:
    """``scontrol show ... -o`` output (one record a line, ``Key=Value`` separated by spaces) as
    dicts. A word without ``=`` continues the previous value (``OS=Linux 6.1.0 #1 SMP ...``)."""
    out = []
    for line in text.splitlines():
        rec: dict[str, str] = {}
        last = None
        for word in line.split():
            m = _KEY.match(word)
            if m:
                last = m.group(1)
                rec[last] = m.group(2)
            elif last is not None:
                rec[last] += " " + word
        if rec:
            out.append(rec)
    return out


def parse_duration(value: str | None) -> float | None:
    """A Slurm time (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``) in
    seconds; None for ``UNLIMITED``, ``INFINITE``, ``NONE``, ``N/A`` or nothing."""
    if value is None or value.strip().upper() in ("", "UNLIMITED", "INFINITE", "NONE", "N/A", "(NULL)"):
        return None
    v = value.strip()
    days = 0
    if "-" in v:
        d, v = v.split("-", 1)
        days = int(d)
        parts = [int(p) for p in v.split(":")] + [0] * (3 - len(v.split(":")))   # D-HH[:MM[:SS]]
        h, m, s = parts[:3]
    else:
        nums = [int(p) for p in v.split(":")]
        h, m, s = ((0, nums[0], 0) if len(nums) == 1 else (0, nums[0], nums[1]) if len(nums) == 2
                   else (nums[0], nums[1], nums[2]))
    return float(((days * 24 + h) * 60 + m) * 60 + s)


def parse_gres(value: str | None) -> dict[str, int]:
    """GPU gres of a node, ``{type: count}``: ``gpu:h100:8``, ``gpu:h100:8(S:0-1)``,
    ``gpu:a100:4,gpu:v100:2``; an untyped ``gpu:4`` is type ``""``. Non-GPU gres are left out."""
    out: dict[str, int] = {}
    if not value or value in ("(null)", "N/A"):
        return out
    for part in re.sub(r"\([^)]*\)", "", value).split(","):
        bits = part.strip().split(":")
        if not bits or bits[0] != "gpu" or len(bits) < 2:
            continue
        typ, count = ("", bits[1]) if len(bits) == 2 else (bits[1], bits[2])
        if count.isdigit() and int(count) > 0:
            out[typ] = out.get(typ, 0) + int(count)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmNode:
    name: str
    state: str
    cpus: int
    memory_mb: int
    gpus: dict[str, int]
    partitions: tuple[str, ...]

    @property
    def usable(self) -> bool:
        """Whether Slurm schedules jobs on it now (not down, drained, failing...)."""
        words = self.state.rstrip("*~#!%$@^-").upper().replace("*", "").split("+")
        return words[0] in USABLE_STATES and not (set(words[1:]) & UNUSABLE_FLAGS)


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmPartition:
    name: str
    state: str
    priority_tier: int
    preempt_mode: str
    grace_s: float
    max_time_s: float | None
    default_time_s: float | None
    nodes: tuple[SlurmNode, ...] = ()

    @property
    def preemptible(self) -> bool:
        """Jobs here end when a higher tier needs the nodes (``PreemptMode`` REQUEUE or CANCEL)."""
        return any(m in PREEMPTIBLE_MODES for m in self.preempt_mode.upper().split(","))

    @property
    def up(self) -> bool:
        return self.state.upper() == "UP"

    def gpu_shapes(self) -> dict[tuple[str, int], int]:
        """``{(gpu type, GPUs per node): usable nodes}`` of this partition."""
        out: dict[tuple[str, int], int] = {}
        for n in self.nodes:
            if n.usable:
                for typ, count in n.gpus.items():
                    out[(typ, count)] = out.get((typ, count), 0) + 1
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterInfo:
    """One cluster as :func:`discover` read it."""

    partitions: dict[str, SlurmPartition] = field(default_factory=dict)
    nodes: dict[str, SlurmNode] = field(default_factory=dict)


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(str(value).split("(")[0])
    except (TypeError, ValueError):
        return default


def parse_nodes(text: str) -> dict[str, SlurmNode]:
    out = {}
    for r in parse_records(text):
        name = r.get("NodeName")
        if not name:
            continue
        parts = tuple(p for p in r.get("Partitions", "").split(",") if p and p != "(null)")
        out[name] = SlurmNode(name=name, state=r.get("State", "UNKNOWN"), cpus=_int(r.get("CPUTot")),
                              memory_mb=_int(r.get("RealMemory")), gpus=parse_gres(r.get("Gres")),
                              partitions=parts)
    return out


def parse_partitions(text: str, nodes: dict[str, SlurmNode]) -> dict[str, SlurmPartition]:
    out = {}
    for r in parse_records(text):
        name = r.get("PartitionName")
        if not name:
            continue
        out[name] = SlurmPartition(
            name=name, state=r.get("State", "UP"), priority_tier=_int(r.get("PriorityTier"), 1),
            preempt_mode=r.get("PreemptMode", "OFF"), grace_s=float(_int(r.get("GraceTime"))),   # in seconds
            max_time_s=parse_duration(r.get("MaxTime")), default_time_s=parse_duration(r.get("DefaultTime")),
            nodes=tuple(n for n in nodes.values() if name in n.partitions))
    return out


def parse_cluster(partitions_text: str, nodes_text: str) -> ClusterInfo:
    """A :class:`ClusterInfo` from the two commands' outputs (what :func:`discover` runs)."""
    nodes = parse_nodes(nodes_text)
    return ClusterInfo(partitions=parse_partitions(partitions_text, nodes), nodes=nodes)


def discover(runner: SlurmRunner) -> ClusterInfo:
    """Ask the cluster (``scontrol show partition -o``, ``scontrol show node -o``). Raises
    :class:`~spotwise.provisioner.clouds.slurm.cli.SlurmUnreachable` when it cannot be asked."""
    parts = runner.run("scontrol", "show", "partition", "-o")
    nodes = runner.run("scontrol", "show", "node", "-o")
    return parse_cluster(parts, nodes)

"""Render the boot script every spotwise node runs: AWS user-data, GCP startup-script, Azure
custom data — the same bash program on all three.

What the script does, in order, each step guarded so that running it twice is safe (GCP runs a
startup-script on *every* boot; cloud-init may re-run user-data after an image rebuild):

1. write ``/etc/spotwise/node.env`` (cluster, job, role, cloud, zone, market) — same bytes each run;
2. activate the runtime: use the node image's venv when it already imports spotwise and ray
   (the image recipe in ``infra/image`` bakes it), otherwise create it and ``pip install`` once;
3. start Ray — the head with ``ray start --head``, a worker with ``ray start --address HEAD`` —
   unless a raylet is already running. Nodes carry Ray labels (``spotwise-cloud``, ``-zone``,
   ``-market``, ``-job``, ``-role``...) so placement and the orchestrator can tell them apart;
4. start the interruption watcher ``python -m spotwise.runtime.watch --cloud ...`` unless its
   pidfile names a live process.

How a worker finds the head: the provisioner launches the head first and passes its private
address to the workers' scripts (``head_address``). A script rendered without one reads it from
the instance's own metadata (AWS instance tag via IMDSv2, GCP metadata attribute, Azure tag via
IMDS) under the key ``spotwise-head`` and waits for it — so a new head can be announced by
re-tagging, without re-rendering anything.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from spotwise import __version__

RAY_PORT = 6379
HEAD_KEY = "spotwise-head"
_LABEL_VALUE = re.compile(r"[^a-zA-Z0-9_.-]")

# How a worker reads ``spotwise-head`` from its own metadata service, per cloud (curl commands).
_HEAD_LOOKUP = {
    "aws": ('TOKEN=$(curl -sf -m 2 -X PUT http://169.254.169.254/latest/api/token '
            '-H "X-aws-ec2-metadata-token-ttl-seconds: 300" || true); '
            'curl -sf -m 2 -H "X-aws-ec2-metadata-token: $TOKEN" '
            f'http://169.254.169.254/latest/meta-data/tags/instance/{HEAD_KEY}'),
    "gcp": ('curl -sf -m 2 -H "Metadata-Flavor: Google" '
            f'http://metadata.google.internal/computeMetadata/v1/instance/attributes/{HEAD_KEY}'),
    "azure": ('curl -sf -m 2 -H "Metadata: true" '
              '"http://169.254.169.254/metadata/instance/compute/tagsList?api-version=2021-02-01" '
              f'| python3 -c "import json,sys; print(next((t[\'value\'] for t in json.load(sys.stdin) '
              f'if t[\'name\']==\'{HEAD_KEY}\'), \'\'))"'),
    "local": "true",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class BootstrapSpec:
    """Everything the node script needs; rendered, not looked up, so it is testable as text."""

    cloud: str
    cluster_id: str
    job_id: str
    role: str                      # head | worker
    region: str
    zone: str
    market: str
    instance_type: str
    accelerator_count: int = 0
    head_address: str | None = None
    ray_port: int = RAY_PORT
    pip_spec: str = f"spotwise=={__version__}"
    extra_labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.role not in ("head", "worker"):
            raise ValueError(f"role must be head or worker, got {self.role!r}")
        if self.cloud not in _HEAD_LOOKUP:
            raise ValueError(f"cloud must be one of {sorted(_HEAD_LOOKUP)}, got {self.cloud!r}")


def label_value(v: str) -> str:
    """A string as a valid Ray/GCP label value (``[a-zA-Z0-9_.-]``, <= 63 chars, not empty)."""
    v = _LABEL_VALUE.sub("-", str(v)).strip("-_.")[:63]
    return v or "none"


def ray_labels(spec: BootstrapSpec) -> dict[str, str]:
    labels = {
        "spotwise-cloud": spec.cloud, "spotwise-region": spec.region, "spotwise-zone": spec.zone,
        "spotwise-market": spec.market, "spotwise-job": spec.job_id,
        "spotwise-cluster": spec.cluster_id, "spotwise-role": spec.role,
        "spotwise-instance-type": spec.instance_type,
    }
    labels.update(spec.extra_labels)
    return {k: label_value(v) for k, v in labels.items()}


def watch_command(spec: BootstrapSpec) -> list[str]:
    """The interruption watcher's argv (the module belongs to the runtime)."""
    return ["python", "-m", "spotwise.runtime.watch", "--cloud", spec.cloud,
            "--cluster", spec.cluster_id, "--job", spec.job_id]


def ray_start_command(spec: BootstrapSpec, head_var: str = "$HEAD") -> str:
    labels = ",".join(f"{k}={v}" for k, v in ray_labels(spec).items())
    gpus = f" --num-gpus={spec.accelerator_count}" if spec.accelerator_count else ""
    if spec.role == "head":
        return (f'"$VENV/bin/ray" start --head --port={spec.ray_port} --dashboard-host=0.0.0.0'
                f"{gpus} --labels={shlex.quote(labels)}")
    return f'"$VENV/bin/ray" start --address="{head_var}"{gpus} --labels={shlex.quote(labels)}'


def render_script(spec: BootstrapSpec) -> str:
    """The bash boot script for ``spec`` (plain text; each cloud module encodes it as it needs)."""
    q = shlex.quote
    env_lines = "\n".join(f"SPOTWISE_{k}={q(v)}" for k, v in [
        ("CLOUD", spec.cloud), ("CLUSTER", spec.cluster_id), ("JOB", spec.job_id),
        ("ROLE", spec.role), ("REGION", spec.region), ("ZONE", spec.zone),
        ("MARKET", spec.market), ("INSTANCE_TYPE", spec.instance_type)])
    watch = " ".join(q(a) for a in watch_command(spec)[1:])
    if spec.role == "head":
        head_block = f'HEAD="127.0.0.1:{spec.ray_port}"'
    elif spec.head_address:
        head_block = f"HEAD={q(spec.head_address)}"
    else:
        head_block = (
            "HEAD=\"\"\n"
            "for _ in $(seq 1 120); do\n"
            f"  HEAD=$({_HEAD_LOOKUP[spec.cloud]} 2>/dev/null || true)\n"
            '  [ -n "$HEAD" ] && break\n'
            "  sleep 5\n"
            "done\n"
            '[ -n "$HEAD" ] || { echo "spotwise: no head address in metadata key '
            f'{HEAD_KEY}" >&2; exit 1; }}')
    return f"""#!/bin/bash
# spotwise node bootstrap ({spec.cloud}, {spec.role}) — idempotent: safe to run on every boot.
set -euo pipefail
STATE_DIR="${{SPOTWISE_STATE_DIR:-/var/lib/spotwise}}"
ETC_DIR="${{SPOTWISE_ETC_DIR:-/etc/spotwise}}"
VENV="${{SPOTWISE_VENV:-/opt/spotwise/venv}}"
mkdir -p "$STATE_DIR" "$ETC_DIR"
exec >>"$STATE_DIR/bootstrap.log" 2>&1
echo "spotwise bootstrap start $(date -u +%FT%TZ)"

# 1. node identity (same bytes on every run; written atomically)
cat >"$ETC_DIR/node.env.tmp" <<'SPOTWISE_ENV'
{env_lines}
SPOTWISE_ENV
mv -f "$ETC_DIR/node.env.tmp" "$ETC_DIR/node.env"

# 2. runtime: reuse the image's venv when it already has spotwise and ray
if ! "$VENV/bin/python" -c "import spotwise, ray" >/dev/null 2>&1; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet {q(spec.pip_spec)}
fi

# 3. Ray ({spec.role})
{head_block}
echo "$HEAD" >"$STATE_DIR/head_address"
if pgrep -f raylet >/dev/null 2>&1; then
  echo "ray already running"
else
  {ray_start_command(spec)}
fi

# 4. interruption watcher
PIDFILE="$STATE_DIR/watch.pid"
if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
  echo "watcher already running"
else
  nohup "$VENV/bin/python" {watch} >>"$STATE_DIR/watch.log" 2>&1 &
  echo $! >"$PIDFILE"
fi
echo "spotwise bootstrap done"
"""

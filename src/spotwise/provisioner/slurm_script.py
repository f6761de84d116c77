"""The batch script of a spotwise Slurm job: Ray on every node of the allocation, in one ``srun``
step, with the interruption watcher and dead man's switch beside each node's Ray.

What it does:

1. the batch shell (on the allocation's first node) traps ``USR1`` — the ``--signal=B:USR1@N``
   spotwise asks for, which Slurm sends N seconds before the time limit and, with
   ``SlurmctldParameters=preempt_send_user_signal``, at preemption (the partition's ``GraceTime``
   before the kill) — and ``TERM``, and writes the kill's deadline (epoch ms) to the job's notice
   file; the watcher (``python -m spotwise.runtime.watch --cloud slurm``) reads it as a cloud's
   notice and drains its Ray node, so every rank writes its just-in-time checkpoint
   (docs/architecture.md, "Interruptions, through Ray"), exactly as on a cloud;
2. ``srun`` one task per node running :func:`node program <render>`: it reads the node's own
   address from Slurm (``scontrol show node $SLURMD_NODENAME``), picks free ports on the node for
   Ray's agents below the kernel's ephemeral range (several Slurm nodes may share a host, as the
   tests' do: :func:`spotwise.utils.net.service_port`), starts the watcher
   (``--self-end slurm``: the dead man's switch ``scancel``\\ s its job when the runner's lease runs
   out) and then ``ray start --block`` in the foreground, as Ray's own Slurm recipe does: the
   processes stay in the step, so ``scancel``, a preemption or the time limit ends all of them (a
   daemonized ``ray start`` can escape Slurm's process tracking under ``proctrack/linuxproc``).

Nodes run the launcher's Python (``python``): the tests' cluster is this machine, and a cluster
with a shared filesystem can see the same venv. Installing the shipped build on nodes that cannot
(``provisioner.shipping``, as cloud nodes do) is not wired for Slurm yet (docs/slurm.md).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from spotwise.provisioner.bootstrap import HEAD_RESOURCE, INSTANCE_LABEL, WORKER_RESOURCE


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """What every node of one job needs to start."""

    cluster_id: str
    job_id: str
    role: str                       # head | worker
    cloud_zone: str                 # the partition
    market: str
    python: str
    gcs_port: int                   # the head's GCS port (head: listens on it; worker: joins it)
    head_address: str | None        # worker: HOST:PORT of the head's GCS
    dashboard_port: int = 0         # head: the Ray dashboard / Jobs API
    grace_s: float = 0.0            # the notice window written into the notice file
    boot_lease_s: float = 300.0
    auth_token: str = ""


_NODE = r'''sw_node() {
  set -u
  local NODE="$SLURMD_NODENAME"
  local IID="$SW_CLUSTER-$SW_ROLE-$SLURM_JOB_ID-$NODE"
  local ADDR IP TMPD LEASE GPUS
  ADDR=$(scontrol show node "$NODE" -o | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
  IP=$("$SW_PY" -c 'import socket,sys; print(socket.gethostbyname(sys.argv[1]))' "${ADDR:-$(hostname)}")
  TMPD="$SW_STATE-$NODE"
  mkdir -p "$TMPD"
  # Ray's agents' ports, from below the kernel's ephemeral range (spotwise.utils.net.service_port:
  # a port the kernel hands out at random, as bind(0) does, was taken by another process before the
  # dashboard agent bound it, on a busy host); one call, so the four are distinct
  local P1 P2 P3 P4
  read -r P1 P2 P3 P4 < <("$SW_PY" -c 'from spotwise.utils.net import service_port as p; print(*(p() for _ in range(4)))')
  GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l || echo 0)
  [ "$IP" = 127.0.0.1 ] && export GLOO_SOCKET_IFNAME=lo    # nodes on one host (the tests' cluster)
  local GCS="$IP:$SW_GCS_PORT"
  [ "$SW_ROLE" = head ] || GCS="$SW_HEAD"
  LEASE=$(( $(date +%s) + SW_BOOT_LEASE ))
  SPOTWISE_SLURM_INSTANCE="$IID" "$SW_PY" -m spotwise.runtime.watch --cloud slurm \
    --metadata-url "$SW_NOTICE" --instance-id "$IID" --gcs-address "$GCS" \
    --lease-deadline "$LEASE" --self-end slurm >>"$TMPD/watch.log" 2>&1 &
  local LABELS="$SW_INSTANCE_LABEL=$IID,spotwise-cluster=$SW_CLUSTER,spotwise-job=$SW_JOB,spotwise-cloud=slurm"
  LABELS="$LABELS,spotwise-zone=$SW_ZONE,spotwise-market=$SW_MARKET,spotwise-slurm-job=$SLURM_JOB_ID"
  local COMMON=(--block --disable-usage-stats --node-ip-address="$IP" --num-gpus="$GPUS" --labels="$LABELS"
    --dashboard-agent-listen-port="$P1" --dashboard-agent-grpc-port="$P2" --runtime-env-agent-port="$P3"
    --metrics-export-port="$P4" --temp-dir="$TMPD")
  # Every process of this node carries the marker, Ray's re-parented helpers included: on Slurm's
  # SIGTERM (scancel, preemption, time limit) they are all SIGKILLed at once, so none outlives the
  # step and the job does not linger COMPLETING while Ray shuts down at its own pace.
  export SPOTWISE_SLURM_INSTANCE="$IID"
  sw_end() {
    "$SW_PY" -c "$SW_KILL_MARKED" "SPOTWISE_SLURM_INSTANCE=$IID"
    rm -rf "$TMPD"      # Ray's session files: nothing of the run stays on the node
    exit 0
  }
  trap sw_end TERM INT
  if [ "$SW_ROLE" = head ]; then
    "$SW_RAY" start "${COMMON[@]}" --head --port="$SW_GCS_PORT" --num-cpus=0 \
      --resources="$SW_HEAD_RES" --dashboard-host="$IP" --dashboard-port="$SW_DASHBOARD_PORT" &
  else
    "$SW_RAY" start "${COMMON[@]}" --address="$SW_HEAD" --num-cpus=1 --resources="$SW_WORKER_RES" &
  fi
  wait $!             # in the background and waited for: the trap runs at once, not after Ray exits
  sw_end
}
'''

_BATCH = r'''#!/bin/bash
# spotwise {role} of cluster {cluster} (job {job}): Ray on every node of this allocation.
set -u
{exports}
# per spotwise cluster and job: two Slurm clusters on one host (the tests') both number jobs from 1
export SW_STATE="/tmp/sw-$SW_CLUSTER-$SLURM_JOB_ID"
export SW_NOTICE="$SW_STATE.notice"
rm -f "$SW_NOTICE"
sw_notice() {{
  # the kill comes {grace} s after the signal: its deadline, in epoch ms, is the notice
  echo $(( $(date +%s%3N) + {grace_ms} )) > "$SW_NOTICE.tmp" && mv "$SW_NOTICE.tmp" "$SW_NOTICE"
}}
trap sw_notice USR1 TERM
{node}
srun --kill-on-bad-exit=0 --ntasks-per-node=1 bash -c "$(declare -f sw_node); sw_node" &
STEP=$!
while kill -0 "$STEP" 2>/dev/null; do wait "$STEP"; done
rm -f "$SW_NOTICE"
'''


#: SIGKILL every other process whose environment holds argv[1] (``NAME=VALUE``), until none is left
_KILL_MARKED = """import os, signal, sys, time
want = sys.argv[1].encode()
for _ in range(50):
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                if want in open(f"/proc/{d}/environ", "rb").read().split(b"\\0"):
                    pids.append(int(d))
            except OSError:
                pass
    if not pids:
        break
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.1)
"""


def render(spec: NodeSpec) -> str:
    """The batch script for one job (see the module's docstring)."""
    from pathlib import Path

    env = {
        "SW_CLUSTER": spec.cluster_id, "SW_JOB": spec.job_id, "SW_ROLE": spec.role, "SW_ZONE": spec.cloud_zone,
        "SW_MARKET": spec.market, "SW_PY": spec.python, "SW_RAY": str(Path(spec.python).with_name("ray")),
        "SW_GCS_PORT": str(spec.gcs_port), "SW_HEAD": spec.head_address or "",
        "SW_DASHBOARD_PORT": str(spec.dashboard_port), "SW_BOOT_LEASE": str(int(spec.boot_lease_s)),
        "SW_INSTANCE_LABEL": INSTANCE_LABEL, "SW_HEAD_RES": json.dumps({HEAD_RESOURCE: 1}),
        "SW_WORKER_RES": json.dumps({WORKER_RESOURCE: 1}),
        "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": spec.auth_token,
        # Ray Train looks for node drains every 5 s by default; a Slurm grace time may be 20 s
        "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5",
        "PATH": f"{Path(spec.python).parent}:$PATH",
    }
    env["SW_KILL_MARKED"] = _KILL_MARKED
    exports = "\n".join(f"export {k}={shlex.quote(v)}" if k != "PATH" else f'export PATH="{v}"'
                        for k, v in env.items())
    grace = max(1, int(spec.grace_s))
    return _BATCH.format(role=spec.role, cluster=spec.cluster_id, job=spec.job_id, exports=exports,
                         grace=grace, grace_ms=grace * 1000, node=_NODE)

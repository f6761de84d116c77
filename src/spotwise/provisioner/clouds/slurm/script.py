"""The batch script of a spotwise Slurm job: Ray on every node of the allocation, in one ``srun``
step, with the interruption watcher and dead man's switch beside each node's Ray.

What it does:

1. the batch shell (on the allocation's first node) traps ``USR1`` — the ``--signal=B:USR1@N``
   spotwise asks for, which Slurm sends N seconds before the time limit and, with
   ``SlurmctldParameters=preempt_send_user_signal``, at preemption (the partition's ``GraceTime``
   before the kill) — and ``TERM``, and writes the kill's deadline (epoch ms) to the job's notice
   file; the watcher (``python -m spotwise.runtime.node.watch --cloud slurm``) reads it as a cloud's
   notice and drains its Ray node, so every rank writes its just-in-time checkpoint
   (docs/architecture.md, "Interruptions, through Ray"), exactly as on a cloud. On ``USR1`` it
   also starts a waiter that ``scancel``\\ s the job once a rank marks the notice's checkpoint
   committed (``runtime.api.CHECKPOINTED_FILE_ENV``, a file this script names), at the latest at the
   kill's deadline: the preemptor and the run's replacement wait for these nodes (docs/slurm.md);
2. ``srun`` one task per node running :func:`node program <render>`: it reads the node's own
   address from Slurm (``scontrol show node $SLURMD_NODENAME``), picks free ports on the node for
   Ray's agents below the kernel's ephemeral range (several Slurm nodes may share a host, as the
   tests' do: :func:`spotwise.utils.net.service_port`), starts the watcher
   (``--self-end slurm``: the dead man's switch ``scancel``\\ s its job when the runner's lease runs
   out) and then ``ray start --block`` in the foreground, as Ray's own Slurm recipe does: the
   processes stay in the step, so ``scancel``, a preemption or the time limit ends all of them (a
   daemonized ``ray start`` can escape Slurm's process tracking under ``proctrack/linuxproc``).

No shared filesystem is assumed. Each node installs the build the launch shipped exactly as a
cloud node does (:func:`spotwise.provisioner.boot.script.install_script`, the same bash): it fetches
the wheel from the run's storage, refuses it unless its sha256 is the one rendered here, makes a
venv over the node's base Python (the cluster's ``python`` in the config file, else the first
Python >= 3.11 the node has; its torch and Ray stay visible) and installs the wheel there, logging
the wheel's sha256 and build id; a node whose venv already holds that build skips all of it. A
node where ``nvidia-smi`` lists GPUs then checks, as a cloud GPU node does, that the venv's torch
uses them, installs the same torch version built for a CUDA that fits the driver where it does not
(from ``SPOTWISE_TORCH_INDEX`` if the node has it), or fails the step
(:mod:`spotwise.provisioner.boot.torch_fit`). The venv is per node and per build
(``$SPOTWISE_SLURM_NODE_DIR``, default ``/tmp/spotwise-$USER``, then ``NODE/venv-BUILD``), and
installs on one node are serialized (``flock``): the head's and a worker's job may share a node.
Ray, the watcher and the ``SIGTERM`` trap then run that venv's Python. The launcher's own Python
environment (``PYTHONPATH``, ``VIRTUAL_ENV``...), which ``sbatch`` exports with the job, is dropped
first: a node must not import the launcher's checkout. So are the ssh session's variables
(``SSH_CLIENT``...) when ``sbatch`` ran over ssh: with them set, a non-interactive ``bash -c`` (Ray
starts its workers with one) sources ``~/.bashrc`` (Debian's bash, ``SSH_SOURCE_BASHRC``), whose
pyenv or conda init put another ``python`` before the node's venv — the job's driver then ran a
Python without spotwise (seen on the tests' cluster over ssh).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from spotwise.build import BootBuild
from spotwise.provisioner.boot.script import (
    HEAD_RESOURCE,
    RAY_NODE_FLAGS,
    WORKER_RESOURCE,
    check_build,
    install_script,
)
from spotwise.provisioner.clouds.local.procs import KEEP_MARKER_ENV
from spotwise.runtime.api import CHECKPOINTED_FILE_ENV, INSTANCE_LABEL
from spotwise.provisioner.boot.torch_fit import CALL as FIT_CALL
from spotwise.provisioner.boot.torch_fit import FUNCTION as TORCH_FIT
from spotwise.provisioner.boot.torch_fit import GPU_COUNT
from spotwise.provisioner.boot.torch_fit import torch_fit_function

#: the ``Comment`` a job gives itself before it ends itself at a notice (its USR1): the preemption
#: the notice announced, though Slurm then says ``CANCELLED``
YIELD_COMMENT = "spotwise-yielded-at-notice"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """What every node of one job needs to start."""

    cluster_id: str
    job_id: str
    role: str                       # head | worker
    cloud_zone: str                 # the partition
    market: str
    build: BootBuild                # the wheel the launch shipped (fetched, checked, installed per node)
    python: str | None = None       # the nodes' base Python (torch, Ray); None: the first >= 3.11 found
    extras: str = "aws"             # the wheel's extras a node installs where the base Python lacks them
    gcs_port: int                   # the head's GCS port (head: listens on it; worker: joins it)
    head_address: str | None        # worker: HOST:PORT of the head's GCS
    dashboard_port: int = 0         # head: the Ray dashboard / Jobs API
    grace_s: float = 0.0            # the notice window written into the notice file
    boot_lease_s: float = 300.0
    auth_token: str = ""
    #: where nodes keep their venvs and logs (the launcher's SPOTWISE_SLURM_NODE_DIR, carried in the
    #: script: over ssh, sbatch exports the login shell's environment, not the launcher's); None:
    #: the nodes' own SPOTWISE_SLURM_NODE_DIR, else /tmp/spotwise-$USER
    node_dir: str | None = None

    def __post_init__(self) -> None:
        check_build(self.build, self.extras)
        if self.role not in ("head", "worker"):
            raise ValueError(f"role must be head or worker, got {self.role!r}")


_NODE = r'''sw_node() {
  set -u
  local NODE="$SLURMD_NODENAME"
  local IID="$SW_CLUSTER-$SW_ROLE-$SLURM_JOB_ID-$NODE"    # the processes' marker: unique on a host
  # the Ray label that names this node: what the orchestrator knows it by (its Node.instance_id
  # JOBID/HOST, launch.nodes_of) as instance_label_value spells it; the drain events (a replacement
  # asked for at the notice) and the join watch find the node by it, and the watcher drains it by it
  local LABEL
  LABEL=$(printf '%s' "$SLURM_JOB_ID/$NODE" | tr -c 'a-zA-Z0-9_.-' '-' | cut -c1-63)
  local ADDR IP TMPD LEASE GPUS RC
  # 1. the shipped build, in this node's own venv (no shared filesystem): installed unless there;
  # on a node with GPUs, a torch that uses them (the cloud GPU nodes' own check, torch_fit)
  local ROOT="$SW_NODE_DIR/$NODE"
  local VENV="$ROOT/venv-$SW_BUILD" STATE_DIR="$ROOT"
  local LOG="$ROOT/log/$SW_CLUSTER-$SLURM_JOB_ID.log"
  mkdir -p "$ROOT/log"
  echo "spotwise slurm node $NODE job $SLURM_JOB_ID ($SW_ROLE of $SW_CLUSTER) $(date -u +%FT%TZ)" >>"$LOG"
  GPUS=$({gpu_count} || echo 0)
  ( set -euo pipefail; flock 9; sw_install; NUM_GPUS="$GPUS"; {fit_call} ) 9>"$VENV.lock" >>"$LOG" 2>&1
  RC=$?
  if [ "$RC" != 0 ]; then
    echo "spotwise: node $NODE could not install the shipped build or a torch that uses its GPUs (status $RC; $LOG)" >&2
    exit "$RC"
  fi
  local PY="$VENV/bin/python"
  export PATH="$VENV/bin:$PATH"     # Ray's job drivers and workers run this venv's python
  ADDR=$(scontrol show node "$NODE" -o | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
  IP=$("$PY" -c 'import socket,sys; print(socket.gethostbyname(sys.argv[1]))' "${ADDR:-$(hostname)}")
  TMPD="$SW_STATE-$NODE"
  mkdir -p "$TMPD"
  # Ray's agents' ports, from below the kernel's ephemeral range (spotwise.utils.net.service_port:
  # a port the kernel hands out at random, as bind(0) does, was taken by another process before the
  # dashboard agent bound it, on a busy host); one call, so the four are distinct
  local P1 P2 P3 P4
  read -r P1 P2 P3 P4 < <("$PY" -c 'from spotwise.utils.net import service_port as p; print(*(p() for _ in range(4)))')
  [ "$IP" = 127.0.0.1 ] && export GLOO_SOCKET_IFNAME=lo    # nodes on one host (the tests' cluster)
  local GCS="$IP:$SW_GCS_PORT"
  [ "$SW_ROLE" = head ] || GCS="$SW_HEAD"
  LEASE=$(( $(date +%s) + SW_BOOT_LEASE ))
  SPOTWISE_SLURM_INSTANCE="$IID" "$PY" -m spotwise.runtime.node.watch --cloud slurm \
    --metadata-url "$SW_NOTICE" --instance-id "$LABEL" --gcs-address "$GCS" \
    --lease-deadline "$LEASE" --self-end slurm >>"$TMPD/watch.log" 2>&1 &
  local LABELS="$SW_INSTANCE_LABEL=$LABEL,spotwise-cluster=$SW_CLUSTER,spotwise-job=$SW_JOB,spotwise-cloud=slurm"
  LABELS="$LABELS,spotwise-zone=$SW_ZONE,spotwise-market=$SW_MARKET,spotwise-slurm-job=$SLURM_JOB_ID"
  local COMMON=(--block $SW_RAY_FLAGS --node-ip-address="$IP" --num-gpus="$GPUS" --labels="$LABELS"
    --dashboard-agent-listen-port="$P1" --dashboard-agent-grpc-port="$P2" --runtime-env-agent-port="$P3"
    --metrics-export-port="$P4" --temp-dir="$TMPD")
  # Every process of this node carries the marker, Ray's re-parented helpers included: on Slurm's
  # SIGTERM (scancel, preemption, time limit) they are all SIGKILLed at once (the dead man's
  # switch's own kill_marked), so none outlives the step and the job does not linger COMPLETING
  # while Ray shuts down at its own pace.
  export SPOTWISE_SLURM_INSTANCE="$IID"
  sw_end() {
    "$PY" -m spotwise.runtime.node.deadman --kill-marked "SPOTWISE_SLURM_INSTANCE=$IID"
    rm -rf "$TMPD"      # Ray's session files: nothing of the run stays on the node but its venv
    exit 0
  }
  trap sw_end TERM INT
  if [ "$SW_ROLE" = head ]; then
    "$PY" -m ray.scripts.scripts start "${COMMON[@]}" --head --port="$SW_GCS_PORT" --num-cpus=0 \
      --resources="$SW_HEAD_RES" --dashboard-host="$IP" --dashboard-port="$SW_DASHBOARD_PORT" >>"$LOG" 2>&1 &
  else
    "$PY" -m ray.scripts.scripts start "${COMMON[@]}" --address="$SW_HEAD" --num-cpus=1 --resources="$SW_WORKER_RES" >>"$LOG" 2>&1 &
  fi
  wait $!             # in the background and waited for: the trap runs at once, not after Ray exits
  sw_end
}
'''

_BATCH = r'''#!/bin/bash
# spotwise {role} of cluster {cluster} (job {job}): Ray on every node of this allocation.
set -u
# the launcher's Python environment, which sbatch exports with the job: not the nodes'
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV PYTHONSTARTUP PYTHONUSERBASE SPOTWISE_PYTHON
# ... nor the ssh session's, when sbatch ran over ssh: with SSH_CLIENT set, every `bash -c` (Ray
# starts its workers with one) sources ~/.bashrc, whose pyenv or conda init puts another python first
unset SSH_CLIENT SSH2_CLIENT SSH_CONNECTION SSH_TTY
{exports}
export SW_NODE_DIR="${{SPOTWISE_SLURM_NODE_DIR:-/tmp/spotwise-$(id -un)}}"
# per spotwise cluster and job: two Slurm clusters on one host (the tests') both number jobs from 1
export SW_STATE="/tmp/sw-$SW_CLUSTER-$SLURM_JOB_ID"
export SW_NOTICE="$SW_STATE.notice"
# a rank creates it once the notice's just-in-time checkpoint is committed (runtime.api.CHECKPOINTED_FILE_ENV)
export {checkpointed_env}="$SW_STATE.checkpointed"
rm -f "$SW_NOTICE" "${checkpointed_env}" "$SW_STATE.yielding"
sw_notice() {{
  # the kill comes {grace} s after the signal: its deadline, in epoch ms, is the notice
  echo $(( $(date +%s%3N) + {grace_ms} )) > "$SW_NOTICE.tmp" && mv "$SW_NOTICE.tmp" "$SW_NOTICE"
}}
sw_yield() {{
  # the notice (USR1): the preemptor, and the run's replacement queued behind it, wait for these
  # nodes, and training needs nothing of them once its checkpoint is committed: the job ends then,
  # at the latest at the kill's deadline (slurmctld enforces GraceTime only at its periodic check,
  # up to 30 s late). Once per job; the job's own scancel ends this waiter with it.
  [ -e "$SW_STATE.yielding" ] && return
  : > "$SW_STATE.yielding"
  (
    local end=$(( $(date +%s%3N) + {grace_ms} ))
    while [ ! -e "${checkpointed_env}" ] && [ "$(date +%s%3N)" -lt "$end" ]; do sleep 0.5; done
    # said in the job itself, so it reads as the preemption it is once it is CANCELLED, even where
    # the orchestrator never saw the notice (launch.job_state)
    scontrol update JobId="$SLURM_JOB_ID" Comment={yield_comment} >/dev/null 2>&1 || true
    scancel "$SLURM_JOB_ID"
  ) &
}}
trap 'sw_notice; sw_yield' USR1
trap sw_notice TERM
sw_install() {{
{install}
}}
{torch_fit}
{node}
srun --kill-on-bad-exit=0 --ntasks-per-node=1 bash -c "$(declare -f sw_node sw_install {fit}); sw_node" &
STEP=$!
while kill -0 "$STEP" 2>/dev/null; do wait "$STEP"; done
rm -f "$SW_NOTICE" "${checkpointed_env}" "$SW_STATE.yielding"
'''


def _node() -> str:
    """``sw_node`` with the GPU count and the torch check's call of the cloud GPU nodes."""
    return _NODE.replace("{gpu_count}", GPU_COUNT).replace("{fit_call}", FIT_CALL)


def render(spec: NodeSpec) -> str:
    """The batch script for one job (see the module's docstring)."""
    env = {
        "SW_CLUSTER": spec.cluster_id, "SW_JOB": spec.job_id, "SW_ROLE": spec.role, "SW_ZONE": spec.cloud_zone,
        "SW_MARKET": spec.market, "SW_BUILD": spec.build.build_id,
        "SW_GCS_PORT": str(spec.gcs_port), "SW_HEAD": spec.head_address or "",
        "SW_DASHBOARD_PORT": str(spec.dashboard_port), "SW_BOOT_LEASE": str(int(spec.boot_lease_s)),
        "SW_INSTANCE_LABEL": INSTANCE_LABEL, "SW_RAY_FLAGS": " ".join(RAY_NODE_FLAGS),
        "SW_HEAD_RES": json.dumps({HEAD_RESOURCE: 1}), "SW_WORKER_RES": json.dumps({WORKER_RESOURCE: 1}),
        "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": spec.auth_token,
        # Ray Train looks for node drains every 5 s by default; a Slurm grace time may be 20 s
        "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5",
        # Ray's setproctitle would write its process titles over the marker sw_end's kill finds
        **KEEP_MARKER_ENV,
    }
    if spec.node_dir:
        env["SPOTWISE_SLURM_NODE_DIR"] = spec.node_dir
    if spec.python:        # the install's first choice of a base Python (bootstrap.PYTHON_CANDIDATES)
        env["SPOTWISE_PYTHON"] = spec.python
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
    grace = max(1, int(spec.grace_s))
    return _BATCH.format(role=spec.role, cluster=spec.cluster_id, job=spec.job_id, exports=exports,
                         grace=grace, grace_ms=grace * 1000, node=_node(), checkpointed_env=CHECKPOINTED_FILE_ENV,
                         yield_comment=YIELD_COMMENT,
                         install=install_script(spec.build, spec.extras), torch_fit=torch_fit_function(),
                         fit=TORCH_FIT)

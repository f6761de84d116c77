#!/usr/bin/env bash
# Installs spotwise and everything it needs into ./.venv (CPU build of PyTorch), with every
# cloud SDK and the data tools (the [all] extra: aws, gcp, azure, data).
#   scripts/install.sh          runtime only:          pip install -e '.[all]'
#   scripts/install.sh --test   runtime + test tools:  pip install -e '.[all,test]'
# torch through pip (it takes this machine's CPU build from its wheel folder), the rest through uv
# where uv can be had (the same packages and versions as pip resolves here, in seconds instead of
# about 2.5 minutes), else through pip.
# GPU users: install your CUDA build of torch into the venv first (see README), then run this;
# an already-installed torch that satisfies torch>=2.6 is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
# Some machines' pip configs name local indexes that may not exist; keep the log readable.
pipq() { $PIP "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  pipq install -q "torch==2.13.0"
fi
extras="all"
if [ "${1:-}" = "--test" ]; then extras="all,test"; fi
if pipq install -q "uv==0.13.9" >/dev/null && [ -x .venv/bin/uv ]; then
  # --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set (as on
  # the machines here) no process writes one either, so every Python process (each Ray daemon, actor
  # and worker) compiled Ray, pandas, pyarrow ... from source at every start: measured on one local
  # e2e run, half of all its CPU (docs/architecture.md, "The test suite"). pip compiles by default.
  .venv/bin/uv pip install --python .venv/bin/python -q --compile-bytecode -e ".[${extras}]"
else
  echo "note: uv could not be installed; installing with pip (a few minutes)" >&2
  pipq install -q -e ".[${extras}]"
fi
# The editable package's own modules, and whatever an older venv holds uncompiled (uv compiles only
# what it installs): compiled here for the same reason, about 4 s when nothing is left to do. A later
# edit makes a module's .pyc stale; Python then compiles that module in memory, never wrong. Some
# packages ship deliberately broken test files, hence "|| true".
.venv/bin/python -m compileall -q -j 0 src "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  >/dev/null 2>&1 || true
# Optional, --test only: Debian's Chromium for the dashboard's browser test. Never fails the
# install (no apt, no root, no network: the test then skips and says why).
if [ "${1:-}" = "--test" ] && [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; fi
  { $SUDO apt-get install -y -q chromium >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO apt-get install -y -q chromium >/dev/null 2>&1; }; } \
    || echo "note: could not install chromium; the dashboard browser test will skip" >&2
fi
# Optional, --test only: Debian's Slurm and munge for the Slurm tests (a real two-node cluster on
# 127.0.0.1, started by tests/slurm_cluster.py). Never fails the install: where it cannot, the Slurm
# tests skip and say why.
if [ "${1:-}" = "--test" ] && [ ! -x /usr/sbin/slurmctld ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; fi
  SLURM_PKGS="slurmctld slurmd slurm-client munge"
  { $SUDO apt-get install -y -q $SLURM_PKGS >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO apt-get install -y -q $SLURM_PKGS >/dev/null 2>&1; }; } \
    || echo "note: could not install $SLURM_PKGS; the Slurm tests will skip" >&2
fi
# Optional, --test only: Azurite (Microsoft's Azure Storage emulator, an npm package run by Node) for
# the az:// storage tests (tests/emulator/azurite_server.py), into .venv/tools/azurite, exactly the
# packages scripts/azurite/package-lock.json pins (npm ci). Idempotent: done when the marker written
# after a whole install is there with the same lockfile (an install cut short, which once left a
# tree without one of its modules, is redone). Never fails the install: where there is no npm or
# no registry, the az:// tests skip and say why.
AZ=.venv/tools/azurite
if [ "${1:-}" = "--test" ] && ! cmp -s scripts/azurite/package-lock.json "$AZ/.installed" 2>/dev/null; then
  if command -v npm >/dev/null 2>&1; then
    rm -rf "$AZ" && mkdir -p "$AZ" && cp scripts/azurite/package.json scripts/azurite/package-lock.json "$AZ/"
    if npm ci --prefix "$AZ" --no-audit --no-fund --loglevel=error >/dev/null 2>&1; then
      cp scripts/azurite/package-lock.json "$AZ/.installed"
    else
      echo "note: could not install azurite; the az:// storage tests will skip" >&2
    fi
  else
    echo "note: no npm; the az:// storage tests (Azurite) will skip" >&2
  fi
fi
# Optional, --test only: OpenSSH's server and client for the Slurm-over-ssh tests (a private sshd
# on 127.0.0.1 with its own keys and config, started by tests/sshd.py; the system's sshd is never
# started or configured). Never fails the install: where it cannot, those tests skip and say why.
if [ "${1:-}" = "--test" ] && { [ ! -x /usr/sbin/sshd ] || ! command -v ssh >/dev/null 2>&1; } \
    && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; fi
  SSH_PKGS="openssh-server openssh-client"
  { $SUDO apt-get install -y -q $SSH_PKGS >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO apt-get install -y -q $SSH_PKGS >/dev/null 2>&1; }; } \
    || echo "note: could not install $SSH_PKGS; the Slurm-over-ssh tests will skip" >&2
fi

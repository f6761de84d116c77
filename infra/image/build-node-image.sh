#!/bin/bash
# Node image recipe: run on a fresh Ubuntu 24.04 GPU VM (any cloud; its python3 is 3.12, spotwise
# needs >= 3.11), then snapshot the disk as the image spotwise launches (SPOTWISE_AWS_AMI /
# SPOTWISE_GCP_IMAGE / an Azure gallery image). Idempotent. Versions match spotwise's pins: NVIDIA's
# current driver with the CUDA 12.4 toolkit, torch 2.13.0 (scripts/install.sh's pin) built for CUDA
# 12.8, ray 2.60.
#
# torch and the driver: the driver is NVIDIA's newest (cuda-drivers), which runs any CUDA 12.x build
# (CUDA's minor-version compatibility needs a driver >= 525), so the image takes torch from the PyTorch
# index of a 12.x tag that has TORCH_VERSION (cu128; TORCH_CUDA picks another, e.g. cu126), never
# PyPI's build, whose CUDA (12.8 or 13.x) is chosen without looking at the driver. Every node
# checks again at boot that its torch uses its GPUs and otherwise installs the same version built for a
# CUDA its driver runs, or fails its boot (src/spotwise/provisioner/boot/torch_fit.py).
#
# spotwise itself is never installed by name from a package index (it is not published there, and
# whoever registered the name would get root on every node): pass the wheel of the build you run,
# made with `python -m spotwise.build DIR`, as SPOTWISE_WHEEL with its SPOTWISE_WHEEL_SHA256. Without
# one the image gets torch and Ray only, and each node installs the wheel its launch ships.
set -euo pipefail
CUDA_KEYRING=cuda-keyring_1.1-1_all.deb
VENV=/opt/spotwise/venv
SPOTWISE_WHEEL="${SPOTWISE_WHEEL:-}"                 # optional: bake this build in (see above)
SPOTWISE_WHEEL_SHA256="${SPOTWISE_WHEEL_SHA256:-}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
TORCH_CUDA="${TORCH_CUDA:-cu128}"
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/$TORCH_CUDA}"

export DEBIAN_FRONTEND=noninteractive
apt-get update -y
apt-get install -y --no-install-recommends python3-venv python3-dev build-essential curl ca-certificates

# NVIDIA driver + CUDA toolkit from NVIDIA's repository
if ! command -v nvidia-smi >/dev/null 2>&1; then
  curl -fsSLo /tmp/$CUDA_KEYRING https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/$CUDA_KEYRING
  dpkg -i /tmp/$CUDA_KEYRING
  apt-get update -y
  apt-get install -y --no-install-recommends cuda-drivers cuda-toolkit-12-4 datacenter-gpu-manager
fi

# the runtime venv the bootstrap script reuses (it skips pip when spotwise and ray import)
if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV"; fi
"$VENV/bin/pip" install --upgrade pip
"$VENV/bin/pip" install --index-url "$TORCH_INDEX" "torch==$TORCH_VERSION"   # its nvidia-* wheels come from there too
"$VENV/bin/pip" install "ray[default,train]==2.60.0" "boto3>=1.34"
if [ -n "$SPOTWISE_WHEEL" ]; then
  echo "$SPOTWISE_WHEEL_SHA256  $SPOTWISE_WHEEL" | sha256sum -c - || { echo "SPOTWISE_WHEEL: sha256 mismatch" >&2; exit 1; }
  "$VENV/bin/pip" install "$SPOTWISE_WHEEL[aws]"
  "$VENV/bin/python" -c "import spotwise.build as b; print('spotwise build', b.build_id())"
fi
"$VENV/bin/python" -c "import torch, ray; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'ray', ray.__version__)"
ln -sf "$VENV/bin/ray" /usr/local/bin/ray

# clean per-instance state so every clone boots fresh
rm -rf /var/lib/spotwise /etc/spotwise /tmp/ray
cloud-init clean --logs || true

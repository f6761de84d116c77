#!/bin/bash
# Node image recipe: run on a fresh Ubuntu 22.04 GPU VM (any cloud), then snapshot the disk as the
# image spotwise launches (SPOTWISE_AWS_AMI / SPOTWISE_GCP_IMAGE / an Azure gallery image).
# Idempotent. Versions match spotwise's pins: CUDA 12.4 driver stack, torch (CUDA build), ray 2.60.
set -euo pipefail
CUDA_KEYRING=cuda-keyring_1.1-1_all.deb
VENV=/opt/spotwise/venv
SPOTWISE_SPEC="${SPOTWISE_SPEC:-spotwise[aws]==0.1.0}"   # [aws]: boto3 for s3:// checkpoints
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cu124}"

export DEBIAN_FRONTEND=noninteractive
apt-get update -y
apt-get install -y --no-install-recommends python3-venv python3-dev build-essential curl ca-certificates

# NVIDIA driver + CUDA toolkit from NVIDIA's repository
if ! command -v nvidia-smi >/dev/null 2>&1; then
  curl -fsSLo /tmp/$CUDA_KEYRING https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/$CUDA_KEYRING
  dpkg -i /tmp/$CUDA_KEYRING
  apt-get update -y
  apt-get install -y --no-install-recommends cuda-drivers cuda-toolkit-12-4 datacenter-gpu-manager
fi

# the runtime venv the bootstrap script reuses (it skips pip when spotwise and ray import)
if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV"; fi
"$VENV/bin/pip" install --upgrade pip
"$VENV/bin/pip" install --index-url "$TORCH_INDEX" torch
"$VENV/bin/pip" install "ray[train]==2.60.0" "$SPOTWISE_SPEC"
"$VENV/bin/python" -c "import torch, ray, spotwise; print(torch.__version__, ray.__version__, spotwise.__version__)"
ln -sf "$VENV/bin/ray" /usr/local/bin/ray

# clean per-instance state so every clone boots fresh
rm -rf /var/lib/spotwise /etc/spotwise /tmp/ray
cloud-init clean --logs || true

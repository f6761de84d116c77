"""``training.deterministic``: what a run must set for two runs of it to be bitwise equal, and the
line the runtime logs saying what it set.

What "deterministic" needs, per PyTorch's Reproducibility note
(https://docs.pytorch.org/docs/stable/notes/randomness.html) and ``torch.use_deterministic_algorithms``:

* ``torch.use_deterministic_algorithms(True)``: every op takes its deterministic algorithm, or
  raises where it has none (a silent nondeterministic one is worse than an error);
* on CUDA, ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` before cuBLAS's first handle (cuBLAS >= 10.2 is
  otherwise nondeterministic across streams), cuDNN's ``deterministic`` and no ``benchmark``
  autotuning (which may pick a different kernel each run);
* attention: ``scaled_dot_product_attention``'s flash and cuDNN backends have no deterministic
  backward (flash-attention 2 accumulates dK/dV with atomic adds); the memory-efficient backend
  does, once deterministic algorithms are on (torch warns "Memory Efficient attention defaults to
  a non-deterministic algorithm. To explicitly enable determinism call
  torch.use_deterministic_algorithms(True)"), so the flash and cuDNN backends are turned off.

The default, ``None``, is on for CPU runs (it costs little there and makes exact resume hold) and
off on CUDA, where it costs speed (no flash attention) that a run should choose to pay. With it
off, a GPU run still resumes from the same state (the CUDA RNG state is in the checkpoint), but
two runs of it, interrupted or not, are not bitwise equal. ``docs/runtime.md`` has the table.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Iterator

import torch

log = logging.getLogger("spotwise.runtime.training.loop")

CUBLAS_WORKSPACE = ":4096:8"


def resolve_deterministic(deterministic: bool | None, device: torch.device) -> bool:
    """``deterministic`` when given, else on for CPU and off for CUDA (see the module docstring)."""
    if deterministic is not None:
        return deterministic
    return device.type != "cuda"


def describe(on: bool, device: torch.device) -> str:
    """The start-of-run line: what is bitwise here and what is not."""
    if on and device.type == "cuda":
        return ("deterministic: on (torch deterministic algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8, cuDNN "
                "deterministic, SDPA without flash/cuDNN): same GPU type, world size and software give bitwise-"
                "equal runs and resumes")
    if on:
        return ("deterministic: on (torch deterministic algorithms, fixed thread count): same CPU type, world size "
                "and software give bitwise-equal runs and resumes")
    return ("deterministic: off (training.deterministic: true to turn it on, at a speed cost): two runs are not "
            "bitwise equal; a resume restores model, optimizer, step and RNG states exactly")


@contextmanager
def deterministic_mode(on: bool, device: torch.device) -> Iterator[None]:
    """Set what ``on`` needs for the run's duration (see the module docstring), and put torch's
    process-wide switches back afterwards (a test process runs many loops). The environment
    variable stays: cuBLAS reads it once, when its first handle is made."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    sdpa = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled())
    if on:
        if device.type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
            torch.backends.cuda.enable_flash_sdp(False)
            torch.backends.cuda.enable_cudnn_sdp(False)
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
        torch.backends.cuda.enable_flash_sdp(sdpa[0])
        torch.backends.cuda.enable_cudnn_sdp(sdpa[1])

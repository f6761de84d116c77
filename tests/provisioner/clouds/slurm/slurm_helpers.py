"""Shared by the Slurm tests: the recorded outputs, the config file, the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

DATA = Path(__file__).resolve().parent / "data"


def recorded(name: str) -> str:
    """An output recorded from the tests' Slurm 22.05.8 cluster (tests/slurm_cluster.py)."""
    return (DATA / name).read_text()


def write_config(path: Path, clusters: list[dict]) -> Path:
    path.write_text(yaml.safe_dump({"slurm": {"clusters": clusters}}))
    return path


def run_cli(*args: str, home: Path, config: Path, timeout: float = 120, **env_extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SPOTWISE_HOME=str(home), SPOTWISE_CONFIG=str(config), **env_extra)
    return subprocess.run([sys.executable, "-m", "spotwise.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)

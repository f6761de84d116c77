"""The real Slurm cluster of the Slurm tests (one per session; skipped, saying why, where Slurm or
root is missing). See ``tests/slurm_cluster.py``."""

from __future__ import annotations

import pytest

from slurm_cluster import cluster_fixture

slurm_cluster = pytest.fixture(scope="session")(cluster_fixture)

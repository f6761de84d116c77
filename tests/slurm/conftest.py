"""The real Slurm cluster of the Slurm tests (one per session; skipped, saying why, where Slurm or
root is missing). See ``tests/slurm_cluster.py``."""

from __future__ import annotations

import pytest

from slurm_cluster import TestCluster, missing


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(why)
    cluster = TestCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()

"""Fixtures for orchestrator tests that run real local nodes (no Ray Train); ``local_home`` is in
tests/conftest.py."""

from __future__ import annotations

import time

import pytest

from spotwise.engine.run.orchestrator import Orchestrator
from spotwise.provisioner.base import LaunchRequest
from spotwise.provisioner.clouds.local.cloud import LocalCloud


@pytest.fixture
def head_up():
    """Start a run as the orchestrator does before training: its job recorded as running and its
    Ray head up on the local cloud (the fleet's own ``local`` cloud, adopted as the head). Returns
    the local cloud; the caller ends the run (``o.fleet.teardown()``)."""

    def start(o: Orchestrator) -> LocalCloud:
        o.row.record("running")
        cloud = o.fleet.cloud("local")
        assert isinstance(cloud, LocalCloud)
        cloud.prepare_cluster(o.cluster_id, o.job_id, "local")
        [h] = cloud.launch(LaunchRequest(cluster_id=o.cluster_id, job_id=o.job_id,
                                         offer=cloud.head_offer("local", "local-a"), role="head"))
        o.fleet.adopt(h)
        o.fleet.head = h
        o.driver.started = time.time()
        return cloud

    return start

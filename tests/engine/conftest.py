"""Fixtures for orchestrator tests that run real local nodes (no Ray Train); ``local_home`` is in
tests/conftest.py."""

from __future__ import annotations

import time

import pytest

from spotwise.engine.orchestrator import Orchestrator
from spotwise.provisioner.base import LaunchRequest
from spotwise.provisioner.failover import Failover
from spotwise.provisioner.local import LocalCloud


@pytest.fixture
def head_up():
    """Start a run as the orchestrator does before training: its job recorded as running, its
    failover (``failover``, else a default one) made, and its Ray head up on the local cloud.
    Returns the local cloud; the caller ends the run (``_teardown``)."""

    def start(o: Orchestrator, failover: Failover | None = None) -> LocalCloud:
        o.row.record("running")
        o._failover = failover or Failover(cloud_factory=o.cloud)
        cloud = o.cloud("local")
        cloud.prepare_cluster(o.cluster_id, o.job_id, "local")
        [h] = cloud.launch(LaunchRequest(cluster_id=o.cluster_id, job_id=o.job_id,
                                         offer=cloud.head_offer("local", "local-a"), role="head"))
        o._head = h
        o._adopt(h)
        o.driver.started = time.time()
        return cloud

    return start

import os

import pytest
import torch.distributed as dist

from .fakes import FakeMetadata, MotoServer, free_port
from .stores import SCHEMES, ObjStore


@pytest.fixture
def pg1(monkeypatch):
    """An in-process gloo group of one rank (FSDP2 and DCP need a process group). The rendezvous
    variables are undone afterwards: a leftover MASTER_PORT would send a later test's subprocess
    to a port that may still be taken."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def moto():
    m = MotoServer()
    yield m
    m.close()


@pytest.fixture(scope="session")
def gcs():
    from emulator.gcs_server import GcsEmulator

    g = GcsEmulator()
    yield g
    g.close()


@pytest.fixture(scope="session")
def azurite():
    """Azurite on loopback; the test skips (saying why) where scripts/install.sh --test could not
    install it (no Node or npm)."""
    from emulator.azurite_server import Azurite, azurite_bin

    if azurite_bin() is None:
        pytest.skip("azurite is not installed (scripts/install.sh --test installs it with npm)")
    a = Azurite()
    yield a
    a.close()


@pytest.fixture(params=SCHEMES)
def objstore(request):
    """Each emulated object store in turn (S3 on moto, GCS on gcp-storage-emulator, Azure Blob on
    Azurite); a server is started only when a test first uses it."""
    server = request.getfixturevalue({"s3": "moto", "gs": "gcs", "az": "azurite"}[request.param])
    return ObjStore(request.param, server)


@pytest.fixture
def metadata():
    m = FakeMetadata()
    yield m
    m.close()


RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "GLOO_SOCKET_IFNAME": "lo",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",
    "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.2",
    "RAY_DEDUP_LOGS": "0",
}


class LocalRayCluster:
    """Head (no CPUs: only the controller and small actors) + worker nodes that look like the
    local cloud's: one CPU, one ``spotwise-worker`` resource, label ``spotwise-instance=<id>``."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        self.nodes = {}
        self.address = self.cluster.address
        self.gcs_address = self.cluster.gcs_address
        self._next = 1

    def add_worker(self) -> str:
        iid = f"i-{self._next:04d}"
        self._next += 1
        self.nodes[iid] = self.cluster.add_node(num_cpus=1, resources={"spotwise-worker": 1},
                                                labels={"spotwise-instance": iid})
        self.cluster.wait_for_nodes()
        return iid

    def remove_worker(self, iid: str) -> None:
        node = self.nodes.pop(iid)
        self.cluster.remove_node(node, allow_graceful=False)

    def node_of(self, iid: str) -> str:
        return self.nodes[iid].node_id

    def shutdown(self) -> None:
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def ray_cluster():
    """One Ray cluster per test module (started on first use). Not per session: its ``RAY_ENV``
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` stops any other node from joining a cluster) must not
    outlive the module, because a pytest-xdist worker may run an end-to-end module next, whose
    nodes inherit this process's environment; a GCP e2e run after test_ray on one worker waited
    for workers that could not join."""
    old = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)
    import ray

    c = LocalRayCluster()
    c.add_worker()
    c.add_worker()
    ray.init(address=c.address, runtime_env={"env_vars": {"RAY_ADDRESS": c.address}},
             include_dashboard=False, logging_level="WARNING")
    yield c
    ray.shutdown()
    c.shutdown()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v

"""The runner SIGKILLed mid-run on emulated AWS: every instance is gone from the cloud within the
documented bound, ended by its own node (a guest ``shutdown -h now`` through ``sudo``, which EC2
turns into a termination by the launch template's shutdown behaviour), with no ``gc``; ``gc`` then
only marks the job ``lost`` and deletes what outlives an instance by design (:mod:`e2e.killrun`
says the chain and the bound).

The run is the smallest that is mid-run (one worker). GCP's SIGKILL is the first leg of its e2e run
(test_launch_gcp.py), whose lost run then goes on with ``spotwise resume JOB --budget`` to the
weights of the uninterrupted run. Azure's was a second case here until the sixteenth session: its
node ends itself the way GCP's does (deleting its own VM through its identity, proven end to end by
GCP's leg), and what is Azure's own is held in seconds: the boot script's ``--self-end azure``
(tests/provisioner/clouds/azure/test_azure_cluster.py) and ``azure_delete_self`` deleting the VM
through the ARM fake with a token from the VM's IMDS (same module). AWS's guest shutdown is the odd
one out (a different mechanism, through the image's ``sudo``), so it keeps its run. (The local
cloud's own way of ending itself, ``--self-end local``, is held with the real watcher in
tests/engine/state/test_lease.py.) The preemption and billing of each cloud are proven by its own e2e
run (test_launch_aws/gcp/azure.py), and each node's way of ending itself against the fakes, without
Ray, by tests/test_emulator_guest_shutdown.py and tests/provisioner/clouds/gcp/test_gcp_cluster.py /
test_azure_cluster.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from e2e.helpers import checkpoint_committed, cloud_task
from e2e.killrun import sigkill_runner_mid_run
from spotwise.provisioner.clouds.local.cloud import marked_pids

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

CAP_USD = 5.0
# Long enough that the kill lands mid-run (it comes within a second or two of the first checkpoint's
# marker, at step 20; one rank takes several seconds for the rest), short enough that the rank is
# not still training while the test waits out the lease: 100000 steps had it burn a core for the
# whole wait, beside the other slow test.
STEPS = 600


def _aws(tmp_path: Path):
    import boto3

    from emulator.aws import EmulatedAws

    emu = EmulatedAws(tmp_path / "aws")
    s3: list[Any] = []

    def committed() -> bool:
        if not s3:
            s3.append(boto3.client("s3", endpoint_url=emu.endpoint, region_name=emu.region,
                                   aws_access_key_id="testing", aws_secret_access_key="testing"))
        return checkpoint_committed(s3[0], emu.bucket)
    return emu, "us-east-1", lambda: "s3://ckpt/runs", committed, "instances"


CLOUDS: dict[str, Callable] = {"aws": _aws}


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_sigkilled_runner_every_instance_ends_itself_without_gc(cloud, tmp_path):
    emu, region, storage, committed, kind = CLOUDS[cloud](tmp_path)
    with emu:
        task = cloud_task(tmp_path, [cloud], [region], budget_usd=CAP_USD, resources={"nodes": 1},
                          training={"steps": STEPS})
        sigkill_runner_mid_run(emu, cloud, tmp_path, task, storage(), committed, kind, machines=2, cap_usd=CAP_USD)
    assert marked_pids(home_prefix=str(tmp_path)) == [], "an emulated node outlived its instance"

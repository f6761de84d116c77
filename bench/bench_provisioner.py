"""Provisioner benchmark: time to get an N-node AWS cluster up (moto, in-process).

spotwise: failover launches the head, then all workers in ONE EC2 Fleet call.
baseline (same run): one fleet call per node, as a launcher that creates nodes one by one would.
Prints wall times, API call counts and the ratio baseline / spotwise.
Run: .venv/bin/python bench/bench_provisioner.py [NODES] [REPEATS]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.update({"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1",
                   "SPOTWISE_AWS_REGIONS": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
os.environ.pop("AWS_ENDPOINT_URL", None)

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402

from spotwise.pricing.offer import Market, Offer  # noqa: E402
from spotwise.provisioner.clouds.aws.cloud import AwsCloud  # noqa: E402
from spotwise.provisioner.base import LaunchRequest  # noqa: E402
from spotwise.provisioner.failover import Failover  # noqa: E402

OFFER = Offer(cloud="aws", instance_type="p4d.24xlarge", accelerator="A100", accelerator_count=8,
              region="us-east-1", zone="use1-az6", market=Market.SPOT, usd_per_hour=5.09, source="bench",
              as_of="2025-01-01")


def _counting(cloud: AwsCloud) -> list[int]:
    n = [0]
    cloud.client("us-east-1").meta.events.register("before-call.ec2.CreateFleet", lambda **_: n.__setitem__(0, n[0] + 1))
    return n


def run(nodes: int) -> tuple[float, int, float, int]:
    with mock_aws():
        image = boto3.client("ec2", region_name="us-east-1").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        cloud = AwsCloud(image_id=image)
        calls = _counting(cloud)
        t0 = time.perf_counter()
        c = Failover(cloud_factory=lambda _: cloud).provision([OFFER], cluster_id="bench", job_id="bench", nodes=nodes)
        t_sw, n_sw = time.perf_counter() - t0, calls[0]
        assert len(c.nodes) == nodes
        cloud.terminate(c.nodes)

        calls[0] = 0
        t0 = time.perf_counter()
        got = []
        for i in range(nodes):
            got += cloud.launch(LaunchRequest(cluster_id="base", job_id="base", offer=OFFER, count=1,
                                              role="head" if i == 0 else "worker"))
        t_base, n_base = time.perf_counter() - t0, calls[0]
        cloud.terminate(got)
    return t_sw, n_sw, t_base, n_base


def main() -> None:
    nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    runs = [run(nodes) for _ in range(repeats)]
    t_sw = statistics.median(r[0] for r in runs)
    t_base = statistics.median(r[2] for r in runs)
    print(f"nodes={nodes} repeats={repeats}")
    print(f"spotwise failover (head + one fleet): {t_sw:.3f} s, {runs[0][1]} CreateFleet calls")
    print(f"baseline one fleet per node:          {t_base:.3f} s, {runs[0][3]} CreateFleet calls")
    print(f"ratio baseline/spotwise: time {t_base / t_sw:.2f}x, calls {runs[0][3] / runs[0][1]:.2f}x")


if __name__ == "__main__":
    main()

"""One launch over two clouds: AWS is out of capacity everywhere, so the same launch lands on GCP.

Both emulated clouds run at once (moto for EC2, the Compute Engine wire fake for GCP, each with its
instance emulator executing the boot scripts spotwise sent). The plan ranks AWS first (cheaper);
every AWS offer — the workers' spot types and the head's on-demand type — answers
InsufficientInstanceCapacity, so provisioning walks on to the plan's GCP site, where training runs
to the weights of an uninterrupted local run. Nothing is left on either cloud.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
import yaml

from e2e.conftest import EXAMPLE
from emulator.aws import EmulatedAws
from emulator.gcp import EmulatedGcp
from spotwise.provisioner.local import marked_pids

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture
def clouds(tmp_path):
    with EmulatedAws(tmp_path / "aws") as aws, EmulatedGcp(tmp_path / "gcp", notice_s=12.0) as gcp:
        yield aws, gcp
    assert marked_pids(home_prefix=str(tmp_path)) == [], "an emulated node outlived its instance"


def test_aws_out_of_capacity_everywhere_lands_the_launch_on_gcp(clouds, tmp_path, reference):
    aws, gcp = clouds
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["resources"].update({"accelerators": "A100:8", "clouds": ["aws", "gcp"],
                              "regions": ["us-east-1", "us-central1"], "market": "spot"})
    spec.pop("local", None)
    spec["budget_usd"] = 8.0
    task = tmp_path / "task.yaml"
    task.write_text(yaml.safe_dump(spec))
    env = dict(os.environ, **gcp.env())
    env.update(aws.env())                      # checkpoints on the AWS emulator's S3 (the bucket of both)
    env["SPOTWISE_HOME"] = str(tmp_path / "home")

    dry = json.loads(subprocess.run([sys.executable, "-m", "spotwise.cli", "launch", str(task), "--dry-run",
                                     "--format", "json", "--storage", "s3://ckpt/runs"],
                                    env=env, capture_output=True, text=True, check=True).stdout)
    assert dry["chosen"]["cloud"] == "aws", "the plan must rank AWS first for this to test a failover"
    assert any(f["cloud"] == "gcp" for f in dry["fallbacks"])
    aws.set_no_capacity(["*:spot", "*:on-demand"])          # every AWS offer, the head's type too

    p = subprocess.Popen([sys.executable, "-m", "spotwise.cli", "launch", str(task), "--format", "json",
                          "--storage", "s3://ckpt/runs"], env=env, stdout=subprocess.PIPE,
                         stderr=open(tmp_path / "launch.err", "w"), text=True)
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(out=p.communicate(timeout=1500)[0]), daemon=True)
    t.start()
    t.join()
    assert box.get("out", "").strip(), (tmp_path / "launch.err").read_text()[-4000:]
    rep = json.loads(box["out"])

    assert rep["status"] == "succeeded", (rep["message"], (tmp_path / "launch.err").read_text()[-3000:])
    assert rep["model_sha256"] == reference["model_sha256"], "weights differ from the uninterrupted local run"
    assert (rep["cloud"], rep["region"], rep["cloud_used"]) == ("gcp", "us-central1", ["gcp"])
    aws_attempts = [a for a in rep["attempts"] if a["offer"].startswith("aws/")]
    assert aws_attempts and all(a["outcome"] in ("capacity", "skipped") for a in aws_attempts), aws_attempts
    assert any("InsufficientInstanceCapacity" in a["message"] for a in aws_attempts)
    assert rep["cost_usd"] <= rep["budget_usd"]
    assert aws.instances() == [] and aws.leftovers() == {"instances": [], "volumes": [], "network_interfaces": [],
                                                         "security_groups": []}
    assert gcp.leftovers() == {"instances": [], "disks": [], "addresses": [], "firewalls": []}
    assert not aws.errors and not gcp.errors

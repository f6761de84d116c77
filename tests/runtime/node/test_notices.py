"""Metadata pollers against loopback fakes of AWS IMDSv2, GCP metadata and Azure Scheduled Events."""

import time

import pytest

from spotwise.runtime.node.notices import AwsImds, AzureScheduledEvents, GcpMetadata, _parse_time_ms
from spotwise.runtime.node.watch import main as watch_main

from ..fakes import iso


def test_aws_imdsv2_no_notice_then_notice(metadata):
    p = AwsImds(metadata.base("i-1"))
    assert p.poll() is None
    assert ("PUT", "/latest/api/token") in metadata.calls
    t = time.time() + 120
    metadata.aws["i-1"] = {"action": "terminate", "time": iso(t)}
    n = p.poll()
    assert n.cloud == "aws" and n.action == "terminate" and abs(n.deadline_ms - int(t) * 1000) < 1000
    assert sum(1 for c in metadata.calls if c[0] == "PUT") == 1     # token reused


def test_aws_token_renewed_on_401(metadata):
    p = AwsImds(metadata.base("i-1"))
    p.poll()
    metadata.tokens.clear()              # server forgot the token
    assert p.poll() is None
    assert sum(1 for c in metadata.calls if c[0] == "PUT") == 2


def test_gcp_preempted(metadata):
    p = GcpMetadata(metadata.base("g-1"), wait_timeout_s=1)
    assert p.poll() is None
    metadata.gcp_preempted.add("g-1")
    n = p.poll()
    assert n.cloud == "gcp" and 25_000 < n.deadline_ms - time.time() * 1000 <= 30_000


def test_azure_preempt_event_and_ack(metadata):
    p = AzureScheduledEvents(metadata.base("vm-1"), vm_name="vm-1")
    metadata.azure_events["vm-1"] = [
        {"EventId": "e0", "EventType": "Freeze", "Resources": ["vm-1"]},
        {"EventId": "e1", "EventType": "Preempt", "Resources": ["vm-2"], "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"}]
    assert p.poll() is None                 # other VM's preemption, and a Freeze
    metadata.azure_events["vm-1"].append(
        {"EventId": "e2", "EventType": "Preempt", "Resources": ["vm-1"], "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"})
    n = p.poll()
    assert n.event_id == "e2" and n.deadline_ms == _parse_time_ms("2016-09-19T18:29:47Z")
    p.acknowledge("e2")
    assert metadata.azure_acks == [{"StartRequests": [{"EventId": "e2"}]}]


def test_watch_once_without_notice_exits_zero(metadata):
    assert watch_main(["--cloud", "aws", "--metadata-url", metadata.base("i-9"), "--instance-id", "i-9",
                       "--gcs-address", "127.0.0.1:1", "--once"]) == 0


def test_watch_rejects_bad_cloud(capsys):
    with pytest.raises(SystemExit) as e:
        watch_main(["--cloud", "ibm", "--instance-id", "x", "--gcs-address", "h:1"])
    assert e.value.code == 2
    assert "invalid choice: 'ibm'" in capsys.readouterr().err


def test_slurm_notice_file(tmp_path):
    """A Slurm job's notice: the deadline (epoch ms) its batch script writes on Slurm's signal."""
    from spotwise.runtime.node.notices import make_poller

    path = tmp_path / "sw-42.notice"
    poller = make_poller("slurm", f"file://{path}")
    assert poller.poll() is None                      # no signal yet
    path.write_text("")                               # being written: not a notice yet
    assert poller.poll() is None
    deadline = int(time.time() * 1000) + 20_000
    path.write_text(f"{deadline}\n")
    n = poller.poll()
    assert (n.cloud, n.action, n.deadline_ms) == ("slurm", "terminate", deadline)
    with pytest.raises(ValueError, match="notice file"):
        make_poller("slurm", None)

"""The emulated clouds treat a node's own ``shutdown`` as each cloud does (the emulators must be
as strict as the clouds): EC2 per the instance's shutdown behaviour, GCP leaves the VM TERMINATED
with its disk. No node is booted here: the machines are launched through spotwise's own cloud
code, and the guest's ``shutdown`` is the emulator's, run as a node's dead man's switch runs it."""

from __future__ import annotations

import os
import subprocess

from emulator.aws import EmulatedAws
from emulator.gcp import EmulatedGcp
from helpers import offer
from spotwise.provisioner.base import LaunchRequest
from spotwise.provisioner.clouds.local.procs import MARKER_ENV


class _NoBoot:
    """An emulator whose instance loop does not run: nothing boots, the test plays the guest."""

    def _start_loop(self) -> None:
        pass


class QuietAws(_NoBoot, EmulatedAws):
    pass


class QuietGcp(_NoBoot, EmulatedGcp):
    pass


def _guest_runs_shutdown(emu, name: str) -> None:
    """What the dead man's switch runs on a node that is not root, on the node's PATH."""
    emu.nodes[name] = f"emu-{name}"
    env = {**os.environ, MARKER_ENV: f"emu-{name}", "PATH": f"{emu._guest_bin()}:{os.environ['PATH']}"}
    subprocess.run(["sudo", "-n", "shutdown", "-h", "now"], env=env, check=True, timeout=30)
    emu._halts()


def test_an_ec2_guest_shutdown_terminates_per_the_shutdown_behaviour(tmp_path, monkeypatch):
    from spotwise.provisioner.clouds.aws.cloud import AwsCloud

    with QuietAws(tmp_path / "aws") as emu:
        for k, v in emu.env().items():
            monkeypatch.setenv(k, v)
        cloud = AwsCloud()
        [node] = cloud.launch(LaunchRequest(cluster_id="c1", job_id="j1", role="worker",
                                            offer=offer("aws", "p4d.24xlarge", "us-east-1", "us-east-1a", usd=9.0)))
        _guest_runs_shutdown(emu, node.instance_id)
        assert emu.halted == [node.instance_id]
        [state] = [i["State"]["Name"] for i in emu.instances(("pending", "running", "shutting-down", "stopping",
                                                              "stopped", "terminated")) if i["InstanceId"] == node.instance_id]
        assert state in ("shutting-down", "terminated")       # spotwise's template: terminate
        # an instance without that behaviour (EC2's default, stop) is only stopped: its disks still bill
        plain = emu.ec2.run_instances(ImageId=emu.ami, MinCount=1, MaxCount=1, InstanceType="m5.large",
                                      TagSpecifications=[{"ResourceType": "instance",
                                                          "Tags": [{"Key": "spotwise-cluster", "Value": "c2"}]}])
        iid = plain["Instances"][0]["InstanceId"]
        _guest_runs_shutdown(emu, iid)
        assert [i["State"]["Name"] for i in emu.instances() if i["InstanceId"] == iid] in (["stopping"], ["stopped"])


def test_the_real_watcher_of_an_ec2_node_whose_lease_passed_ends_its_instance_through_the_guests_shutdown(
        tmp_path, monkeypatch):
    """An AWS node's dead man's switch, without Ray: the watcher process the boot script starts
    (``--self-end shutdown``, its lease already past and no head to ask) runs the guest's
    ``shutdown -h now`` (as root here; ``sudo -n`` otherwise), and EC2 terminates the instance by the
    shutdown behaviour spotwise's launch template sets. The whole chain with a SIGKILLed runner (the
    lease pushed, the runner killed, every node ending itself, ``gc`` marking the job lost) runs end to
    end on GCP (tests/e2e/test_launch_gcp.py's first leg); this is what AWS does differently (it was a
    whole e2e run of its own until the seventeenth session, 90-115 s of the slow phase)."""
    import sys
    import time

    from spotwise.provisioner.clouds.aws.cloud import AwsCloud

    with QuietAws(tmp_path / "aws") as emu:
        for k, v in emu.env().items():
            monkeypatch.setenv(k, v)
        [node] = AwsCloud().launch(LaunchRequest(cluster_id="c1", job_id="j1", role="worker", offer=offer(
            "aws", "p4d.24xlarge", "us-east-1", "us-east-1a", usd=9.0)))
        iid = node.instance_id
        import base64

        user_data = base64.b64decode(emu.ec2.describe_instance_attribute(
            InstanceId=iid, Attribute="userData")["UserData"]["Value"]).decode()
        assert "--self-end shutdown" in user_data       # what the node's boot starts its watcher with
        marker = f"emu-{iid}"
        emu.nodes[iid] = marker
        env = {**os.environ, MARKER_ENV: marker, "PATH": f"{emu._guest_bin()}:{os.environ['PATH']}"}
        w = subprocess.run([sys.executable, "-m", "spotwise.runtime.node.watch", "--cloud", "aws",
                            "--metadata-url", "http://127.0.0.1:9", "--instance-id", iid,
                            "--gcs-address", "127.0.0.1:9", "--lease-deadline", str(time.time() - 1),
                            "--self-end", "shutdown"], env=env, capture_output=True, text=True, timeout=120)
        assert "dead man's switch: ending this node" in w.stderr, w.stderr[-2000:]
        assert "could not shut this node down" not in w.stderr, w.stderr[-2000:]
        emu._halts()
        assert emu.halted == [iid]
        states = {i["InstanceId"]: i["State"]["Name"] for i in emu.instances(("pending", "running", "shutting-down",
                                                                               "stopping", "stopped", "terminated"))}
        assert states[iid] in ("shutting-down", "terminated")
        assert emu.leftovers()["instances"] == [], emu.leftovers()


def test_a_gcp_guest_shutdown_leaves_the_vm_terminated_with_its_disk(tmp_path, monkeypatch):
    from google.auth.credentials import AnonymousCredentials

    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    with QuietGcp(tmp_path / "gcp") as emu:
        cloud = GcpCloud(project=emu.project, credentials=AnonymousCredentials(), endpoint=emu.fake.endpoint)
        [node] = cloud.launch(LaunchRequest(cluster_id="c1", job_id="j1", role="worker",
                                            offer=offer("gcp", "a2-highgpu-1g", "us-central1", "us-central1-a", usd=1.0)))
        _guest_runs_shutdown(emu, node.instance_id)
        assert [i["status"] for i in emu.instances()] == ["TERMINATED"]
        assert emu.leftovers()["instances"] == [node.instance_id]    # still there, with its disk, until deleted


def _gcp_node_playing_a_rank(emu, tmp_path, cloud, run_storage: str | None):
    """A Spot worker launched through spotwise's GCP code, played by the test: its state dir
    records the venv of this checkout (which has spotwise) as the boot script does, and one marked
    process stands for a rank: on SIGTERM it writes which checkpoints were committed then."""
    import json
    import sys
    import time as _time

    cloud.run_storage = run_storage
    [node] = cloud.launch(LaunchRequest(cluster_id="c1", job_id="j1", role="worker",
                                        offer=offer("gcp", "a2-highgpu-1g", "us-central1", "us-central1-a")))
    name = node.instance_id
    inst = next(i for i in emu.instances() if i["name"] == name)
    emu.md.set_instance(name, instance_id=inst["id"], zone="us-central1-a", project=emu.project,
                        ip=inst["networkInterfaces"][0]["networkIP"], attributes=emu.fake.metadata(inst))
    state = tmp_path / "state"
    state.mkdir()
    (state / "venv").write_text(sys.prefix + "\n")
    marker = f"emu-{name}"
    env = {**os.environ, MARKER_ENV: marker, "SPOTWISE_STATE_DIR": str(state),
           "SPOTWISE_METADATA_URL": emu.md.base_url(name)}
    emu.nodes[name], emu.envs[name] = marker, env
    got = tmp_path / "rank-got-sigterm"
    rank = subprocess.Popen(["bash", "-c", f'trap "ls {tmp_path}/store/j1/checkpoints >{got}.part 2>/dev/null; '
                             f'mv {got}.part {got}; exit 0" TERM; while true; do sleep 0.1; done'], env=env)
    commit = lambda step: _write_commit(tmp_path / "store" / "j1", step, _time.time(), json)  # noqa: E731
    return name, rank, got, commit


def _write_commit(run, step: int, at: float, json) -> None:
    d = run / "checkpoints" / f"step_{step:09d}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "COMMITTED").write_text(json.dumps({"step": step, "kind": "preemption", "world_size": 1, "time": at}))


def _hold_running(marker: str) -> bool:
    from spotwise.provisioner.clouds.local.procs import marked_pids

    for pid in marked_pids(marker):
        try:
            if b"spotwise.runtime.node.hold" in open(f"/proc/{pid}/cmdline", "rb").read():
                return True
        except OSError:
            pass
    return False


def _wait(pred, what: str) -> None:
    import time as _time

    for _ in range(1200):
        if pred():
            return
        _time.sleep(0.1)
    raise AssertionError(what)


def test_a_gcp_preemption_shuts_the_guest_down_and_the_node_holds_it_for_the_checkpoint(tmp_path):
    """GCE preempts with an ACPI soft off: the guest's shutdown runs the instance's
    shutdown-script, then SIGTERMs what is left, and powers off 30 s later. spotwise's
    shutdown-script holds it until the run's just-in-time checkpoint commits, so the ranks are
    stopped only after it (issue 48, item 8: before, the emulated notice was a metadata flag
    only, and a real node's processes were stopped while the checkpoint was being written)."""
    from google.auth.credentials import AnonymousCredentials

    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    with QuietGcp(tmp_path / "gcp") as emu:
        cloud = GcpCloud(project=emu.project, credentials=AnonymousCredentials(), endpoint=emu.fake.endpoint)
        name, rank, got, commit = _gcp_node_playing_a_rank(emu, tmp_path, cloud, (tmp_path / "store").as_uri())
        try:
            emu.preempt(name, notice_s=30)
            _wait(lambda: got.exists() or _hold_running(emu.nodes[name]), "neither a hold nor a SIGTERM came")
            assert not got.exists(), "the node's processes got SIGTERM before the just-in-time checkpoint"
            commit(7)                                              # the just-in-time checkpoint commits
            _wait(got.exists, "the guest's shutdown never went on")
            assert got.read_text().split() == ["step_000000007"]   # the rank was stopped after the commit
            assert emu.shutdown_scripts[name] == 0 and emu.sigtermed == [name]
        finally:
            rank.kill()


def test_a_gcp_preemption_without_a_shutdown_script_sigterms_the_node_at_the_notice(tmp_path):
    """The emulator's rule alone: a guest with no shutdown-script (a run without storage: nothing
    to wait for) has its processes stopped at the notice, not at the hard off."""
    from google.auth.credentials import AnonymousCredentials

    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    with QuietGcp(tmp_path / "gcp") as emu:
        cloud = GcpCloud(project=emu.project, credentials=AnonymousCredentials(), endpoint=emu.fake.endpoint)
        name, rank, got, _ = _gcp_node_playing_a_rank(emu, tmp_path, cloud, None)
        try:
            emu.preempt(name, notice_s=600)                        # the hard off is far away
            _wait(got.exists, "no SIGTERM at the notice")
            assert emu.sigtermed == [name] and name not in emu.shutdown_scripts
            assert [i["name"] for i in emu.instances()] == [name]  # still there until the hard off
        finally:
            rank.kill()


def test_the_gcp_shutdown_script_holds_nothing_when_the_node_was_not_preempted(tmp_path):
    """A deletion (teardown, the node's own dead man's switch) also runs the shutdown-script: with
    ``instance/preempted`` FALSE it ends at once, no checkpoint is waited for (each second bills)."""
    from emulator.gcp_metadata import GcpMetadataServer
    from spotwise.provisioner.clouds.gcp.shutdown import shutdown_script

    state = tmp_path / "state"
    state.mkdir()
    (state / "venv").write_text(str(tmp_path / "no-venv"))     # would fail loudly if it were run
    md = GcpMetadataServer().start()
    try:
        md.set_instance("sw-w", instance_id="1", zone="us-central1-a", ip="127.17.0.9", attributes={})
        env = {**os.environ, "SPOTWISE_STATE_DIR": str(state), "SPOTWISE_METADATA_URL": md.base_url("sw-w")}
        script = tmp_path / "shutdown-script"
        script.write_text(shutdown_script((tmp_path / "store" / "j1").as_uri()))
        r = subprocess.run(["bash", str(script)], env=env, timeout=60)
        assert r.returncode == 0 and not (state / "shutdown.log").exists()
        md.preempt("sw-w")                                          # preempted: the hold runs (here: no venv)
        r = subprocess.run(["bash", str(script)], env=env, timeout=60)
        assert r.returncode != 0 and (state / "shutdown.log").exists()
    finally:
        md.stop()

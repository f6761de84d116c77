"""The batch script of a Slurm job, as text and as bash (no cluster): every node installs the
shipped build with the cloud nodes' own install step, runs Ray from that venv, and ends its
processes with the dead man's switch's own ``kill_marked``."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from spotwise.build import BootBuild
from spotwise.provisioner.boot.script import install_script
from spotwise.provisioner.clouds.slurm.script import NodeSpec, render
from spotwise.runtime.node.deadman import marked

BUILD = BootBuild(build_id="0123456789abcdef", name="spotwise-0.1.0+b0123456789abcdef-py3-none-any.whl",
                  sha256="ab" * 32, url="file:///store/_builds/x/w.whl")


def _spec(**over) -> NodeSpec:
    kw: dict = dict(cluster_id="c1", job_id="j1", role="worker", cloud_zone="preemptible", market="spot",
                    build=BUILD, python="/opt/base/bin/python3", gcs_port=6379, head_address="10.0.0.1:6379",
                    grace_s=20.0)
    kw.update(over)
    return NodeSpec(**kw)


def test_every_node_installs_the_shipped_build_with_the_cloud_nodes_install_step_and_runs_ray_from_it():
    script = render(_spec())
    assert install_script(BUILD, "aws") in script            # the very text a cloud node's boot script runs
    assert "export SPOTWISE_PYTHON=/opt/base/bin/python3" in script       # the configured base Python
    assert "export SW_BUILD=0123456789abcdef" in script
    # the launcher's Python environment, which sbatch exports, is dropped before anything runs
    assert script.index("unset PYTHONPATH PYTHONHOME VIRTUAL_ENV") < script.index("export SW_CLUSTER")
    # ... and, after sbatch over ssh, the session's ssh variables (bash -c would source ~/.bashrc)
    assert script.index("unset SSH_CLIENT SSH2_CLIENT SSH_CONNECTION") < script.index("export SW_CLUSTER")
    # installed per node inside the srun step (no shared filesystem), one install at a time on a node
    assert 'flock 9; sw_install;' in script and "declare -f sw_node sw_install" in script
    assert '"$PY" -m ray.scripts.scripts start' in script and '"$PY" -m spotwise.runtime.node.watch' in script
    assert "SW_PY" not in script and "sys.executable" not in script
    # the SIGTERM trap ends the node's processes with the dead man's switch's function, not a copy
    assert '"$PY" -m spotwise.runtime.node.deadman --kill-marked "SPOTWISE_SLURM_INSTANCE=$IID"' in script
    assert "os.kill" not in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)      # it parses as bash


def test_without_a_configured_python_the_node_looks_for_one_as_a_cloud_image_does():
    script = render(_spec(python=None))
    assert "export SPOTWISE_PYTHON" not in script and "unset PYTHONPATH PYTHONHOME VIRTUAL_ENV" in script
    assert "python3.13 python3.12 python3.11 python3" in script


def test_a_malformed_build_is_refused_before_anything_is_rendered():
    with pytest.raises(ValueError, match="build"):
        _spec(build=BootBuild(build_id="x", name="w.whl", sha256="0", url="file:///x"))


def test_kill_marked_ends_every_marked_process_and_only_those(tmp_path):
    env = dict(os.environ, SPOTWISE_SLURM_INSTANCE="c1-worker-7-n1")
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    ours = [subprocess.Popen(sleeper, env=env) for _ in range(2)]
    other = subprocess.Popen(sleeper, env=dict(os.environ, SPOTWISE_SLURM_INSTANCE="c1-worker-7-n2"))
    try:
        deadline = time.monotonic() + 30
        while len(marked("c1-worker-7-n1", "SPOTWISE_SLURM_INSTANCE")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        done = subprocess.run([sys.executable, "-m", "spotwise.runtime.node.deadman", "--kill-marked",
                               "SPOTWISE_SLURM_INSTANCE=c1-worker-7-n1"], env=env, timeout=60)
        assert done.returncode == 0                           # marked itself, it did not kill itself
        assert [p.wait(timeout=30) for p in ours] == [-9, -9]
        assert other.poll() is None and marked("c1-worker-7-n1", "SPOTWISE_SLURM_INSTANCE") == []
    finally:
        for p in (*ours, other):
            p.kill()
            p.wait()


def test_kill_marked_needs_name_equals_value():
    done = subprocess.run([sys.executable, "-m", "spotwise.runtime.node.deadman", "--kill-marked", "novalue"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage" in done.stderr


def test_the_launchers_node_dir_travels_in_the_script_not_through_sbatchs_environment():
    # over ssh, sbatch exports the login shell's environment, not the launcher's: the script says it
    script = render(_spec(node_dir="/scratch/sw nodes"))
    assert script.index("export SPOTWISE_SLURM_NODE_DIR='/scratch/sw nodes'") < script.index(
        'export SW_NODE_DIR="${SPOTWISE_SLURM_NODE_DIR:-')
    assert "export SPOTWISE_SLURM_NODE_DIR" not in render(_spec())


def test_the_torch_check_runs_in_the_nodes_install_step_after_the_build_and_is_passed_to_srun():
    script = render(_spec())
    # the cloud GPU nodes' own call (torch_fit.CALL): only where the node lists a GPU
    assert 'flock 9; sw_install; NUM_GPUS="$GPUS"; if [ "${NUM_GPUS:-0}" -gt 0 ]; then spotwise_torch_fit; fi ) ' \
        '9>"$VENV.lock"' in script
    assert script.index("GPUS=$(nvidia-smi") < script.index("flock 9; sw_install")
    assert 'bash -c "$(declare -f sw_node sw_install spotwise_torch_fit); sw_node"' in script


def _stub(path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)


@pytest.mark.parametrize("fits", [True, False])
def test_a_gpu_node_starts_ray_only_with_a_torch_that_uses_its_gpus(tmp_path, fits):
    """The batch script run by bash with stand-ins for Slurm (``srun`` runs its command once,
    ``scontrol`` names the node's address), a node that lists 4 GPUs and whose venv already holds
    the build; its python answers the torch check as a build that uses the GPUs, or as a CUDA 13
    one on a CUDA 12.4 driver with no other build in the (empty, local) PyTorch index."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    _stub(bin_dir / "srun", 'while [ "$1" != bash ]; do shift; done; exec "$@"')
    _stub(bin_dir / "scontrol", 'echo "NodeName=n1 NodeAddr=127.0.0.1 State=IDLE"')
    _stub(bin_dir / "nvidia-smi", 'if [ $# -eq 0 ]; then echo "| Driver Version: 550.54.15   CUDA Version: 12.4 |"; '
                                  'else seq 0 3; fi')
    venv = tmp_path / "nodes" / "n1" / f"venv-{BUILD.build_id}"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)   # a venv the install made
    (venv / "lib" / "python3.11" / "site-packages" / "_spotwise_image.pth").write_text("")
    torch = 'echo "2.13.0+cu124 12.4 4"; exit 0' if fits else 'echo "2.13.0 13.0 0"; exit 3'
    _stub(venv / "bin" / "python",
          f'case "$*" in *"import torch"*) echo "torch check" >>{log}; {torch};; '
          f'*spotwise.build*) exit 0;; -m*) echo "python $*" >>{log}; exit 0;; esac\n'
          f'exec {sys.executable} "$@"')
    (tmp_path / "torch-index").mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURMD_NODENAME": "n1",
           "SLURM_JOB_ID": str(os.getpid()), "SPOTWISE_TORCH_INDEX": (tmp_path / "torch-index").as_uri()}
    script = render(_spec(cluster_id=f"t{os.getpid()}", node_dir=str(tmp_path / "nodes")))
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines()
    node_log = next((tmp_path / "nodes" / "n1" / "log").glob("*.log")).read_text()
    assert calls[0] == "torch check"
    if fits:
        assert "spotwise: torch 2.13.0+cu124 (CUDA 12.4) uses 4 GPU(s) of the 4 nvidia-smi lists" in node_log
        assert any(c.startswith("python -m ray.scripts.scripts start") and "--num-gpus=4" in c for c in calls)
    else:
        assert "spotwise: no torch build uses this node's GPUs: driver CUDA 12.4, torch 2.13.0 (CUDA 13.0)" in node_log
        assert "could not install the shipped build or a torch that uses its GPUs (status 1" in r.stderr
        assert calls == ["torch check"], "neither the watcher nor Ray may start"


def test_every_process_of_the_job_keeps_the_marker_in_its_environment() -> None:
    """Ray's setproctitle would write its titles over ``/proc/PID/environ`` (hiding the marker the
    step's kill finds): the batch script exports ``local_procs.KEEP_MARKER_ENV`` before ``srun``,
    so every node's Ray inherits it."""
    from spotwise.provisioner.clouds.local.procs import KEEP_MARKER_ENV

    text = render(_spec())
    srun = text.index("srun --kill-on-bad-exit")
    for k, v in KEEP_MARKER_ENV.items():
        assert 0 <= text.find(f"export {k}={v}\n") < srun


def test_each_nodes_ray_label_and_watcher_name_the_instance_id_the_orchestrator_knows_it_by(tmp_path):
    """The orchestrator knows a Slurm node as ``JOBID/HOST`` (``launch.nodes_of``) and finds its Ray
    node by that id's label value (``instance_label_value``): the drain events that ask for a
    replacement at the notice (``Fleet.notices``) and the join watch both match on it. The node's
    ``spotwise-instance`` label, and the watcher that drains the node by that label, must be it."""
    from spotwise.provisioner.boot.script import instance_label_value
    from spotwise.runtime.api import INSTANCE_LABEL

    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    _stub(bin_dir / "srun", 'while [ "$1" != bash ]; do shift; done; exec "$@"')
    _stub(bin_dir / "scontrol", 'echo "NodeName=n2 NodeAddr=127.0.0.1 State=IDLE"')
    venv = tmp_path / "nodes" / "n2" / f"venv-{BUILD.build_id}"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)   # a venv the install made
    (venv / "lib" / "python3.11" / "site-packages" / "_spotwise_image.pth").write_text("")
    _stub(venv / "bin" / "python", f'case "$*" in *spotwise.build*) exit 0;; -m*) echo "python $*" >>{log}; exit 0;; '
                                   f'esac\nexec {sys.executable} "$@"')
    job = str(os.getpid())
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURMD_NODENAME": "n2", "SLURM_JOB_ID": job}
    script = render(_spec(cluster_id=f"t{os.getpid()}", node_dir=str(tmp_path / "nodes")))
    subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines()
    label = instance_label_value(f"{job}/n2")          # the orchestrator's Node.instance_id of this node
    ray = next(c for c in calls if c.startswith("python -m ray.scripts.scripts start"))
    assert f"{INSTANCE_LABEL}={label}," in ray + ",", ray
    watch = next(c for c in calls if c.startswith("python -m spotwise.runtime.node.watch"))
    assert f"--instance-id {label} " in watch + " ", watch


@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_notice_ends_the_job_once_trainings_checkpoint_is_committed_else_at_the_kills_deadline(tmp_path, checkpointed):
    """Slurm's USR1 (the notice): the preemptor and the run's replacement queued behind it wait for
    this job's nodes, so the batch script ``scancel``\\ s its own job once a rank marks the notice's
    checkpoint committed (``runtime.api.CHECKPOINTED_FILE_ENV``), at the latest at the deadline
    (slurmctld enforces GraceTime only at its periodic check: 19 s late in a bench run)."""
    from spotwise.provisioner.clouds.slurm.script import YIELD_COMMENT
    from spotwise.runtime.api import CHECKPOINTED_FILE_ENV
    from spotwise.runtime.training.session import mark_checkpointed

    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    _stub(bin_dir / "srun", "exec sleep 30")                               # the step: runs until ended
    _stub(bin_dir / "scancel", f'echo "scancel $* $(date +%s.%N)" >>{log}')
    _stub(bin_dir / "scontrol", f'echo "scontrol $*" >>{log}')
    job, cluster = str(os.getpid()), f"t{os.getpid()}{int(checkpointed)}"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": job}
    state = f"/tmp/sw-{cluster}-{job}"
    script = render(_spec(cluster_id=cluster, grace_s=3.0))
    assert f'export {CHECKPOINTED_FILE_ENV}="$SW_STATE.checkpointed"' in script
    proc = subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True)
    try:
        time.sleep(1.0)                      # the traps are set
        proc.send_signal(15)                 # a TERM alone (scancel, the time limit) is a notice, no yield
        time.sleep(1.0)
        assert os.path.exists(f"{state}.notice") and not log.exists()
        os.remove(f"{state}.notice")
        t0 = time.time()
        proc.send_signal(10)                 # USR1: Slurm's notice
        deadline = time.monotonic() + 10
        while not os.path.exists(f"{state}.notice") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert not log.exists(), "nothing is ended before the checkpoint or the deadline"
        if checkpointed:
            assert mark_checkpointed({CHECKPOINTED_FILE_ENV: f"{state}.checkpointed"}) == f"{state}.checkpointed"
        while not log.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        while "scancel" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        # the job says why it ends before it ends (it then reads PREEMPTED: launch.job_state)
        first, second = log.read_text().splitlines()[:2]
        assert first == f"scontrol update JobId={job} Comment={YIELD_COMMENT}", first
        words = second.split()
        assert words[:2] == ["scancel", job]
        took = float(words[2]) - t0
        assert took < 2.5 if checkpointed else 2.5 <= took < 5, took
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
        for suffix in (".notice", ".checkpointed", ".yielding"):
            if os.path.exists(state + suffix):
                os.remove(state + suffix)


def test_a_cloud_node_asks_for_no_checkpoint_mark():
    from spotwise.runtime.training.session import mark_checkpointed

    assert mark_checkpointed({}) is None


def test_a_job_that_ended_itself_at_its_notice_reads_preempted_and_one_cancelled_otherwise_does_not():
    """Its own ``Comment`` says it yielded to the preemptor (a CI run where the orchestrator never saw
    the notice counted both workers lost: Slurm says CANCELLED)."""
    from spotwise.provisioner.clouds.slurm.launch import job_state, preempted
    from spotwise.provisioner.clouds.slurm.script import YIELD_COMMENT

    line = "JobId=7 JobName=sw UserId=me(1) JobState={} Reason=None Comment={} Partition=p"
    assert preempted(job_state(line.format("CANCELLED", YIELD_COMMENT)))
    assert not preempted(job_state(line.format("CANCELLED", "(null)")))
    assert preempted(job_state(line.format("PREEMPTED", "(null)")))
    assert job_state("JobId=7 Partition=p") == "UNKNOWN"

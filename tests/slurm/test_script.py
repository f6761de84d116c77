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
from spotwise.provisioner.bootstrap import install_script
from spotwise.provisioner.slurm_script import NodeSpec, render
from spotwise.runtime.deadman import marked

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
    assert 'flock 9; sw_install ) 9>"$VENV.lock"' in script and "declare -f sw_node sw_install" in script
    assert '"$PY" -m ray.scripts.scripts start' in script and '"$PY" -m spotwise.runtime.watch' in script
    assert "SW_PY" not in script and "sys.executable" not in script
    # the SIGTERM trap ends the node's processes with the dead man's switch's function, not a copy
    assert '"$PY" -m spotwise.runtime.deadman --kill-marked "SPOTWISE_SLURM_INSTANCE=$IID"' in script
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
        done = subprocess.run([sys.executable, "-m", "spotwise.runtime.deadman", "--kill-marked",
                               "SPOTWISE_SLURM_INSTANCE=c1-worker-7-n1"], env=env, timeout=60)
        assert done.returncode == 0                           # marked itself, it did not kill itself
        assert [p.wait(timeout=30) for p in ours] == [-9, -9]
        assert other.poll() is None and marked("c1-worker-7-n1", "SPOTWISE_SLURM_INSTANCE") == []
    finally:
        for p in (*ours, other):
            p.kill()
            p.wait()


def test_kill_marked_needs_name_equals_value():
    done = subprocess.run([sys.executable, "-m", "spotwise.runtime.deadman", "--kill-marked", "novalue"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage" in done.stderr


def test_the_launchers_node_dir_travels_in_the_script_not_through_sbatchs_environment():
    # over ssh, sbatch exports the login shell's environment, not the launcher's: the script says it
    script = render(_spec(node_dir="/scratch/sw nodes"))
    assert script.index("export SPOTWISE_SLURM_NODE_DIR='/scratch/sw nodes'") < script.index(
        'export SW_NODE_DIR="${SPOTWISE_SLURM_NODE_DIR:-')
    assert "export SPOTWISE_SLURM_NODE_DIR" not in render(_spec())

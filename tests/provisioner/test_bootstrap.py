"""The node boot script: rendered as text, then run twice with stub commands to prove it is
idempotent (Ray and the watcher start once; the env file is identical)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from spotwise.provisioner.bootstrap import BootstrapSpec, ray_labels, render_script


def _spec(**kw) -> BootstrapSpec:
    base = dict(cloud="aws", cluster_id="c1", job_id="job-1", role="head", region="us-east-1",
                zone="us-east-1a", market="spot", instance_type="p4d.24xlarge", accelerator_count=8)
    base.update(kw)
    return BootstrapSpec(**base)


def test_text_head_and_worker():
    head = render_script(_spec())
    assert 'ray" start --head --port=6379' in head and "--num-gpus=8" in head
    assert "spotwise-cloud=aws,spotwise-region=us-east-1,spotwise-zone=us-east-1a,spotwise-market=spot" in head
    assert "spotwise-job=job-1" in head
    assert "-m spotwise.runtime.watch --cloud aws --cluster c1 --job job-1" in head
    worker = render_script(_spec(role="worker", head_address="10.0.0.5:6379"))
    assert "HEAD=10.0.0.5:6379" in worker and 'start --address="$HEAD"' in worker
    for cloud, needle in [("aws", "tags/instance/spotwise-head"), ("gcp", "attributes/spotwise-head"),
                          ("azure", "tagsList")]:
        s = render_script(_spec(cloud=cloud, role="worker"))   # no address: read it from metadata
        assert needle in s and f"--cloud {cloud}" in s
    assert ray_labels(_spec(zone=""))["spotwise-zone"] == "none"
    with pytest.raises(ValueError):
        _spec(role="boss")


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_running_twice_is_safe(tmp_path):
    venv, bin_, state = tmp_path / "venv", tmp_path / "bin", tmp_path / "state"
    (venv / "bin").mkdir(parents=True)
    bin_.mkdir()
    log = tmp_path / "calls.log"
    # the image's venv: python imports fine and runs the watcher (sleeps); ray start marks a raylet
    _stub(venv / "bin" / "python", f'echo "python $*" >>{log}; [ "$1" = "-m" ] && exec sleep 30; exit 0')
    _stub(venv / "bin" / "ray", f'echo "ray $*" >>{log}; touch {tmp_path}/raylet.up')
    _stub(venv / "bin" / "pip", f'echo "pip $*" >>{log}')
    _stub(bin_ / "pgrep", f'[ -f {tmp_path}/raylet.up ]')
    script = tmp_path / "boot.sh"
    script.write_text(render_script(_spec()))
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SPOTWISE_VENV": str(venv),
           "SPOTWISE_STATE_DIR": str(state), "SPOTWISE_ETC_DIR": str(tmp_path / "etc")}
    try:
        for _ in range(2):
            subprocess.run(["bash", str(script)], env=env, check=True, timeout=30)
        calls = log.read_text().splitlines()
        assert sum(c.startswith("ray start") for c in calls) == 1
        assert sum("spotwise.runtime.watch" in c for c in calls) == 1
        assert not any(c.startswith("pip") for c in calls)
        text = (state / "bootstrap.log").read_text()
        assert "ray already running" in text and "watcher already running" in text
        assert "SPOTWISE_CLUSTER=c1" in (tmp_path / "etc" / "node.env").read_text()
    finally:
        pid = (state / "watch.pid").read_text().strip() if (state / "watch.pid").exists() else ""
        if pid:
            subprocess.run(["kill", pid], check=False)

"""The node boot script: rendered as text, then run twice with stub commands against a loopback
IMDSv2 to prove it is idempotent per node (Ray and the watcher start once, tracked by this node's
pidfiles; the env file is identical) and that it asks the metadata service who it is."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from spotwise.provisioner.boot.script import BootstrapSpec, ray_labels, render_script
from spotwise.provisioner.clouds.local.metadata import MetadataServer


def _spec(**kw) -> BootstrapSpec:
    base = dict(cloud="aws", cluster_id="c1", job_id="job-1", role="head", region="us-east-1",
                zone="us-east-1a", market="spot", instance_type="p4d.24xlarge", accelerator_count=8)
    base.update(kw)
    return BootstrapSpec(**base)


def test_text_head_and_worker():
    head = render_script(_spec())
    assert 'ray.scripts.scripts start --head --block' in head and "--port=6379" in head and "--dashboard-port=8265" in head
    assert '--dashboard-host="$NODE_IP"' in head, "the dashboard must listen on the private address only"
    assert "spotwise-cloud=aws,spotwise-region=us-east-1,spotwise-zone=us-east-1a,spotwise-market=spot" in head
    assert "spotwise-job=job-1" in head and "spotwise-instance=$INSTANCE_LABEL_VALUE" in head
    assert ('-m spotwise.runtime.node.watch --cloud aws --metadata-url "$METADATA_URL" --instance-id "$INSTANCE_ID" '
            '--gcs-address "$HEAD"') in head
    assert "pgrep" not in head, "'already running' must be per node, not per machine"
    worker = render_script(_spec(role="worker", head_address="10.0.0.5:6379"))
    assert "HEAD=10.0.0.5:6379" in worker and 'start --address="$HEAD"' in worker
    assert render_script(_spec(ray_port=7000, dashboard_port=9000)).count("--port=7000") == 1
    for cloud, needle in [("aws", "tags/instance/spotwise-head"), ("gcp", "attributes/spotwise-head"),
                          ("azure", "tagsList")]:
        s = render_script(_spec(cloud=cloud, role="worker"))   # no address: read it from metadata
        assert needle in s and f"--cloud {cloud}" in s
    assert ray_labels(_spec(zone=""))["spotwise-zone"] == "none"
    with pytest.raises(ValueError):
        _spec(role="boss")
    with pytest.raises(ValueError):
        _spec(ray_port=0)


def test_a_ray_start_that_fails_is_tried_again_a_bounded_number_of_times(tmp_path):
    """`ray start` fails when its raylet dies at start (Ray's 30 s registration timeout); the
    script tries again (a failed start leaves none of its processes), at most RAY_START_ATTEMPTS
    times, instead of leaving a billed node without Ray until the join timeout."""
    from spotwise.provisioner.boot.script import RAY_START_ATTEMPTS

    state = tmp_path / "state"
    venv, log = _image(tmp_path, ray="exit 1")                              # every start fails
    script = tmp_path / "boot.sh"
    script.write_text(render_script(_spec()).replace("sleep 5", "sleep 0.1"))   # a head: no wait for one
    with MetadataServer() as imds:
        imds.set_instance("i-0abc", local_ipv4="127.16.1.9", tags={})
        env = {**os.environ, "SPOTWISE_VENV": str(venv), "SPOTWISE_STATE_DIR": str(state),
               "SPOTWISE_ETC_DIR": str(tmp_path / "etc"), "SPOTWISE_METADATA_URL": imds.base_url("i-0abc"),
               **_gpus(tmp_path, 8)}
        try:
            subprocess.run(["bash", str(script)], env=env, check=True, timeout=60)
            starts = lambda: sum(c.startswith("ray start") for c in log.read_text().splitlines())  # noqa: E731
            _wait_for(lambda: (state / "ray.log").exists() and f"attempt {RAY_START_ATTEMPTS} of"
                      in (state / "ray.log").read_text(), "the tries did not end")
            assert starts() == RAY_START_ATTEMPTS == 3
            assert "ray start ended with status 1 (attempt 1 of 3)" in (state / "ray.log").read_text()
        finally:
            _kill_started(state)


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


#: the stub image's torch: a CUDA 12.4 build, which uses the GPUs the stub nvidia-smi lists (the
#: GPU node's torch check, spotwise.provisioner.boot.torch_fit, prints "VERSION CUDA GPUS")
TORCH_FITS = 'echo "2.13.0+cu124 12.4 $(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)"; exit 0'


def _image(tmp_path: Path, ray: str = "exec sleep 30", torch: str = TORCH_FITS) -> tuple[Path, Path]:
    """A stub image venv whose python logs its calls: it imports fine, answers the GPU node's torch
    check with ``torch``, runs the watcher (sleeps), and as ``-m ray.scripts.scripts`` logs ``ray
    ARGS`` and runs ``ray`` (default: `ray start --block` stays up)."""
    venv, log = tmp_path / "venv", tmp_path / "calls.log"
    (venv / "bin").mkdir(parents=True)
    _mark_ours(venv)
    _stub(venv / "bin" / "python",
          f'if [ "$1" = "-m" ] && [ "$2" = "ray.scripts.scripts" ]; then shift 2; echo "ray $*" >>{log}; {ray}; fi\n'
          f'if [ "$1" = "-c" ] && [[ "$2" == *"import torch"* ]]; then echo "torch check" >>{log}; {torch}; fi\n'
          f'echo "python $*" >>{log}; [ "$1" = "-m" ] && exec sleep 30; exit 0')
    return venv, log


def _mark_ours(venv: Path) -> None:
    """The mark every venv spotwise's install makes carries (a stub venv stands for one of those; a
    GPU node's torch refit changes only such a venv, never an image's own)."""
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "_spotwise_image.pth").write_text("")


def _gpus(tmp_path: Path, n: int, cuda: str = "12.4") -> dict[str, str]:
    """The node's environment with a stub ``nvidia-smi`` on PATH that lists ``n`` GPUs (and, run
    without arguments, prints its header with the driver's ``CUDA Version``), and a PyTorch wheel
    index that is an empty local directory: nothing reaches download.pytorch.org."""
    d = tmp_path / "gpu-bin"
    d.mkdir(exist_ok=True)
    header = f'echo "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: {cuda}     |"'
    _stub(d / "nvidia-smi", f'if [ $# -eq 0 ]; then {header}; else seq 0 {n - 1}; fi' if n else "exit 9")
    (tmp_path / "no-torch-index").mkdir(exist_ok=True)
    return {"PATH": f"{d}:{os.environ['PATH']}", "SPOTWISE_GPU_WAIT_S": "0",
            "SPOTWISE_TORCH_INDEX": (tmp_path / "no-torch-index").as_uri()}


def _kill_started(state: Path) -> None:
    for f in ("watch.pid", "ray.pid"):
        pid = (state / f).read_text().strip() if (state / f).exists() else ""
        if pid:
            subprocess.run(["kill", pid], check=False)


def _wait_for(pred, what: str, bound_s: float = 30.0) -> None:
    deadline = time.monotonic() + bound_s
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_running_twice_is_safe_and_asks_the_metadata_service(tmp_path):
    state = tmp_path / "state"
    venv, log = _image(tmp_path)
    head = socket.socket()                      # the head's GCS port, listening
    head.bind(("127.16.1.4", 0))
    head.listen()
    addr = f"127.16.1.4:{head.getsockname()[1]}"
    script = tmp_path / "boot.sh"
    script.write_text(render_script(_spec(role="worker", head_address=addr)))
    with head, MetadataServer() as imds:
        imds.set_instance("i-0abc", local_ipv4="127.16.1.9", tags={"spotwise-head": addr})
        env = {**os.environ, "SPOTWISE_VENV": str(venv), "SPOTWISE_STATE_DIR": str(state),
               "SPOTWISE_ETC_DIR": str(tmp_path / "etc"), "SPOTWISE_METADATA_URL": imds.base_url("i-0abc"),
               **_gpus(tmp_path, 8)}
        try:
            for _ in range(2):
                subprocess.run(["bash", str(script)], env=env, check=True, timeout=60)
            for _ in range(50):          # the backgrounded commands log their start
                if log.exists() and len(log.read_text().splitlines()) >= 2:
                    break
                time.sleep(0.1)
            calls = log.read_text().splitlines()
            assert sum(c.startswith("ray start") for c in calls) == 1
            ray = next(c for c in calls if c.startswith("ray start"))
            assert "--node-ip-address=127.16.1.9" in ray and "spotwise-instance=i-0abc" in ray
            assert "--num-gpus=8" in ray         # what nvidia-smi lists, not a guess
            assert f"--address={addr}" in ray
            watch = [c for c in calls if "spotwise.runtime.node.watch" in c]
            assert len(watch) == 1 and "--instance-id i-0abc" in watch[0] and f"--gcs-address {addr}" in watch[0]
            assert not any("pip" in c for c in calls)
            assert calls.count("torch check") == 2               # a GPU node checks its torch at every boot
            text = (state / "bootstrap.log").read_text()
            assert text.count("spotwise: torch 2.13.0+cu124 (CUDA 12.4) uses 8 GPU(s) of the 8 nvidia-smi lists "
                              "(driver CUDA 12.4)") == 2
            assert "ray already running" in text and "watcher already running" in text
            assert "SPOTWISE_CLUSTER=c1" in (tmp_path / "etc" / "node.env").read_text()
        finally:
            _kill_started(state)


def test_a_worker_booted_before_its_head_starts_ray_once_the_head_listens(tmp_path):
    """A cloud boots a launch's nodes at once: a worker whose head's GCS does not listen yet starts
    its watcher (its dead man's switch) now and its Ray only once the head's port answers, instead
    of a `ray start --address` that gives up after ~20 s and leaves a billed node without Ray."""
    state = tmp_path / "state"
    venv, log = _image(tmp_path)
    with socket.socket() as probe:              # a free port nothing listens on yet
        probe.bind(("127.16.1.4", 0))
        port = probe.getsockname()[1]
    addr = f"127.16.1.4:{port}"
    script = tmp_path / "boot.sh"
    script.write_text(render_script(_spec(role="worker", head_address=addr)))
    calls = lambda: log.read_text().splitlines() if log.exists() else []  # noqa: E731
    with MetadataServer() as imds:
        imds.set_instance("i-0abc", local_ipv4="127.16.1.9", tags={})
        env = {**os.environ, "SPOTWISE_VENV": str(venv), "SPOTWISE_STATE_DIR": str(state),
               "SPOTWISE_ETC_DIR": str(tmp_path / "etc"), "SPOTWISE_METADATA_URL": imds.base_url("i-0abc"),
               **_gpus(tmp_path, 8)}
        try:
            subprocess.run(["bash", str(script)], env=env, check=True, timeout=60)   # returns at once
            _wait_for(lambda: any("spotwise.runtime.node.watch" in c for c in calls()), "the watcher never started")
            _wait_for(lambda: "waiting for the head's GCS" in (state / "ray.log").read_text(),
                      "the worker did not wait for its head")
            assert not any(c.startswith("ray start") for c in calls()), "Ray started before its head listened"
            with socket.socket() as head:       # the head comes up
                head.bind(("127.16.1.4", port))
                head.listen()
                _wait_for(lambda: any(c.startswith("ray start") for c in calls()), "Ray never started")
            ray = next(c for c in calls() if c.startswith("ray start"))
            assert f"--address={addr}" in ray
            # the pidfile names the live supervisor of this node's Ray: a second boot leaves it be
            subprocess.run(["bash", str(script)], env=env, check=True, timeout=60)
            assert "ray already running" in (state / "bootstrap.log").read_text()
            assert sum(c.startswith("ray start") for c in calls()) == 1
        finally:
            _kill_started(state)


def test_a_gpu_node_whose_torch_uses_no_gpu_and_finds_no_build_that_does_ends_its_boot_before_ray(tmp_path):
    """PyPI's CUDA 13 torch on a CUDA 12.4 driver, and no CUDA 12 build of it in the PyTorch index
    (here an empty one): the boot ends with one line, and neither Ray nor the watcher start — the
    node must not train on its CPU at GPU prices (spotwise.provisioner.boot.torch_fit)."""
    state = tmp_path / "state"
    venv, log = _image(tmp_path, torch='echo "2.13.0 13.0 0"; exit 3')
    script = tmp_path / "boot.sh"
    script.write_text(render_script(_spec()))
    with MetadataServer() as imds:
        imds.set_instance("i-0abc", local_ipv4="127.16.1.9", tags={})
        env = {**os.environ, "SPOTWISE_VENV": str(venv), "SPOTWISE_STATE_DIR": str(state),
               "SPOTWISE_ETC_DIR": str(tmp_path / "etc"), "SPOTWISE_METADATA_URL": imds.base_url("i-0abc"),
               **_gpus(tmp_path, 8)}
        try:
            r = subprocess.run(["bash", str(script)], env=env, timeout=60)
            assert r.returncode == 1
            text = (state / "bootstrap.log").read_text()
            assert ("spotwise: no torch build uses this node's GPUs: driver CUDA 12.4, torch 2.13.0 (CUDA 13.0) uses "
                    "none; tried from file://") in text
            assert "cu124 (not listed) cu121 (not listed) cu126 (not listed)" in text
            calls = log.read_text().splitlines()
            assert not any(c.startswith("ray") or "spotwise.runtime.node.watch" in c for c in calls), calls
            assert not (state / "ray.pid").exists() and not (state / "watch.pid").exists()
        finally:
            _kill_started(state)


def test_the_torch_check_runs_after_the_gpu_wait_on_gpu_nodes_only():
    gpu = render_script(_spec())
    assert gpu.index("GPU(s) visible") < gpu.index("spotwise_torch_fit; fi") < gpu.index("# 4. Ray")
    assert "spotwise_torch_fit" not in render_script(_spec(accelerator_count=0, instance_type="m5.large"))


def test_a_gpu_workers_script_fits_aws_user_data_limit():
    """EC2 takes at most 16 KB of user data (before base64): the GPU node's script, torch step and
    a long presigned URL (a session token makes it ~2 KB) included, stays well under it."""
    from spotwise.build import BootBuild

    url = "https://b.s3.amazonaws.com/_builds/" + "a" * 64 + "/w.whl?" + "X" * 2500
    build = BootBuild(build_id="0123456789abcdef", sha256="ab" * 32, url=url,
                      name="spotwise-0.1.0+b0123456789abcdef-py3-none-any.whl")
    script = render_script(_spec(role="worker", build=build, cluster_id="c" * 40, job_id="j" * 40))
    assert "spotwise_torch_fit" in script and len(script.encode()) < 15 * 1024


def _boot_gpu_node(tmp_path: Path, env_extra: dict[str, str], *, wait_ray: bool = False,
                   **spec) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """Boot a head of ``spec`` against a loopback IMDS with the stub image; its result, state dir
    and the stub's call log (``wait_ray``: once Ray's start is logged; Ray and the watcher are
    ended afterwards)."""
    state = tmp_path / "state"
    venv, log = _image(tmp_path)
    script = tmp_path / "boot.sh"
    script.write_text(render_script(_spec(**spec)))
    with MetadataServer() as imds:
        imds.set_instance("i-0abc", local_ipv4="127.16.1.9", tags={})
        env = {**os.environ, "SPOTWISE_VENV": str(venv), "SPOTWISE_STATE_DIR": str(state),
               "SPOTWISE_ETC_DIR": str(tmp_path / "etc"), "SPOTWISE_METADATA_URL": imds.base_url("i-0abc"),
               **env_extra}
        try:
            r = subprocess.run(["bash", str(script)], env=env, timeout=60)
            if wait_ray:
                _wait_for(lambda: log.exists() and any(c.startswith("ray start") for c in log.read_text().splitlines()),
                          "Ray never started")
        finally:
            _kill_started(state)
    return r, state, log


def test_a_gpu_node_whose_driver_shows_no_gpu_ends_its_boot_before_ray(tmp_path):
    """The driver never came up (nvidia-smi fails through the whole wait): one line in the boot log
    and exit 1, no Ray, no watcher — the node never joins with `--num-gpus=0` to train on its CPU at
    GPU prices; the orchestrator's join watchdog ends it (issue 48, item 6)."""
    r, state, log = _boot_gpu_node(tmp_path, _gpus(tmp_path, 0))
    assert r.returncode == 1
    lines = [ln for ln in (state / "bootstrap.log").read_text().splitlines() if "no GPU" in ln]
    assert lines == ["spotwise: no GPU visible after 0 s of waiting for the driver (8 expected for p4d.24xlarge): "
                     "a GPU node does not start Ray without its GPUs"]
    calls = log.read_text().splitlines() if log.exists() else []
    assert not any(c.startswith("ray") or "spotwise.runtime.node.watch" in c for c in calls), calls
    assert not (state / "ray.pid").exists() and not (state / "watch.pid").exists()


def test_an_emulators_cpu_stand_in_for_a_gpu_node_starts_ray_without_gpus(tmp_path):
    """The emulators run GPU instance types on CPU machines: they say so (SPOTWISE_CPU_STANDIN,
    never set on a cloud's node) and the node starts Ray with no GPU instead of failing."""
    r, state, log = _boot_gpu_node(tmp_path, {**_gpus(tmp_path, 0), "SPOTWISE_CPU_STANDIN": "1"}, wait_ray=True)
    assert r.returncode == 0
    assert "--num-gpus=0" in next(c for c in log.read_text().splitlines() if c.startswith("ray start"))
    assert "a CPU stand-in for a GPU node" in (state / "bootstrap.log").read_text()


KEY = 'restrict,port-forwarding,command="/bin/true" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake spotwise-c1'


def test_a_head_authorizes_the_launchers_cluster_key_once(tmp_path):
    """Step 0 of a head reached over ssh: the key line lands in the authorized keys, once however
    often the script runs; a script without a key, and a worker, authorize nothing."""
    from spotwise.provisioner.boot.script import ssh_block

    head = render_script(_spec(ssh_authorized_key=KEY))
    block = ssh_block(_spec(ssh_authorized_key=KEY))
    assert block and block in head and "useradd" in block
    keys = tmp_path / "authorized_keys"
    env = {**os.environ, "SPOTWISE_AUTHORIZED_KEYS": str(keys)}
    for _ in range(2):
        subprocess.run(["bash", "-euo", "pipefail", "-c", block], env=env, check=True)
    assert keys.read_text() == KEY + "\n"
    assert "AUTH_KEYS" not in render_script(_spec())
    for bad in (dict(role="worker", head_address="10.0.0.5:6379"), {}):
        with pytest.raises(ValueError, match="ssh_authorized_key"):
            _spec(ssh_authorized_key=KEY if bad else KEY + "\nrm -rf /", **bad)

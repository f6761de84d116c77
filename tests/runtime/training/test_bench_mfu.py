"""bench/bench_mfu.py keeps working on a CPU (debug flavor), and reads a GPU's peak by its name."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).parents[3] / "bench" / "bench_mfu.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_mfu", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name, gpu", [("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 NVL", "H100-NVL"),
                                       ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA H200", "H200")])
def test_gpu_peak_is_matched_by_name(monkeypatch, name, gpu):
    from spotwise.pricing.estimate import gpu_peaks

    bench = load_bench()
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert bench.peak_tflops(torch.device("cuda", 0)) == (gpu_peaks()[gpu][0], gpu)
    assert bench.peak_tflops(torch.device("cpu")) == (None, "cpu")


@pytest.mark.slow
def test_bench_runs_on_cpu_at_debug_size():
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, str(BENCH), "--steps", "2", "--repeats", "1"], capture_output=True,
                       text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "flavor=debug" in p.stdout and "tokens/s" in p.stdout and "ratio on/off" in p.stdout

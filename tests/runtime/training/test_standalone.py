"""The Ray-free entry point, single process and under torchrun; resharding 8 -> 4 -> 8 ranks (the
eight GPUs of a rented node, half of them lost, then back: issue 49 item 1)."""

import json
import os
import subprocess
import sys

import pytest

from ..fakes import free_port

ARGS = ["--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--seq-len", "16", "--batch-size", "8",
        "--checkpoint-interval", "2"]


def run(storage, steps, world):
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    if world == 1:
        cmd = [sys.executable, "-m", "spotwise.runtime.training.standalone"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "spotwise.runtime.training.standalone"]
    p = subprocess.run(cmd + ["--storage", storage, "--run-name", "el", "--steps", str(steps), *ARGS],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads([line for line in p.stdout.splitlines() if line.startswith("{")][-1])


@pytest.mark.slow
def test_reshard_8_to_4_to_8_is_lossless(tmp_path):
    st = f"file://{tmp_path}"
    a = run(st, 4, 8)                      # 8 ranks train to step 4
    a1 = run(st, 4, 4)                     # 4 ranks load step 4: nothing left to train
    assert a1["resumed_from"] == 4 and a1["model_sha256"] == a["model_sha256"]
    b = run(st, 6, 4)                      # 4 ranks continue to 6
    assert b["resumed_from"] == 4 and b["steps_completed"] == 6
    b2 = run(st, 6, 8)                     # 8 ranks load the 4-rank checkpoint exactly
    assert b2["resumed_from"] == 6 and b2["model_sha256"] == b["model_sha256"]


def test_bad_argument_is_a_clear_message(tmp_path):
    p = subprocess.run([sys.executable, "-m", "spotwise.runtime.training.standalone", "--storage", f"file://{tmp_path}",
                        "--run-name", "x", "--keep-last", "1"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "keep_last must be >= 2" in p.stderr and "Traceback" not in p.stderr


def test_a_rank_ends_with_its_code_and_its_buffered_output_without_finalizing():
    """end_process: what a rank printed into a pipe (block-buffered) arrives, the exit code is
    the one given, and the interpreter's finalization (where gloo's worker thread can abort the
    process) does not run: an atexit hook never fires."""
    code = ("import atexit, sys\n"
            "from spotwise.runtime.training.standalone import end_process\n"
            "atexit.register(lambda: print('finalized'))\n"
            "print('{\"rank\": 0}'); sys.stderr.write('said\\n')\n"
            "end_process(3)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stdout, p.stderr) == (3, '{"rank": 0}\n', "said\n")

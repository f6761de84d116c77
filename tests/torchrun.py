"""Run a program on N local ranks under torchrun and read the JSON line it prints: how the tests
make the Ray-free references their runs must reproduce bitwise, and run their other multi-rank
checks (the Llama's two ranks, the gradient-memory ranks), all with gloo on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def run_json(target: list[str], nproc: int, *, env: dict[str, str] | None = None, timeout: float = 600) -> dict:
    """``torchrun --nproc-per-node nproc TARGET`` (``["-m", module, *args]`` or ``[script, *args]``)
    on 127.0.0.1 with a free port, this process's environment plus ``env`` less any rank variables
    it inherited; the last ``{...}`` line of its stdout, parsed. A non-zero exit fails the test with
    the end of its stderr."""
    from spotwise.utils.net import free_port

    run_env = {k: v for k, v in {**os.environ, **(env or {})}.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    run_env["GLOO_SOCKET_IFNAME"] = "lo"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *target],
                       capture_output=True, text=True, env=run_env, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])

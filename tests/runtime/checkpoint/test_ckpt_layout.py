"""The launcher's reads of a run's checkpoints never import torch (:mod:`spotwise.runtime.checkpoint.layout`).

Importing torch cost the launcher about 4 CPU-seconds per run (it chose where to resume through
``runtime.checkpoint``), and a node's watcher imported it to name the newest checkpoint. Here a fresh
interpreter does what the launcher, ``spotwise logs`` and the watcher do with a run's store (find
the newest committed checkpoint in two stores, copy it to the other cloud's, read it back), and
torch must still not be loaded at the end."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, sys
from pathlib import Path
import spotwise.cli, spotwise.commands.run.launch, spotwise.engine.run.orchestrator, spotwise.engine.run.joblogs
import spotwise.engine.work.resume, spotwise.runtime.node.watch
from spotwise.engine.run.run_stores import RunStores
from spotwise.runtime.checkpoint.layout import COMMIT_MARKER, latest_committed, run_storage, step_dir

a, b = sys.argv[1], sys.argv[2]
src = run_storage(a, "job-1")
for step in (3, 6):
    src.put_bytes(f"{step_dir(step)}/shard-0", b"x" * 10)
    src.put_bytes(f"{step_dir(step)}/{COMMIT_MARKER}", json.dumps({"kind": "interval", "world_size": 2}).encode())
src.put_bytes(f"{step_dir(9)}/shard-0", b"torn")          # no marker: never the newest
stores = RunStores({"aws": a, "gcp": b})
moved = stores.bring("job-1", "gcp", keep_last=2)
got = latest_committed(run_storage(b, "job-1"))
print(json.dumps({"torch": "torch" in sys.modules, "from": moved[0], "step": got.step, "kind": got.kind,
                  "world_size": got.world_size}))
"""


def test_the_launchers_checkpoint_reads_and_copy_do_not_import_torch(tmp_path):
    a, b = f"file://{tmp_path / 'aws'}", f"file://{tmp_path / 'gcp'}"
    r = subprocess.run([sys.executable, "-c", SCRIPT, a, b], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"torch": False, "from": a, "step": 6, "kind": "interval", "world_size": 2}

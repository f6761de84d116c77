"""A user's own package as the end-to-end runs ship it (issue 31): ``examples/own-code`` copied to a
temporary directory (so only the task's ``workdir`` holds it), and the uninterrupted, Ray-free
reference run a preempted Ray run of it must reproduce bit for bit."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from torchrun import run_json

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "own-code"
#: the example task's ``training.config``
CONFIG: dict[str, Any] = yaml.safe_load((EXAMPLE_DIR / "task.yaml").read_text())["training"]["config"]

# The example's make_spec, STEP_SLEEP_S slower a batch (the weights are the same; user_task sets
# it, 20 ms by default): a notice posted after the first committed checkpoint then lands mid-run on
# any machine, however fast or loaded, and the run outlasts the notices it is given. Each
# rank prints a line every PRINT_EVERY steps (what ``spotwise logs`` must show, tagged by rank).
PRINT_EVERY = 50
_SLOW_SPEC = f"""
import time

from regress.train import make_spec as _make_spec


def make_spec(config):
    spec = _make_spec(config)
    batch = spec.batch_fn
    tokens = None
    if config.get("on_tokens"):        # the task's training.data, its windows added to the features
        from spotwise.train import token_batches

        tokens = token_batches(seq_len=int(config.get("features", 8)), batch_size=int(config.get("batch", 32)),
                               vocab_size=256)

    def slow_batch(step, rank, world):
        if step % {PRINT_EVERY} == 0:
            print(f"regress: rank {{rank}} of {{world}} at step {{step}}", flush=True)
        time.sleep(STEP_SLEEP_S)
        x, y = batch(step, rank, world)
        if tokens is not None:
            x = x + tokens(step, rank, world)[0].to(x.dtype) / 256
        return x, y

    spec.batch_fn = slow_batch
    return spec
"""

# the reference: the task's training, each rank in a torchrun process (cwd: the workdir)
_REFERENCE = """
import json, os, sys
import torch.distributed as dist
from spotwise.runtime.checkpoint.checkpointer import run_storage
from spotwise.runtime.training.loop import LocalSession, run_loop
from spotwise.runtime.training.standalone import end_process
from spotwise.runtime.training.usercode import spec_for
from spotwise.taskspec import load_taskspec

spec = load_taskspec(sys.argv[1])
sys.path.insert(0, spec.workdir)          # as Ray's working_dir puts it on a node's path
os.environ.update(spec.env or {})
dist.init_process_group("gloo")
res = run_loop(spec_for(spec.training), LocalSession(), run_storage(sys.argv[2], "reference"))
dist.destroy_process_group()
if os.environ["RANK"] == "0":
    print(json.dumps({"steps": res.steps_completed, "model_sha256": res.model_sha256}))
end_process(0)
"""


def user_task(tmp_path: Path, *, steps: int, interval: int, step_sleep_s: float = 0.02, **over: Any) -> Path:
    """The example copied to ``tmp_path/code`` (not importable from here) with its ``make_spec``
    slowed by ``step_sleep_s`` a batch (:data:`_SLOW_SPEC`), a module-level check that the task's
    ``env`` reached the process that imports it, ``steps`` and the checkpoint ``interval``; ``over``
    replaces top-level keys (a dict value updates that section instead)."""
    code = tmp_path / "code"
    shutil.copytree(EXAMPLE_DIR, code, ignore=shutil.ignore_patterns("__pycache__"))
    train = code / "regress" / "train.py"
    train.write_text(train.read_text() + "\n\nimport os\n\nif os.environ.get('REGRESS_NOTE') != 'set on every node':\n"
                     "    raise RuntimeError('the task env did not reach this process')\n")
    (code / "slowspec.py").write_text(_SLOW_SPEC.replace("STEP_SLEEP_S", repr(float(step_sleep_s))))
    spec = yaml.safe_load((code / "task.yaml").read_text())
    spec["training"]["entrypoint"] = "slowspec:make_spec"
    spec["training"]["steps"] = steps
    spec["training"]["checkpoint"]["interval_steps"] = interval
    for k, v in over.items():
        if isinstance(v, dict):
            spec.setdefault(k, {}).update(v)
        elif v is None:
            spec.pop(k, None)
        else:
            spec[k] = v
    (code / "task.yaml").write_text(yaml.safe_dump(spec))
    return code / "task.yaml"


def reference(task: Path, storage: Path, env: dict[str, str] | None = None) -> dict:
    """``task``'s training without Ray and without interruption: ``{"steps", "model_sha256"}``
    (``env``: what the ranks need beyond this process's environment, e.g. an S3 endpoint)."""
    nodes = yaml.safe_load(task.read_text())["resources"]["nodes"]
    storage.parent.mkdir(parents=True, exist_ok=True)
    script = storage.parent / "reference.py"
    script.write_text(_REFERENCE)
    return run_json([str(script), str(task), f"file://{storage}"], nodes,
                    env={**(env or {}), "SPOTWISE_HOME": str(storage.parent)})

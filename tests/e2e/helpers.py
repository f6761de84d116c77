"""What the emulated-cloud end-to-end tests share: a task file for a cloud, ``spotwise launch``
(a real run, or ``--dry-run`` for the plan) against an emulator, and the job's ledger rows.

An emulator is any of ``tests/emulator``'s clouds: it gives the launch process its environment
(:meth:`env`). Each run's state lives in ``tmp_path/home`` (recorded in the report as ``_home``).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import yaml

from waiting import wait_for  # noqa: F401  (the e2e tests' import of it)

ROOT = Path(__file__).resolve().parents[2]
README_JOB = ROOT / "examples" / "tiny-gpt.yaml"
# What every end-to-end run trains: the README's main job with a smaller model and a batch of 16 (same steps,
# checkpoints, budget and preemption schedule), so the runs' time goes to the path under test.
EXAMPLE = Path(__file__).resolve().with_name("task.yaml")


def cloud_task(tmp_path: Path, clouds: list[str], regions: list[str], **over: Any) -> Path:
    """``tmp_path/task.yaml``: the example job on 8 x A100 spot in ``clouds``/``regions``; ``over``
    replaces top-level keys (a dict value updates that section instead)."""
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["resources"].update({"accelerators": "A100:8", "clouds": clouds, "regions": regions, "market": "spot"})
    spec.pop("local", None)
    for k, v in over.items():
        if isinstance(v, dict):
            spec.setdefault(k, {}).update(v)
        else:
            spec[k] = v
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def launch_env(emu: Any, tmp_path: Path) -> dict:
    return dict(os.environ, **emu.env(), SPOTWISE_HOME=str(tmp_path / "home"))


def run(emu: Any, tmp_path: Path, task: Path, *args: str, during: Callable[[Any], None] | None = None) -> dict:
    """``spotwise launch`` against ``emu``; ``during(emu)`` is called every 0.5 s while it runs."""
    return run_cli(emu, tmp_path, ["launch", str(task), *args], during=during)


def run_cli(emu: Any, tmp_path: Path, argv: list[str], *, during: Callable[[Any], None] | None = None,
            env: dict | None = None) -> dict:
    """``spotwise ARGV --format json`` (a run: ``launch``, ``resume``) against ``emu``, with
    ``env`` (default :func:`launch_env`); ``during(emu)`` is called every 0.5 s while it runs. Its
    JSON report, with ``_home`` added."""
    with open(tmp_path / "launch.err", "w") as err:
        p = subprocess.Popen([sys.executable, "-m", "spotwise.cli", *argv, "--format", "json"],
                             env=env or launch_env(emu, tmp_path), stdout=subprocess.PIPE, stderr=err, text=True)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(stdout=p.communicate(timeout=900)[0]), daemon=True)
    t.start()
    while t.is_alive():
        if during is not None:
            during(emu)
        t.join(0.5)
    assert out.get("stdout", "").strip(), (tmp_path / "launch.err").read_text()[-4000:]
    report = json.loads(out["stdout"])
    report["_home"] = str(tmp_path / "home")
    return report


def plan(emu: Any, tmp_path: Path, task: Path, storage: str = "s3://ckpt/runs") -> dict:
    """The ``--dry-run`` plan (checkpoints on ``storage``)."""
    r = subprocess.run([sys.executable, "-m", "spotwise.cli", "launch", str(task), "--dry-run", "--format", "json",
                        "--storage", storage], capture_output=True, text=True, env=launch_env(emu, tmp_path),
                       check=True)
    return json.loads(r.stdout)


def ledger(report: dict, place: str = "zone") -> tuple[list[tuple], list[tuple]]:
    """The job's instance rows ``(instance_id, role, market, <place>, usd_per_hour, price_source)`` and
    every ledger row ``(instance_id, seconds, usd_per_hour, usd)`` from the run's database — the
    instances' and what they carried (``<instance id>/disk``, ``/ipv4``: :mod:`spotwise.pricing.attached`)."""
    assert place in ("zone", "region")
    db = sqlite3.connect(Path(report["_home"]) / "spotwise.db")
    try:
        nodes = db.execute(f"select instance_id, role, market, {place}, usd_per_hour, price_source from nodes "
                           "where job_id = ? and market in ('spot', 'on-demand')", (report["job_id"],)).fetchall()
        entries = db.execute("select instance_id, seconds, usd_per_hour, usd from ledger where job_id = ?",
                             (report["job_id"],)).fetchall()
    finally:
        db.close()
    return nodes, entries


def checkpoint_committed(s3: Any, bucket: str, prefix: str = "runs/") -> bool:
    """Whether a checkpoint under ``prefix`` of ``bucket`` is committed (its ``COMMITTED`` marker exists)."""
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    return any(k.endswith("/COMMITTED") for k in keys)


def assert_every_node_installed_the_launchers_build(emu: Any, nodes: set[str] | None = None) -> None:
    """Every node (of ``nodes``, default all that booted) installed the shipped wheel, all the same
    one, of the launcher's build id (the test process runs the same checkout as its launcher)."""
    from spotwise.build import build_id

    want = set(emu.scripts) if nodes is None else nodes
    got = {k: v for k, v in emu.nodes_from_wheel().items() if k in want}
    assert set(got) == want, f"nodes without the shipped build: {sorted(want - set(got))}"
    assert {b for b, _ in got.values()} == {build_id()} and len({s for _, s in got.values()}) == 1, got


def job_row(home: Path) -> dict:
    """The one job row of ``home``'s SQLite database (the CLI's own), with its spend, its nodes not yet
    terminated (``open_nodes``) and the end of its ledger (``ledger_end``)."""
    from sqlalchemy import create_engine, text

    eng = create_engine(f"sqlite:///{home / 'spotwise.db'}")
    try:
        with eng.connect() as c:
            rows = [dict(r._mapping) for r in c.execute(text("SELECT * FROM jobs"))]
            assert len(rows) == 1, rows
            job = rows[0]
            job["spend"] = float(c.execute(text("SELECT coalesce(sum(usd), 0) FROM ledger WHERE job_id = :j"),
                                           {"j": job["id"]}).scalar())
            job["open_nodes"] = int(c.execute(text("SELECT count(*) FROM nodes WHERE job_id = :j AND "
                                                   "terminated_at IS NULL"), {"j": job["id"]}).scalar())
            job["ledger_end"] = c.execute(text("SELECT max(\"end\") FROM ledger WHERE job_id = :j"),
                                          {"j": job["id"]}).scalar()
            return job
    finally:
        eng.dispose()

"""The main job on an emulated cloud vs the same job on the local cloud, in one run.

    .venv/bin/python bench/bench_launch_clouds.py --cloud aws|gcp|azure [--format json]
    .venv/bin/python bench/bench_launch_clouds.py --cloud aws,gcp --exhaust aws [--format json]

Scenario (what CI's end-to-end tests prove, timed here): the tiny GPT task, a head and 2 spot
workers; the plan's first zone answers the cloud's capacity error (AWS
InsufficientInstanceCapacity, GCP ZONE_RESOURCE_POOL_EXHAUSTED: failover) and one spot worker is
preempted the way that cloud does it once the first checkpoint is committed (AWS: notice on
``spot/instance-action``; GCP: ``instance/preempted`` turns TRUE; the instance is ended after the
notice window); checkpoints on S3 (moto). Baseline: the same task on the local cloud, in the same
run, **with the same preemption** (issue 51: like with like): one spot worker noticed
``--preempt-at`` seconds (default 10) after training's first step, with a ``--notice-seconds``
window (default 12), on both — the local cloud through its own ``--preempt-at``/``--notice-seconds``,
the emulated AWS and GCP the way that cloud does it at the same time after their own first step (read
from the run's curves). ``wall_ratio`` is then the cloud path's own overhead, not the preemption's
price. Azure (its ``Preempt`` event's 30 s ``NotBefore``) keeps its own notice and its own trigger
(after the first committed checkpoint). Slurm: the priority job is submitted ``--preempt-at`` s after
the run's first step and takes both nodes of the run's one job, with the partition's GraceTime (20 s)
as the notice; its local baseline gets that schedule: both spot workers noticed together
(``--preempt-at T,T``) with ``--notice-seconds`` 20.

``notice_to_training_s`` (and ``local_notice_to_training_s``): per run, seconds from the notice (the
bench's own clock when it injected it; on the local cloud its ``spot_notice`` event) to the first
curve sample past the just-in-time checkpoint's step — training going again after the resume
(within one curve sample, :mod:`spotwise.engine.run.curves`).

Prints ``{"cloud", "cloud_used", "status", "preemptions", "resumes", "lost_steps", "weights_equal",
"bootstrap_script_matches", "spend_usd", "budget_usd", "leaked", "capacity_errors", "wall_s",
"local_wall_s", "wall_ratio", "list_calls", "list_calls_per_min", "nodes_launched", "nodes_from_wheel",
"node_poll_s"}``.
Goal: emulated-cloud wall <= 1.5x local, wheel install included (nodes boot from a stock image and
install the build the launch shipped; ``nodes_from_wheel`` must equal ``nodes_launched``).

``list_calls`` / ``list_calls_per_min``: per emulated cloud, the list/describe calls spotwise made
during the launch (AWS: every ``Describe*`` the strict EC2 counted, :mod:`emulator.ec2_strict`;
GCP and Azure: every GET their fakes answered — listings, gets and operation polls), and that over
the launch's wall minutes, at the node listing period a user gets unless ``--node-poll-s`` says
otherwise (the emulators' own 2 s makes their e2e runs notice a gone node sooner; it is not what a
real account sees). Issue 30 wants at most 12 a minute per cloud; the fast test that holds
the ceiling over 5 simulated minutes with no region configured is
``tests/provisioner/test_polite_api.py``.

Azure (``--cloud azure``, :func:`run_azure`): the ARM fake + instance emulator of
``tests/emulator/azure.py``; prices refreshed from the emulated Retail Prices API first (two spot
regions, as ``spotwise catalog refresh`` would), the plan's first region answers
``SkuNotAvailable`` for the Spot size, and one spot worker is evicted through a ``Preempt``
scheduled event (NotBefore 30 s ahead; evicted when the watcher acknowledges it after the
just-in-time checkpoint). Same JSON plus ``"preempt_acknowledged"``, ``"eviction"``;
``notice_to_training_s`` from the ``Preempt`` event's posting (its window is Azure's own 30 s).

Slurm (``--cloud slurm``, :func:`run_slurm`): the real two-node Slurm of ``tests/slurm_cluster.py``
(root and Debian's Slurm packages needed: ``scripts/install.sh --test``), configured as a site
whose nodes' base Python is the emulators' stock image (torch and Ray, no spotwise); the task on
2 nodes of its preemptible partition, preempted ``--preempt-at`` s after its first step by a job of
the priority partition (``sleep 2`` on both nodes); checkpoints in a ``file://`` store. Same JSON, plus
``notice_to_training_s`` (from the bench's submission of the priority job: Slurm's own decision to
signal, about 0.3–1.5 s, is in it), ``notice_to_resume_s`` and ``local_notice_to_resume_s`` (the same
to the resume itself, :func:`notice_to_resume_s`: without the curve's 10 s granularity), ``notice_s`` (the GraceTime), ``timeline_s`` (seconds from that
submission to the first ``node_notice``, ``replaced`` (asked at), ``launched``, ``notice_restart``
and ``preempted`` events of the run: :func:`slurm_timeline`), ``first_step_s`` and
``local_first_step_s`` (launch to training's first step, from the run's curves: within one curve
sample), ``node_installs`` (nodes that installed the shipped wheel into their venv) and
``nodes_launched`` / ``nodes_from_wheel`` counted per node of each Slurm job (a job on a node whose
venv already holds the build skips the install; the venvs are new each bench run, so every one
came from this run's wheel). ``bootstrap_script_matches`` is null: Slurm has no boot script of its own.

Cross-cloud failover (``--cloud aws,gcp --exhaust aws``): both emulated clouds run; the task
allows both (us-east-1, us-central1); the plan ranks AWS first, and every AWS offer — the head's
on-demand type too — answers InsufficientInstanceCapacity, so the same launch lands on GCP, where
the scenario above (zone capacity error, preemption) plays out. ``"cloud_used"`` says where it ran.
Each cloud has its own checkpoint store, reached by its nodes with their own identity
(``--storage aws=s3://ckpt/runs --storage gcp=gs://ckpt/runs``; ``"stores"`` in the JSON), so
the run's checkpoints are in the store of the cloud it landed on.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BATCH = 16    # examples/tiny-gpt.yaml's 8 does not divide the 16 ranks of A100:8 x 2 (the plan refuses it)
sys.path.insert(0, str(ROOT / "tests"))


def reads(cloud: str, emu, work: Path) -> int:
    """List/describe calls spotwise made so far on emulated ``cloud`` (the module docstring)."""
    if cloud == "aws":
        path = work / "ec2_calls.jsonl"
        return sum(1 for line in path.read_text().splitlines() if '"action": "Describe' in line) if path.exists() else 0
    return sum(r["method"] == "GET" for r in emu.fake.requests)


def read_rates(counts: dict[str, tuple[int, int]], wall: float) -> dict:
    """``{"list_calls": {cloud: n}, "list_calls_per_min": {cloud: n / minutes}}`` from (before, after) counts."""
    n = {c: after - before for c, (before, after) in counts.items()}
    return {"list_calls": n, "list_calls_per_min": {c: round(v / (wall / 60), 1) for c, v in n.items()}}


def launch(task: Path, home: Path, env: dict, *args: str, during=None) -> tuple[float, dict]:
    env = dict(env, SPOTWISE_HOME=str(home))
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "spotwise.cli", "launch", str(task), "--format", "json", *args],
                         env=env, stdout=subprocess.PIPE, stderr=open(home.parent / f"{home.name}.err", "w"), text=True)
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(out=p.communicate(timeout=1800)[0]), daemon=True)
    t.start()
    while t.is_alive():
        if during is not None:
            during()
        t.join(0.5)
    wall = time.perf_counter() - t0
    if not box.get("out", "").strip():
        sys.exit(f"launch failed; see {home.parent / (home.name + '.err')}")
    return wall, json.loads(box["out"])


def first_step_t(home: Path) -> float | None:
    """When the run in ``home`` (its only job) first reported a step, from its curves' table (read
    directly: the launch is still running)."""
    import sqlite3

    db = home / "spotwise.db"
    if not db.exists():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as c:
            row = c.execute("SELECT min(t) FROM curve_points WHERE step IS NOT NULL").fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row and row[0] is not None else None


def notice_to_training_s(home: Path, rep: dict, notice_t: float | None) -> float | None:
    """Seconds from ``notice_t`` to the first curve sample past the step of the run's just-in-time
    checkpoint (kind ``preemption``): training going again after the resume (module docstring)."""
    jit = [c["step"] for c in rep.get("checkpoints", []) if c["kind"] == "preemption"]
    if notice_t is None or not jit:
        return None
    code = ("import json, sys; from spotwise.engine.run.curves import curves; "
            "print(json.dumps([[p['t'], p['step']] for p in curves(sys.argv[1])['points'] if p['step']]))")
    out = subprocess.run([sys.executable, "-c", code, rep["job_id"]], env=dict(os.environ, SPOTWISE_HOME=str(home)),
                         capture_output=True, text=True)
    pts = json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else []
    after = [t for t, step in pts if t > notice_t and step > min(jit)]
    return round(min(after) - notice_t, 1) if after else None


def notice_to_resume_s(rep: dict, notice_t: float | None) -> float | None:
    """Seconds from ``notice_t`` to the first resume after it (the report's ``resume_points``: rank 0
    restored the checkpoint; the first step follows within one step): what ``notice_to_training_s``
    measures, without its curve sample's granularity (:data:`spotwise.engine.run.curves.EVERY_S`, 10 s)."""
    ts = [p["t"] for p in rep.get("resume_points") or [] if notice_t is not None and p.get("t", 0) > notice_t]
    return round(min(ts) - notice_t, 1) if ts else None


def local_notice_t(rep: dict) -> float | None:
    """The local cloud's notice: its first ``spot_notice`` event."""
    return next((e["t"] for e in rep.get("events", []) if e["event"] == "spot_notice"), None)


def _aws_site(work: Path, notice_s: float) -> dict:
    from emulator import netns
    from emulator.aws import EmulatedAws

    def workers(emu) -> list[str]:
        return [i["InstanceId"] for i in emu.instances(("running",))
                if {t["Key"]: t["Value"] for t in i["Tags"]}.get("spotwise-role") == "worker"
                and i.get("InstanceLifecycle") == "spot"]

    def scripts_match(emu) -> bool:
        return bool(emu.scripts) and all(script == base64.b64decode(emu.ec2.describe_instance_attribute(
            InstanceId=iid, Attribute="userData")["UserData"]["Value"]) for iid, script in emu.scripts.items())

    # the nodes in their region's network namespace where this machine allows one (issue 48 item 3)
    return {"region": "us-east-1", "budget_usd": 5.0,
            "emulator": lambda: EmulatedAws(work / "aws", netns=netns.missing() is None),
            "storage": "s3://ckpt/runs",
            "exhaust_zone": lambda emu, zone: emu.set_no_capacity([f"{emu.zone_ids[zone]}:spot"]),
            "spot_workers": workers, "preempt": lambda emu, iid: emu.preempt(iid, notice_s=notice_s),
            "scripts_match": scripts_match,
            "heads": lambda emu: [i["PrivateIpAddress"] for i in emu.instances(("running",))
                                  if {t["Key"]: t["Value"] for t in i["Tags"]}.get("spotwise-role") == "head"]}


def _gcp_site(work: Path, notice_s: float) -> dict:
    from emulator import netns
    from emulator.gcp import EmulatedGcp

    def workers(emu) -> list[str]:
        return [i["name"] for i in emu.instances(("RUNNING",)) if i["labels"].get("spotwise-role") == "worker"
                and i["scheduling"].get("provisioningModel") == "SPOT"]

    def scripts_match(emu) -> bool:
        sent = {r["body"]["name"]: {i["key"]: i["value"] for i in r["body"]["metadata"]["items"]}["startup-script"]
                for r in emu.fake.requests if r["method"] == "POST" and r["path"].endswith("/instances") and r["body"]}
        return bool(emu.scripts) and all(script == sent[n].encode() for n, script in emu.scripts.items())

    return {"region": "us-central1", "budget_usd": 8.0,
            # the launcher reaches the head over ssh to its external address, the nodes in their
            # region's network namespace where this machine allows one (issue 48 item 3)
            "emulator": lambda: EmulatedGcp(work / "gcp", notice_s=notice_s, head_path="ssh",
                                            netns=netns.missing() is None),
            # GCP nodes reach gs:// as their service account (the emulator's GCS refuses anyone else)
            "storage": "gs://ckpt/runs",
            "exhaust_zone": lambda emu, zone: emu.set_no_capacity([f"{zone}:SPOT"]),
            "spot_workers": workers, "preempt": lambda emu, name: emu.preempt(name),
            "heads": lambda emu: [i["networkInterfaces"][0]["networkIP"] for i in emu.instances(("RUNNING",))
                                  if i["labels"].get("spotwise-role") == "head"],
            "scripts_match": scripts_match}


def dry_run(task: Path, storage: list[str], env: dict) -> dict:
    """``spotwise launch TASK --dry-run --format json``'s plan; its own message when it refuses."""
    r = subprocess.run([sys.executable, "-m", "spotwise.cli", "launch", str(task), "--dry-run", "--format", "json",
                        *storage], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"the plan of {task} was refused (exit {r.returncode}): {r.stderr.strip()}")
    return json.loads(r.stdout)


def poll_env(env: dict, node_poll_s: str) -> dict:
    """``env`` with the node listing period the bench asked for: ``"default"`` drops the emulators'
    ``SPOTWISE_NODE_POLL_S`` (2 s, which they set so the e2e tests notice a gone node sooner), so the
    launch lists nodes as it would on a real account; anything else is that many seconds."""
    env = dict(env)
    if node_poll_s == "default":
        env.pop("SPOTWISE_NODE_POLL_S", None)
    else:
        env["SPOTWISE_NODE_POLL_S"] = node_poll_s
    return env


def run_azure(task: Path, work: Path, node_poll_s: str = "default") -> dict:
    """The emulated-Azure run of the scenario above; what ``main`` prints for it."""
    from emulator.azure import EmulatedAzure

    spec = yaml.safe_load(task.read_text())
    spec["resources"].update({"clouds": ["azure"], "regions": ["eastus", "westus2"]})
    task.write_text(yaml.safe_dump(spec))
    home = work / "azure-home"
    with EmulatedAzure(work / "azure") as emu:
        emu.refresh_prices(home)
        env = poll_env(dict(os.environ, **emu.env()), node_poll_s)
        plan = dry_run(task, ["--storage", emu.storage], dict(env, SPOTWISE_HOME=str(home)))
        c = plan["chosen"]
        emu.set_no_capacity([f"{c['instance_type']}:{c['region']}:spot"], kind="sku")
        state: dict = {"victim": None, "notice_t": None}

        def preempt_after_first_checkpoint() -> None:
            if state["victim"]:
                return
            ws = [v["name"] for v in emu.vms(role="worker", priority="Spot") if v["name"] in emu.nodes]
            if ws and emu.committed():
                state["victim"], state["notice_t"] = ws[0], time.time()
                emu.preempt(ws[0])

        before = reads("azure", emu, work)
        wall, rep = launch(task, home, env, "--storage", emu.storage, during=preempt_after_first_checkpoint)
        rates = read_rates({"azure": (before, reads("azure", emu, work))}, wall)
        puts = {r["path"].rsplit("/", 1)[-1]: r["body"] for r in emu.fake.requests
                if r["method"] == "PUT" and "/virtualMachines/" in r["path"]}
        matches = all(script == base64.b64decode(puts[name]["properties"]["osProfile"]["customData"])
                      for name, script in emu.scripts.items())
        leaked = emu.leftovers()
        acked = any(vm == state["victim"] for vm, _ in emu.imds.acks)
        return {"wall": wall, "report": rep, "matches": bool(emu.scripts) and matches, "leaked": leaked,
                "extra": {**rates, **wheel_counts([emu]), "preempt_acknowledged": acked,
                          "notice_to_training_s": notice_to_training_s(home, rep, state.get("notice_t")),
                          "eviction": next((why for vm, why in emu.evicted if vm == state["victim"]), None)}}


def first_step_s(home: Path, job_id: str, t0: float) -> float | None:
    """Seconds from ``t0`` (the launch's start, epoch) to the first curve sample of the run with a
    completed step (the run's curves in ``home``'s database: :func:`spotwise.engine.run.curves.curves`)."""
    code = ("import json, sys; from spotwise.engine.run.curves import curves; "
            "print(json.dumps([p['t'] for p in curves(sys.argv[1])['points'] if p['step']]))")
    out = subprocess.run([sys.executable, "-c", code, job_id], env=dict(os.environ, SPOTWISE_HOME=str(home)),
                         capture_output=True, text=True)
    ts = json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else []
    return round(min(ts) - t0, 1) if ts else None


def run_slurm(spec: dict, work: Path, preempt_at: float) -> dict:
    """The run on the real test Slurm cluster (the module docstring); what ``main`` prints for it.
    The priority job that preempts both nodes is submitted ``preempt_at`` s after training's first
    step (as the local baseline's two notices); ``notice_to_training_s`` counts from that submission
    (Slurm's own decision to preempt, about 2 s, is in it)."""
    from emulator.base import stock_image_python
    from slurm_cluster import GRACE_S, TestCluster, jobs_builds, missing, nodes_from_wheel

    from spotwise.build import build_id

    why = missing()
    if why:
        sys.exit(f"--cloud slurm: {why}")
    cluster = TestCluster(work / "slurm-cluster")
    cluster.root.mkdir(parents=True)
    cluster.start()
    try:
        config = work / "slurm-config.yaml"
        config.write_text(yaml.safe_dump({"slurm": {"clusters": [{
            "name": "lab", "slurm_conf": str(cluster.conf), "python": str(stock_image_python()),
            "partitions": {"preemptible": {"price_per_gpu_hour": 0.4}, "priority": {"price_per_gpu_hour": 1.6}}}]}}))
        spec["resources"] = {"accelerators": "H100:8", "nodes": 2, "clouds": ["slurm"], "market": "spot"}
        task = work / "slurm-task.yaml"
        task.write_text(yaml.safe_dump(spec))
        ckpt, node_dir, home = work / "slurm-ckpt", work / "slurm-nodes", work / "slurm-home"
        state: dict = {"notice_t": None}

        def preempt_as_the_local_run() -> None:
            t = first_step_t(home)
            if state["notice_t"] is None and t is not None and time.time() >= t + preempt_at:
                state["notice_t"] = time.time()
                cluster.run("sbatch", "-p", "priority", "--nodes=2", "--gres=gpu:h100:8", "-J", "priority-job",
                            "--output=/dev/null", "--wrap", "sleep 2")

        env = dict(os.environ, SPOTWISE_CONFIG=str(config), SPOTWISE_SLURM_NODE_DIR=str(node_dir))
        t0 = time.time()
        wall, rep = launch(task, home, env, "--storage", f"file://{ckpt}", during=preempt_as_the_local_run)
        first = first_step_s(home, rep["job_id"], t0)
        n2t = {"notice_to_training_s": notice_to_training_s(home, rep, state["notice_t"]),
               "notice_to_resume_s": notice_to_resume_s(rep, state["notice_t"])}
        deadline = time.monotonic() + 30       # a cancelled job may linger COMPLETING for KillWait
        while cluster.jobs() and time.monotonic() < deadline:
            time.sleep(0.5)
        leaked = {"slurm": cluster.jobs()}
        reported = jobs_builds(node_dir)
    finally:
        cluster.stop()
    return {"wall": wall, "report": rep, "leaked": leaked, "first_step_s": first,
            "extra": {**n2t, "notice_s": GRACE_S, "preempt_at_s": preempt_at,
                      **slurm_timeline(rep, state["notice_t"]),
                      "nodes_launched": len(reported),
                      "nodes_from_wheel": sum(b == [build_id()] for b in reported.values()),
                      "node_installs": sum(b == build_id() for b, _ in nodes_from_wheel(node_dir).values())}}


#: the events of a Slurm run whose first occurrence after the notice ``slurm_timeline`` reports
TIMELINE = ("node_notice", "replaced", "launched", "notice_restart", "preempted")


def slurm_timeline(rep: dict, notice_t: float | None) -> dict:
    """``{"timeline_s": {event: seconds after the notice}}``: the first of each :data:`TIMELINE`
    event at or after ``notice_t`` (``replaced``: when it was asked for, its ``asked_at``), where the
    Slurm run's time between notice and training goes (docs/benchmarks.md)."""
    if notice_t is None:
        return {}
    out: dict[str, float] = {}
    for e in rep.get("events", []):
        t = e.get("asked_at", e["t"]) if e["event"] == "replaced" else e["t"]
        if e["event"] in TIMELINE and t >= notice_t and e["event"] not in out:
            out[e["event"]] = round(t - notice_t, 1)
    return {"timeline_s": out}


# One entry per emulated cloud: how to start it, take a zone's spot capacity away, find its spot
# workers, preempt one its own way and check the boot scripts the nodes ran.
SITES = {"aws": _aws_site, "gcp": _gcp_site}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cloud", default="aws",
                    help=f"one of {', '.join([*sorted(SITES), 'azure', 'slurm'])}, or several in plan order (aws,gcp)")
    ap.add_argument("--exhaust", default=None, help="a cloud of --cloud whose every offer answers a capacity error")
    ap.add_argument("--format", default="table", choices=["table", "json"])
    ap.add_argument("--notice-seconds", type=float, default=12.0)
    ap.add_argument("--preempt-at", type=float, default=10.0,
                    help="seconds after training's first step at which one spot worker is noticed, on the local "
                         "baseline and on the emulated AWS/GCP alike")
    ap.add_argument("--node-poll-s", default="default",
                    help="the node listing period the launch runs with (SPOTWISE_NODE_POLL_S): 'default', what a "
                         "user gets (the emulators' own 2 s is dropped), or seconds")
    a = ap.parse_args()
    clouds = [c.strip() for c in a.cloud.split(",") if c.strip()]
    allowed = {*SITES, "azure", "slurm"}
    if not clouds or any(c not in allowed for c in clouds) or (len(clouds) > 1 and {"azure", "slurm"} & set(clouds)):
        ap.error(f"--cloud: one of {', '.join(sorted(allowed))}, or aws,gcp; got {a.cloud!r}")
    if a.exhaust is not None and (a.exhaust not in clouds or len(clouds) < 2):
        ap.error(f"--exhaust: one of the several clouds of --cloud ({a.cloud}); got {a.exhaust!r}")

    work = Path(tempfile.mkdtemp(prefix="sw-bench-clouds-"))
    os.environ["SW_EMU_CALLS"] = str(work / "ec2_calls.jsonl")     # the emulated EC2 counts spotwise's reads there
    # the README's main job with a batch of 16, which the emulated clouds' A100:8 x 2 plan needs (the
    # plan checks the batch at each offer's world size, 16 ranks there), on both sides: like with like
    example = work / "tiny-gpt.yaml"
    base = yaml.safe_load((ROOT / "examples" / "tiny-gpt.yaml").read_text())
    base["training"]["batch_size"] = BATCH
    example.write_text(yaml.safe_dump(base))
    # the local baseline gets the run's own preemption schedule: one spot worker noticed --preempt-at s
    # after the first step with --notice-seconds; for Slurm, both workers at once (the priority job
    # takes both nodes of the run's one job) with Slurm's GraceTime as the notice
    if clouds == ["slurm"]:
        from slurm_cluster import GRACE_S

        schedule = ["--preempt-at", f"{a.preempt_at:g},{a.preempt_at:g}", "--notice-seconds", f"{GRACE_S:g}"]
    else:
        schedule = ["--preempt-at", f"{a.preempt_at:g}", "--notice-seconds", f"{a.notice_seconds:g}"]
    local_t0 = time.time()
    local_wall, local = launch(example, work / "local", dict(os.environ), *schedule,
                               "--storage", f"file://{work}/local-ckpt")
    if local["status"] != "succeeded":      # no baseline, no ratio and no weights to compare
        sys.exit(f"the local baseline run {local['status']}: {local['message']}")
    local_n2t = {"local_preemptions": local["preemptions"],
                 "local_notice_to_training_s": notice_to_training_s(work / "local", local, local_notice_t(local))}
    spec = yaml.safe_load(example.read_text())
    spec.pop("local", None)
    if clouds == ["slurm"]:
        res = run_slurm(spec, work, a.preempt_at)
        _print(a, {**_summary("slurm", res["report"], local, local_wall, res["wall"], None, res["leaked"]),
                   **local_n2t, "local_notice_to_resume_s": notice_to_resume_s(local, local_notice_t(local)),
                   "first_step_s": res["first_step_s"],
                   "local_first_step_s": first_step_s(work / "local", local["job_id"], local_t0), **res["extra"]})
        return
    task = work / "task.yaml"
    if clouds == ["azure"]:
        spec["resources"].update({"accelerators": "A100:8", "market": "spot"})
        spec["budget_usd"] = 5.0
        task.write_text(yaml.safe_dump(spec))
        res = run_azure(task, work, a.node_poll_s)
        _print(a, {**_summary("azure", res["report"], local, local_wall, res["wall"], res["matches"], res["leaked"]),
                   **local_n2t, **res["extra"], "node_poll_s": a.node_poll_s})
        return
    sites = {c: SITES[c](work, a.notice_seconds) for c in clouds}
    site = sites[clouds[-1]] if a.exhaust else sites[clouds[0]]      # where the scenario plays out
    spec["resources"].update({"accelerators": "A100:8", "clouds": clouds,
                              "regions": [sites[c]["region"] for c in clouds], "market": "spot"})
    spec["budget_usd"] = max(s["budget_usd"] for s in sites.values())
    task.write_text(yaml.safe_dump(spec))
    with contextlib.ExitStack() as stack:
        emus = {c: stack.enter_context(sites[c]["emulator"]()) for c in clouds}
        emu = emus[clouds[-1]] if a.exhaust else emus[clouds[0]]
        env = dict(os.environ)
        for c in reversed(clouds):         # the first cloud's S3 endpoint and ports win
            env.update(emus[c].env())
        env = poll_env(env, a.node_poll_s)
        if a.exhaust:
            emus[a.exhaust].set_no_capacity(["*:spot", "*:on-demand"] if a.exhaust == "aws" else ["*"])
        home = work / f"{'-'.join(clouds)}-home"
        # each cloud's own store (s3:// for AWS, gs:// for GCP): each cloud's nodes reach only theirs
        stores = {c: sites[c]["storage"] for c in clouds}
        storage = [a for c in clouds for a in ("--storage", f"{c}={stores[c]}")] if len(clouds) > 1 \
            else ["--storage", stores[clouds[0]]]
        plan = dry_run(task, storage, dict(env, SPOTWISE_HOME=str(home)))
        first = next(o for o in [plan["chosen"], *plan["fallbacks"]] if o["cloud"] == (clouds[-1] if a.exhaust
                                                                                      else clouds[0]))
        site["exhaust_zone"](emu, first["zone"])
        state: dict = {"victim": None, "notice_t": None}

        probe = PrivateProbe(site["heads"], emu, int(env.get("SPOTWISE_RAY_DASHBOARD_PORT") or 8265))

        def preempt_as_the_local_run() -> None:
            """One spot worker, ``--preempt-at`` s after training's first step, as on the local cloud (and
            the launcher's direct reach of the head's private address tried meanwhile)."""
            probe()
            if state["victim"]:
                return
            t0 = first_step_t(home)
            if t0 is not None and time.time() >= t0 + a.preempt_at:
                ws = site["spot_workers"](emu)
                if ws:
                    state["victim"], state["notice_t"] = ws[0], time.time()
                    site["preempt"](emu, ws[0])

        before = {c: reads(c, e, work) for c, e in emus.items()}
        wall, rep = launch(task, home, env, *storage, during=preempt_as_the_local_run)
        rates = read_rates({c: (before[c], reads(c, e, work)) for c, e in emus.items()}, wall)
        matches = site["scripts_match"](emu)
        leaked: dict[str, list] = {}
        for c, e in emus.items():
            leaked.update({f"{c}:{k}": v for k, v in e.leftovers().items()})
        wheels = wheel_counts(list(emus.values()))
    out = {**_summary(a.cloud, rep, local, local_wall, wall, matches, leaked),
           "notice_to_training_s": notice_to_training_s(home, rep, state["notice_t"]), **local_n2t,
           "preempt_at_s": a.preempt_at, "notice_s": a.notice_seconds, **rates, **wheels,
           "node_poll_s": env.get("SPOTWISE_NODE_POLL_S", "default"), "stores": stores,
           "head_path": (env.get("SPOTWISE_HEAD_PATH") or "ssh").split(":")[0],
           "private_unreachable": probe.unreachable,
           **({"private_tries": probe.direct.tried} if probe.direct is not None else {})}
    if a.exhaust:
        out["exhausted"] = a.exhaust
        out["exhausted_attempts"] = sum(x["outcome"] == "capacity" and x["offer"].startswith(a.exhaust + "/")
                                        for x in rep["attempts"])
    _print(a, out)


class PrivateProbe:
    """Whether this process (the launcher's machine) could open a TCP connection to a head's
    private address, dashboard port, while the run had a head up: ``unreachable`` is True when
    every try failed, False when one connected or was refused (the address answered), None when
    no head was seen to try. Tried once per head address. An emulator whose regions are network
    namespaces (``emu.nets``): :class:`emulator.netns.DirectProbe` on the same port, tried
    from the launcher only once the same connection made inside the head's region connected
    (``private_tries``: head -> the two results)."""

    def __init__(self, heads, emu, port: int) -> None:
        from emulator.netns import DirectProbe

        self.heads, self.emu, self.port = heads, emu, port
        self.tried: dict[str, bool] = {}
        nets = getattr(emu, "nets", None)
        self.direct = DirectProbe(nets, port) if nets is not None else None

    def __call__(self) -> None:
        import socket

        if self.direct is not None:
            self.direct(self.emu.heads_in_netns())
            return
        for ip in self.heads(self.emu):
            if ip in self.tried:
                continue
            try:
                with socket.create_connection((ip, self.port), timeout=3):
                    self.tried[ip] = True
            except ConnectionRefusedError:      # the address answered (a closed port): reachable
                self.tried[ip] = True
            except OSError:                     # no route, unreachable, timed out
                self.tried[ip] = False

    @property
    def unreachable(self) -> bool | None:
        if self.direct is not None:
            return self.direct.unreachable
        return (not any(self.tried.values())) if self.tried else None


def wheel_counts(emus: list) -> dict:
    """``nodes_launched`` (machines the emulated clouds booted) and ``nodes_from_wheel`` (those whose
    boot log says they installed the build the launch shipped, of the launcher's build id): the two
    must be equal — every node boots from a stock image without spotwise."""
    from spotwise.build import build_id

    launched = sum(len(e.scripts) for e in emus)
    shipped = sum(b == build_id() for e in emus for b, _ in e.nodes_from_wheel().values())
    return {"nodes_launched": launched, "nodes_from_wheel": shipped}


def _summary(cloud: str, rep: dict, local: dict, local_wall: float, wall: float, matches: bool | None,
             leaked: dict) -> dict:
    return {"cloud": cloud, "cloud_used": ",".join(rep.get("cloud_used") or [rep["cloud"]]),
            "status": rep["status"], "preemptions": rep["preemptions"],
            "resumes": rep["resumes"], "lost_steps": rep["lost_steps"],
            "weights_equal": rep["model_sha256"] == local["model_sha256"],
            "bootstrap_script_matches": matches, "spend_usd": rep["cost_usd"],
            "budget_usd": rep["budget_usd"], "leaked": sum(len(v) for v in leaked.values()),
            "capacity_errors": sum(x["outcome"] == "capacity" for x in rep["attempts"]),
            "wall_s": round(wall, 1), "local_wall_s": round(local_wall, 1), "wall_ratio": round(wall / local_wall, 3)}


def _print(a, out: dict) -> None:
    if a.format == "json":
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:26} {v}")


if __name__ == "__main__":
    main()

"""The main job on an emulated cloud vs the same job on the local cloud, in one run.

    .venv/bin/python bench/bench_launch_clouds.py --cloud aws|azure [--format json]

Scenario (what CI's end-to-end test proves, timed here): the tiny GPT task, a head and 2 spot
workers; on AWS the plan's first zone answers InsufficientInstanceCapacity (failover) and one
spot worker is preempted the way EC2 does it (notice on its metadata endpoint, instance
terminated after the notice window) once the first checkpoint is committed; checkpoints on S3
(moto). Baseline: the same task on the local cloud, no preemption, in the same run.

Prints ``{"cloud", "status", "preemptions", "resumes", "lost_steps", "weights_equal",
"bootstrap_script_matches", "spend_usd", "budget_usd", "leaked", "wall_s", "local_wall_s",
"wall_ratio"}``. Goal: emulated-AWS wall <= 1.5x local.

Azure (``--cloud azure``, :func:`run_azure`): the ARM fake + instance emulator of
``tests/emulator/azure.py``; prices refreshed from the emulated Retail Prices API first (two spot
regions, as ``spotwise catalog refresh`` would), the plan's first region answers
``SkuNotAvailable`` for the Spot size, and one spot worker is evicted through a ``Preempt``
scheduled event (NotBefore 30 s ahead; evicted when the watcher acknowledges it after the
just-in-time checkpoint). Same JSON plus ``"cloud_used"``, ``"preempt_acknowledged"``, ``"eviction"``.
"""

from __future__ import annotations

import argparse
import base64
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
sys.path.insert(0, str(ROOT / "tests"))


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


def run_azure(task: Path, work: Path) -> dict:
    """The emulated-Azure run of the scenario above; what ``main`` prints for it."""
    from emulator.azure import EmulatedAzure

    spec = yaml.safe_load(task.read_text())
    spec["resources"].update({"clouds": ["azure"], "regions": ["eastus", "westus2"]})
    task.write_text(yaml.safe_dump(spec))
    home = work / "azure-home"
    with EmulatedAzure(work / "azure") as emu:
        emu.refresh_prices(home)
        env = dict(os.environ, **emu.env())
        plan = json.loads(subprocess.run([sys.executable, "-m", "spotwise.cli", "launch", str(task), "--dry-run",
                                          "--format", "json", "--storage", "s3://ckpt/runs"],
                                         env=dict(env, SPOTWISE_HOME=str(home)), check=True,
                                         capture_output=True, text=True).stdout)
        c = plan["chosen"]
        emu.set_no_capacity([f"{c['instance_type']}:{c['region']}:spot"], kind="sku")
        s3 = emu.s3()
        state: dict = {"victim": None}

        def preempt_after_first_checkpoint() -> None:
            if state["victim"]:
                return
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket=emu.bucket, Prefix="runs/").get("Contents", [])]
            ws = [v["name"] for v in emu.vms(role="worker", priority="Spot") if v["name"] in emu.nodes]
            if any(k.endswith("/COMMITTED") for k in keys) and ws:
                state["victim"] = ws[0]
                emu.preempt(ws[0])

        wall, rep = launch(task, home, env, "--storage", "s3://ckpt/runs", during=preempt_after_first_checkpoint)
        puts = {r["path"].rsplit("/", 1)[-1]: r["body"] for r in emu.fake.requests
                if r["method"] == "PUT" and "/virtualMachines/" in r["path"]}
        matches = all(script == base64.b64decode(puts[name]["properties"]["osProfile"]["customData"])
                      for name, script in emu.scripts.items())
        leaked = emu.leftovers()
        acked = any(vm == state["victim"] for vm, _ in emu.imds.acks)
        return {"wall": wall, "report": rep, "matches": bool(emu.scripts) and matches, "leaked": leaked,
                "extra": {"preempt_acknowledged": acked,
                          "eviction": next((why for vm, why in emu.evicted if vm == state["victim"]), None)}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cloud", default="aws", choices=["aws", "azure"])
    ap.add_argument("--format", default="table", choices=["table", "json"])
    ap.add_argument("--notice-seconds", type=float, default=12.0)
    a = ap.parse_args()
    from emulator.aws import EmulatedAws

    work = Path(tempfile.mkdtemp(prefix="sw-bench-clouds-"))
    example = ROOT / "examples" / "tiny-gpt.yaml"
    local_wall, local = launch(example, work / "local", dict(os.environ), "--no-preempt",
                               "--storage", f"file://{work}/local-ckpt")
    spec = yaml.safe_load(example.read_text())
    spec["resources"].update({"accelerators": "A100:8", "clouds": [a.cloud], "regions": ["us-east-1"],
                              "market": "spot"})
    spec.pop("local", None)
    spec["budget_usd"] = 5.0
    task = work / "task.yaml"
    task.write_text(yaml.safe_dump(spec))
    if a.cloud == "azure":
        res = run_azure(task, work)
        rep = res["report"]
        out = {"cloud": a.cloud, "status": rep["status"], "preemptions": rep["preemptions"],
               "resumes": rep["resumes"], "lost_steps": rep["lost_steps"],
               "weights_equal": rep["model_sha256"] == local["model_sha256"],
               "bootstrap_script_matches": res["matches"], "spend_usd": rep["cost_usd"],
               "budget_usd": rep["budget_usd"], "leaked": sum(len(v) for v in res["leaked"].values()),
               "capacity_errors": sum(x["outcome"] == "capacity" for x in rep["attempts"]),
               "wall_s": round(res["wall"], 1), "local_wall_s": round(local_wall, 1),
               "wall_ratio": round(res["wall"] / local_wall, 3), "cloud_used": rep["cloud"], **res["extra"]}
        print(json.dumps(out) if a.format == "json" else "\n".join(f"{k:26} {v}" for k, v in out.items()))
        return
    with EmulatedAws(work / "aws") as emu:
        env = dict(os.environ, **emu.env())
        plan = json.loads(subprocess.run([sys.executable, "-m", "spotwise.cli", "launch", str(task), "--dry-run",
                                          "--format", "json", "--storage", "s3://ckpt/runs"],
                                         env=dict(env, SPOTWISE_HOME=str(work / "aws-home")), check=True,
                                         capture_output=True, text=True).stdout)
        emu.set_no_capacity([f"{emu.zone_ids[plan['chosen']['zone']]}:spot"])
        s3 = emu._client("s3")
        state = {"victim": None}

        def preempt_after_first_checkpoint() -> None:
            if state["victim"]:
                return
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket=emu.bucket, Prefix="runs/").get("Contents", [])]
            if any(k.endswith("/COMMITTED") for k in keys):
                ws = [i for i in emu.instances(("running",))
                      if {t["Key"]: t["Value"] for t in i["Tags"]}.get("spotwise-role") == "worker"
                      and i.get("InstanceLifecycle") == "spot"]
                if ws:
                    state["victim"] = ws[0]["InstanceId"]
                    emu.preempt(state["victim"], notice_s=a.notice_seconds)

        wall, rep = launch(task, work / "aws-home", env, "--storage", "s3://ckpt/runs",
                           during=preempt_after_first_checkpoint)
        matches = all(script == base64.b64decode(emu.ec2.describe_instance_attribute(
            InstanceId=iid, Attribute="userData")["UserData"]["Value"]) for iid, script in emu.scripts.items())
        leaked = emu.leftovers()
    out = {"cloud": a.cloud, "status": rep["status"], "preemptions": rep["preemptions"], "resumes": rep["resumes"],
           "lost_steps": rep["lost_steps"], "weights_equal": rep["model_sha256"] == local["model_sha256"],
           "bootstrap_script_matches": bool(emu.scripts) and matches, "spend_usd": rep["cost_usd"],
           "budget_usd": rep["budget_usd"], "leaked": sum(len(v) for v in leaked.values()),
           "capacity_errors": sum(x["outcome"] == "capacity" for x in rep["attempts"]),
           "wall_s": round(wall, 1), "local_wall_s": round(local_wall, 1), "wall_ratio": round(wall / local_wall, 3)}
    if a.format == "json":
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:26} {v}")


if __name__ == "__main__":
    main()

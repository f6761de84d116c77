"""The main job on an emulated cloud vs the same job on the local cloud, in one run.

    .venv/bin/python bench/bench_launch_clouds.py --cloud aws|gcp [--format json]

Scenario (what CI's end-to-end tests prove, timed here): the tiny GPT task, a head and 2 spot
workers; the plan's first zone answers the cloud's capacity error (AWS
InsufficientInstanceCapacity, GCP ZONE_RESOURCE_POOL_EXHAUSTED: failover) and one spot worker is
preempted the way that cloud does it once the first checkpoint is committed (AWS: notice on
``spot/instance-action``; GCP: ``instance/preempted`` turns TRUE; the instance is ended after the
notice window); checkpoints on S3 (moto). Baseline: the same task on the local cloud, no
preemption, in the same run.

Prints ``{"cloud", "cloud_used", "status", "preemptions", "resumes", "lost_steps", "weights_equal",
"bootstrap_script_matches", "spend_usd", "budget_usd", "leaked", "capacity_errors", "wall_s",
"local_wall_s", "wall_ratio"}``. Goal: emulated-cloud wall <= 1.5x local.
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


def _aws_site(work: Path, notice_s: float) -> dict:
    from emulator.aws import EmulatedAws

    def workers(emu) -> list[str]:
        return [i["InstanceId"] for i in emu.instances(("running",))
                if {t["Key"]: t["Value"] for t in i["Tags"]}.get("spotwise-role") == "worker"
                and i.get("InstanceLifecycle") == "spot"]

    def scripts_match(emu) -> bool:
        return bool(emu.scripts) and all(script == base64.b64decode(emu.ec2.describe_instance_attribute(
            InstanceId=iid, Attribute="userData")["UserData"]["Value"]) for iid, script in emu.scripts.items())

    return {"region": "us-east-1", "budget_usd": 5.0, "emulator": lambda: EmulatedAws(work / "aws"),
            "s3": lambda emu: emu._client("s3"),
            "exhaust_zone": lambda emu, zone: emu.set_no_capacity([f"{emu.zone_ids[zone]}:spot"]),
            "spot_workers": workers, "preempt": lambda emu, iid: emu.preempt(iid, notice_s=notice_s),
            "scripts_match": scripts_match}


def _gcp_site(work: Path, notice_s: float) -> dict:
    from emulator.gcp import EmulatedGcp

    def workers(emu) -> list[str]:
        return [i["name"] for i in emu.instances(("RUNNING",)) if i["labels"].get("spotwise-role") == "worker"
                and i["scheduling"].get("provisioningModel") == "SPOT"]

    def scripts_match(emu) -> bool:
        sent = {r["body"]["name"]: {i["key"]: i["value"] for i in r["body"]["metadata"]["items"]}["startup-script"]
                for r in emu.fake.requests if r["method"] == "POST" and r["path"].endswith("/instances") and r["body"]}
        return bool(emu.scripts) and all(script == sent[n].encode() for n, script in emu.scripts.items())

    return {"region": "us-central1", "budget_usd": 8.0,
            "emulator": lambda: EmulatedGcp(work / "gcp", notice_s=notice_s),
            "s3": lambda emu: emu.s3, "exhaust_zone": lambda emu, zone: emu.set_no_capacity([f"{zone}:SPOT"]),
            "spot_workers": workers, "preempt": lambda emu, name: emu.preempt(name),
            "scripts_match": scripts_match}


# One entry per emulated cloud: how to start it, take a zone's spot capacity away, find its spot
# workers, preempt one its own way and check the boot scripts the nodes ran.
SITES = {"aws": _aws_site, "gcp": _gcp_site}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cloud", default="aws", choices=sorted(SITES))
    ap.add_argument("--format", default="table", choices=["table", "json"])
    ap.add_argument("--notice-seconds", type=float, default=12.0)
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sw-bench-clouds-"))
    site = SITES[a.cloud](work, a.notice_seconds)
    example = ROOT / "examples" / "tiny-gpt.yaml"
    local_wall, local = launch(example, work / "local", dict(os.environ), "--no-preempt",
                               "--storage", f"file://{work}/local-ckpt")
    if local["status"] != "succeeded":      # no baseline, no ratio and no weights to compare
        sys.exit(f"the local baseline run {local['status']}: {local['message']}")
    spec = yaml.safe_load(example.read_text())
    spec["resources"].update({"accelerators": "A100:8", "clouds": [a.cloud], "regions": [site["region"]],
                              "market": "spot"})
    spec.pop("local", None)
    spec["budget_usd"] = site["budget_usd"]
    task = work / "task.yaml"
    task.write_text(yaml.safe_dump(spec))
    with site["emulator"]() as emu:
        env = dict(os.environ, **emu.env())
        home = work / f"{a.cloud}-home"
        plan = json.loads(subprocess.run([sys.executable, "-m", "spotwise.cli", "launch", str(task), "--dry-run",
                                          "--format", "json", "--storage", "s3://ckpt/runs"],
                                         env=dict(env, SPOTWISE_HOME=str(home)), check=True,
                                         capture_output=True, text=True).stdout)
        site["exhaust_zone"](emu, plan["chosen"]["zone"])
        s3 = site["s3"](emu)
        state = {"victim": None}

        def preempt_after_first_checkpoint() -> None:
            if state["victim"]:
                return
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket=emu.bucket, Prefix="runs/").get("Contents", [])]
            if any(k.endswith("/COMMITTED") for k in keys):
                ws = site["spot_workers"](emu)
                if ws:
                    state["victim"] = ws[0]
                    site["preempt"](emu, ws[0])

        wall, rep = launch(task, home, env, "--storage", "s3://ckpt/runs", during=preempt_after_first_checkpoint)
        matches = site["scripts_match"](emu)
        leaked = emu.leftovers()
    out = {"cloud": a.cloud, "cloud_used": rep["cloud"], "status": rep["status"], "preemptions": rep["preemptions"],
           "resumes": rep["resumes"], "lost_steps": rep["lost_steps"],
           "weights_equal": rep["model_sha256"] == local["model_sha256"],
           "bootstrap_script_matches": matches, "spend_usd": rep["cost_usd"],
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

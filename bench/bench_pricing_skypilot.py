#!/usr/bin/env python3
"""Cold ``spotwise prices --gpu H100 --format json`` vs SkyPilot's ``sky gpus list H100 --all-regions``.

Same rows on both sides: SkyPilot reads hand-placed catalogs built here from OUR shipped snapshot
(the unflagged on-demand/spot rows ``spotwise prices`` ranks), written in SkyPilot's ``vms.csv``
format (``InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,
Region,AvailabilityZone``; Azure has ``Generation`` instead of a zone; AWS ``GpuInfo`` is the
python-literal dict SkyPilot's reader ``ast.literal_eval``s, GCP/Azure put the GPU name there, as
SkyPilot's own fetchers do). Every other cloud SkyPilot knows gets a header-only ``vms.csv`` so
nothing is downloaded. No ``.meta/*.md5`` files are written, which SkyPilot reads as "catalog
edited by the user, never re-fetch it".

Isolation: a temporary ``HOME`` (the user's ``~/.sky`` is untouched), ``HTTP(S)_PROXY`` pointing
at a closed loopback port (``NO_PROXY`` = 127.0.0.1/localhost only, for SkyPilot's own local API
server), usage collection off. SkyPilot 0.14's CLI is a client of a local API server, which the
first command starts; it is started once before timing (``sky api start``) and stopped at the end
(``sky api stop``) — so each timed ``sky gpus list`` is a cold *client* process against a warm
local server, which favours SkyPilot (a truly cold first call also pays the server start; that
is measured once and printed separately).

SkyPilot is never installed into the project venv: ``--sky PATH`` names a ``sky`` executable,
else a venv under /tmp (``--venv``, default /tmp/spotwise-skypilot-venv) is created on demand
with ``pip install "skypilot==0.14.*"``.

    .venv/bin/python bench/bench_pricing_skypilot.py [--reps 7] [--sky /tmp/skyvenv/bin/sky]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spotwise.utils.net import free_port

SKY_CLOUDS = ("aws", "azure", "gcp", "ibm", "lambda", "scp", "oci", "runpod", "vast", "vsphere", "cudo",
              "fluidstack", "paperspace", "primeintellect", "do", "nebius", "hyperbolic", "seeweb",
              "shadeform", "yotta", "mithril", "verda")
COLS = ["InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "GpuInfo", "Price",
        "SpotPrice", "Region", "AvailabilityZone"]
AZURE_COLS = COLS[:-1] + ["Generation"]


def ensure_sky(sky: str | None, venv: Path) -> Path:
    if sky:
        return Path(sky)
    exe = venv / "bin" / "sky"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # its `gpus list` also asks the Kubernetes catalog, which needs the extra
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "skypilot[kubernetes]==0.14.*"], check=True)
    return exe


def closed_port() -> int:
    """A port nothing listens on now: any request proxied there fails at once."""
    return free_port()


def write_catalogs(home: Path) -> dict[str, int]:
    """SkyPilot vms.csv per cloud from the snapshot's unflagged on-demand/spot rows; rows per cloud."""
    from spotwise.pricing.catalog import Catalog, blocking_flags
    from spotwise.pricing.offer import Market

    wide: dict[tuple, dict] = {}
    for o in Catalog.load(use_cache=False):
        if o.market not in (Market.ON_DEMAND, Market.SPOT) or blocking_flags(o):
            continue
        k = (o.cloud, o.instance_type, o.region, o.zone)
        row = wide.setdefault(k, {"o": o, "Price": "", "SpotPrice": ""})
        row["Price" if o.market is Market.ON_DEMAND else "SpotPrice"] = o.usd_per_hour
    root = home / ".sky" / "catalogs" / "v8"
    counts: dict[str, int] = {}
    for cloud in SKY_CLOUDS:
        d = root / cloud
        d.mkdir(parents=True, exist_ok=True)
        cols = AZURE_COLS if cloud == "azure" else COLS
        rows = [r for (c, *_), r in sorted(wide.items()) if c == cloud]
        counts[cloud] = len(rows)
        with open(d / "vms.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            if cloud == "gcp":
                counts[cloud] = _write_gcp(w, rows)
                continue
            for r in rows:
                o = r["o"]
                if cloud == "aws":
                    mib = int((o.gpu_memory_gib or 0) * 1024)
                    gpu_info = str({"Gpus": [{"Name": o.accelerator, "Manufacturer": "NVIDIA",
                                              "Count": o.accelerator_count, "MemoryInfo": {"SizeInMiB": mib}}],
                                    "TotalGpuMemoryInfo": {"SizeInMiB": mib * o.accelerator_count}})
                else:
                    gpu_info = o.accelerator
                last = "V2" if cloud == "azure" else o.zone
                w.writerow([o.instance_type, o.accelerator, o.accelerator_count, o.vcpus or "",
                            o.memory_gib or "", gpu_info, r["Price"], r["SpotPrice"], o.region, last])
        if cloud in ("aws", "gcp", "azure"):        # images/quotas read by some paths: header only
            (d / "images.csv").write_text("Tag,Region,OS,OSVersion,ImageId,CreationDate\n")
    return counts


def _sky_gcp_accelerator(instance_type: str) -> tuple[str, int] | None:
    """SkyPilot's GCP model: which (accelerator, count) GPU row a host machine type serves."""
    fam, _, last = instance_type.rpartition("-")
    n = int(last[:-1]) if last.endswith("g") and last[:-1].isdigit() else None
    if fam in ("a2-highgpu", "a2-megagpu"):
        return ("A100", n) if n else None
    if fam == "a2-ultragpu":
        return ("A100-80GB", n) if n else None
    if fam == "a3-highgpu":
        return ("H100", n) if n else None
    if instance_type == "a3-megagpu-8g":
        return ("H100-MEGA", 8)
    if instance_type == "a3-ultragpu-8g":
        return ("H200", 8)
    if instance_type in ("g2-standard-4", "g2-standard-8", "g2-standard-12", "g2-standard-16", "g2-standard-32"):
        return ("L4", 1)
    if instance_type == "g2-standard-24":
        return ("L4", 2)
    return None   # e.g. a3-edgegpu-8g: SkyPilot 0.14 has no GPU row -> host mapping for it


def _write_gcp(w, rows: list[dict]) -> int:
    """SkyPilot's GCP vms.csv splits a GPU VM into a host row (InstanceType, no accelerator) and a
    GPU row (no InstanceType) whose prices it adds. We put our full-VM price on the host row and
    0.0 on the GPU row, so SkyPilot's sum is our price exactly. Returns host rows written."""
    gpu_rows: set[tuple] = set()
    n = 0
    for r in rows:
        o = r["o"]
        acc = _sky_gcp_accelerator(o.instance_type)
        if acc is None:
            continue
        w.writerow([o.instance_type, "", "", o.vcpus or "", o.memory_gib or "", "", r["Price"], r["SpotPrice"],
                    o.region, o.zone])
        n += 1
        gpu_rows.add((acc[0], acc[1], o.region, o.zone))
    for name, count, region, zone in sorted(gpu_rows):
        w.writerow(["", name, count, "", "", name, 0.0, 0.0, region, zone])
    return n


def timed(cmd: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return dt, p.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--sky", help="path to a `sky` executable (SkyPilot 0.14) in its own venv")
    ap.add_argument("--venv", default="/tmp/spotwise-skypilot-venv", help="venv created on demand")
    args = ap.parse_args()
    sky = ensure_sky(args.sky, Path(args.venv))
    tmp = Path(tempfile.mkdtemp(prefix="spotwise-skybench-"))
    home, sw_home = tmp / "home", tmp / "spotwise-home"
    home.mkdir()
    counts = write_catalogs(home)
    proxy = f"http://127.0.0.1:{closed_port()}"
    sky_env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    sky_env.update(HOME=str(home), HTTP_PROXY=proxy, HTTPS_PROXY=proxy, http_proxy=proxy, https_proxy=proxy,
                   ALL_PROXY=proxy, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
                   SKYPILOT_DISABLE_USAGE_COLLECTION="1", SKYPILOT_DEBUG="0")
    # even `import sky` writes ~/.sky (user hash, locks): only ever with the temporary HOME
    version = subprocess.run([str(sky.parent / "python"), "-c", "import sky; print(sky.__version__)"],
                             capture_output=True, text=True, env=sky_env).stdout.strip()
    sw_env = dict(os.environ, SPOTWISE_HOME=str(sw_home))
    sky_cmd = [str(sky), "gpus", "list", "H100", "--all-regions"]
    sw_cmd = [sys.executable, "-m", "spotwise.cli", "prices", "--gpu", "H100", "--format", "json"]
    try:
        t_first, _ = timed([str(sky), "api", "start"], sky_env)      # server start, once
        # same rows? SkyPilot's JSON output vs ours (not timed)
        _, sky_json = timed([str(sky), "gpus", "list", "H100", "--all-regions", "-o", "json"], sky_env)
        sky_items = [i for name, items in json.loads(sky_json[sky_json.index("{"):]).items()
                     if name in ("H100", "H100-MEGA") for i in items]    # its filter is a regex: drop H100-NVL
        sky_keys = {(i["cloud"].lower(), i["instance_type"], i["region"]) for i in sky_items}
        _, sw_json = timed(sw_cmd, sw_env)
        sw_items = json.loads(sw_json)
        sw_keys = {(r["cloud"], r["instance_type"], r["region"]) for r in sw_items}
        timed(sky_cmd, sky_env), timed(sw_cmd, sw_env)                # warm the OS file cache
        ts, tw = [], []
        for _ in range(args.reps):
            ts.append(timed(sky_cmd, sky_env)[0])
            tw.append(timed(sw_cmd, sw_env)[0])
    finally:
        subprocess.run([str(sky), "api", "stop"], env=sky_env, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    ms, mw = statistics.median(ts), statistics.median(tw)
    print(f"SkyPilot {version}; catalog rows written (instance x region x zone): "
          f"aws {counts['aws']}, gcp {counts['gcp']}, azure {counts['azure']}")
    print(f"H100 rows: SkyPilot {len(sky_items)} (one per instance x region, on-demand + spot columns), "
          f"spotwise {len(sw_items)} (one per instance x region x zone x market)")
    only_sw = sorted(sw_keys - sky_keys)
    print(f"(cloud, instance, region) keys: SkyPilot {len(sky_keys)}, spotwise {len(sw_keys)}, common "
          f"{len(sky_keys & sw_keys)}; only SkyPilot {len(sky_keys - sw_keys)}; only spotwise {len(only_sw)}"
          + (f" ({', '.join(sorted({k[1] for k in only_sw}))})" if only_sw else ""))
    print(f"sky api start (local API server, once)                {t_first * 1000:8.0f} ms")
    print(f"sky gpus list H100 --all-regions   median {ms * 1000:8.0f} ms  min {min(ts) * 1000:.0f}  (n={len(ts)})")
    print(f"spotwise prices --gpu H100 --format json  median {mw * 1000:5.0f} ms  min {min(tw) * 1000:.0f}  (n={len(tw)})")
    print(f"ratio sky / spotwise: {ms / mw:.1f}x  (target >= 5x)")


if __name__ == "__main__":
    main()

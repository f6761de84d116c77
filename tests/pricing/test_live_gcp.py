"""GCP fetcher: real google-cloud-billing / google-cloud-compute clients (REST) against a local fake.

The three SKUs of page 1-2 are the real Billing Catalog payload in ``fixtures/gcp_billing_skus.json``
(A100 GPU, A2 Core, A2 Ram, Americas). Spot, commitment, DWS, calendar-mode and sole-tenancy SKUs
are built from that real SKU object with the *observed* description strings and usage types; their
prices are test values (marked below), not real prices.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from spotwise.cli import main
from spotwise.pricing.live import FetchError, FetchQuery
from spotwise.pricing.live import gcp as live_gcp
from spotwise.pricing.offer import Market

from .fakehttp import FakeServer

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "gcp_billing_skus.json").read_text())
REAL = FIXTURE["list_skus_response_page"]
REAL_GPU, REAL_RAM, REAL_CORE = REAL["skus"]
TOKEN = REAL["nextPageToken"]
A2_1G_US_CENTRAL1 = 12 * 0.031611 + 85 * 0.004237 + 2.933908     # = 3.673385, the snapshot README's check


def sku(desc: str, usage: str, usd: float, group: str, base: dict = REAL_GPU) -> dict:
    s = copy.deepcopy(base)
    s["description"], s["category"]["usageType"], s["category"]["resourceGroup"] = desc, usage, group
    s["skuId"] = f"TEST-{abs(hash(desc)) % 10**8:08d}"
    units = int(usd)
    s["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"].update(
        units=str(units), nanos=round((usd - units) * 1e9))
    return s


# test values (not real prices), attached to the real descriptions' naming patterns
CONSTRUCTED = [
    sku("Nvidia Tesla A100 GPU attached to DWS Defined Duration VMs running in Americas", "OnDemand", 1.1, "GPU"),
    sku("Reserved Nvidia Tesla A100 GPU in Americas in Calendar Mode", "OnDemand", 1.2, "GPU"),
    sku("Nvidia Tesla A100 GPU attached to Sole Tenancy VMs running in Americas", "OnDemand", 3.3, "GPU"),
    sku("A2 Instance Core running in Americas Flex Start", "OnDemand", 0.001, "CPU", REAL_CORE),
    sku("Nvidia Tesla A100 GPU attached to preemptible VMs running in Americas", "Preemptible", 2.0, "GPU"),
    sku("Nvidia Tesla A100 GPU attached to Spot Preemptible VMs running in Americas", "Preemptible", 1.2, "GPU"),
    sku("Spot Preemptible A2 Instance Core running in Americas", "Preemptible", 0.01, "CPU", REAL_CORE),
    sku("Spot Preemptible A2 Instance Ram running in Americas", "Preemptible", 0.0013, "RAM", REAL_RAM),
    sku("Commitment v1: Nvidia Tesla A100 GPU in Americas for 1 Year", "Commit1Yr", 1.8, "GPU"),
    sku("Commitment v1: A2 Cpu in Americas for 1 Year", "Commit1Yr", 0.02, "CPU", REAL_CORE),
    sku("Commitment v1: A2 Ram in Americas for 1 Year", "Commit1Yr", 0.0027, "RAM", REAL_RAM),
    sku("Commitment v1: Nvidia Tesla A100 GPU in Americas for 3 Year", "Commit3Yr", 1.0, "GPU"),
    sku("Commitment v1: A2 Cpu in Americas for 3 Year", "Commit3Yr", 0.014, "CPU", REAL_CORE),
    sku("Commitment v1: A2 Ram in Americas for 3 Year", "Commit3Yr", 0.0019, "RAM", REAL_RAM),
]
PAGES = {"": ([REAL_GPU], TOKEN), TOKEN: ([REAL_RAM, REAL_CORE], "page-3"), "page-3": (CONSTRUCTED, "")}


def _mt(name, cpus, mem_mb, acc=None, n=0):
    d = {"kind": "compute#machineType", "name": name, "guestCpus": cpus, "memoryMb": mem_mb}
    if acc:
        d["accelerators"] = [{"guestAcceleratorType": acc, "guestAcceleratorCount": n}]
    return d


ZONES = {
    "us-central1-a": [_mt("a2-highgpu-1g", 12, 87040, "nvidia-tesla-a100", 1),
                      _mt("a3-highgpu-8g", 208, 1916928, "nvidia-h100-80gb", 8), _mt("n1-standard-8", 8, 30720)],
    "us-central1-b": [_mt("a2-highgpu-1g", 12, 87040, "nvidia-tesla-a100", 1)],
    "europe-west4-a": [_mt("a2-highgpu-1g", 12, 87040, "nvidia-tesla-a100", 1)],
}
ACCS = {"us-central1-a": ["nvidia-tesla-a100", "nvidia-h100-80gb"], "us-central1-b": ["nvidia-tesla-a100"],
        "europe-west4-a": ["nvidia-tesla-a100"]}


class Fake:
    """Serves Billing Catalog SKU pages and Compute aggregated lists; ``fail`` maps page -> statuses."""

    def __init__(self, fail: dict[str, list[int]] | None = None, sku_status: int | None = None):
        self.fail = {k: list(v) for k, v in (fail or {}).items()}
        self.sku_status = sku_status

    def __call__(self, path: str):
        u = urlparse(path)
        q = parse_qs(u.query)
        if u.path == "/v1/services/6F81-5844-456A/skus":
            if self.sku_status:
                return self.sku_status, FIXTURE["error_response_invalid_key"]
            tok = q.get("pageToken", [""])[0]
            if self.fail.get(tok):
                return self.fail[tok].pop(0), {"error": {"code": 503, "message": "backend busy"}}
            skus, nxt = PAGES[tok]
            return 200, {"skus": skus, "nextPageToken": nxt}
        if u.path == "/compute/v1/projects/proj-1/aggregated/machineTypes":
            return 200, {"items": {f"zones/{z}": {"machineTypes": [dict(m, zone=z) for m in mts]}
                                   for z, mts in ZONES.items()}}
        if u.path == "/compute/v1/projects/proj-1/aggregated/acceleratorTypes":
            return 200, {"items": {f"zones/{z}": {"acceleratorTypes": [{"name": a, "zone": z} for a in accs]}
                                   for z, accs in ACCS.items()}}
        return 404, {"error": {"code": 404, "message": f"no route {u.path}"}}


@pytest.fixture
def gcp_env(monkeypatch):
    def use(srv):
        monkeypatch.setenv("SPOTWISE_GCP_BILLING_ENDPOINT", srv.url)
        monkeypatch.setenv("SPOTWISE_GCP_ENDPOINT", srv.url)
        monkeypatch.setenv("SPOTWISE_GCP_PROJECT", "proj-1")
        monkeypatch.setenv("SPOTWISE_GCP_API_KEY", "test-key")
        monkeypatch.setenv("SPOTWISE_GCP_ANONYMOUS", "1")
    return use


def test_classify_real_skus_and_observed_descriptions():
    parts = {(p.part, p.key, p.market) for p in map(live_gcp.classify_sku, REAL["skus"])}
    assert parts == {("gpu", "A100", Market.ON_DEMAND), ("core", "A2", Market.ON_DEMAND), ("ram", "A2", Market.ON_DEMAND)}
    assert live_gcp.classify_sku(REAL_GPU).usd == pytest.approx(2.933908)
    got = {}
    for o in FIXTURE["observed_sku_descriptions"]:   # real description strings, minimal SKU objects
        s = sku(o["description"], o["usageType"] or "", o["observed_usd_per_unit"] or 1.0, o["resourceGroup"])
        p = live_gcp.classify_sku(s)
        got[o["description"]] = p and (p.part, p.key, p.market.value)
    assert got["Nvidia H100 Mega 80GB GPU attached to DWS Defined Duration VMs running in Americas"] is None
    assert got["Reserved Nvidia H100 80GB Mega GPU in Americas in Calendar Mode"] is None
    assert got["Nvidia Tesla T4 GPU attached to Sole Tenancy VMs running in Americas"] is None
    assert got["Nvidia H100 80GB GPU running in Americas"] == ("gpu", "H100", "on-demand")
    assert got["Nvidia H100 80GB Plus GPU running in Americas"] == ("gpu", "H100-MEGA", "on-demand")
    assert got["H200 141GB GPU running in Americas"] == ("gpu", "H200", "on-demand")
    assert got["Nvidia H100 80GB GPU attached to Spot Preemptible VMs running in Americas"] == ("gpu", "H100", "spot")
    assert got["Spot Preemptible A3 Instance Core running in Americas"] == ("core", "A3", "spot")
    assert got["Spot Preemptible A3 Instance Ram running in Americas"] == ("ram", "A3", "spot")
    assert got["A3Plus Instance Core running in Americas"] == ("core", "A3PLUS", "on-demand")
    assert got["Commitment v1: Nvidia Tesla T4 GPU running in Americas for 1 Year"] is None   # T4: not priced


def test_fetch_pages_composes_full_vm_prices_and_retries(gcp_env):
    delays: list[float] = []
    with FakeServer(Fake(fail={TOKEN: [503, 429]})) as srv:
        gcp_env(srv)
        res = live_gcp.fetch_result(FetchQuery(sleep=delays.append))
        sku_reqs = [r for r in srv.requests if "/skus" in r]
        keys = {h.get("x-goog-api-key") for r, h in zip(srv.requests, srv.headers) if "/skus" in r}
    assert res.pages == 3 and res.skus_seen == 3 + len(CONSTRUCTED)
    assert len(sku_reqs) == 5 and sum(parse_qs(urlparse(r).query).get("pageToken") == [TOKEN] for r in sku_reqs) == 3   # 503, 429, 200
    assert keys == {"test-key"}
    assert len(delays) == 2 and delays[1] > delays[0] * 0.9                               # backoff grows
    by = {(o.zone, o.market, o.instance_type): o for o in res.offers}
    for z in ("us-central1-a", "us-central1-b"):
        od = by[(z, Market.ON_DEMAND, "a2-highgpu-1g")]
        assert od.usd_per_hour == pytest.approx(3.673385, abs=1e-6) == pytest.approx(A2_1G_US_CENTRAL1)
        assert (od.accelerator, od.accelerator_count, od.vcpus, od.memory_gib) == ("A100", 1, 12.0, 85.0)
        # the Spot SKU wins over the legacy preemptible one; DWS / calendar / sole tenancy never used
        assert by[(z, Market.SPOT, "a2-highgpu-1g")].usd_per_hour == pytest.approx(12 * 0.01 + 85 * 0.0013 + 1.2)
    assert by[("", Market.RESERVED_1Y, "a2-highgpu-1g")].usd_per_hour == pytest.approx(12 * 0.02 + 85 * 0.0027 + 1.8)
    r3 = by[("", Market.RESERVED_3Y, "a2-highgpu-1g")]
    assert r3.usd_per_hour == pytest.approx(12 * 0.014 + 85 * 0.0019 + 1.0) and r3.payment_option == "no-upfront"
    assert len(res.offers) == 2 * 2 + 2       # 2 zones x (on-demand, spot) + reserved 1y/3y per region
    assert {o.region for o in res.offers} == {"us-central1"}
    assert not any(o.instance_type.startswith("n1") for o in res.offers)
    # no SKUs for europe-west4 or A3 in the fake: skipped and counted, never guessed
    assert any(k.startswith("a2-highgpu-1g europe-west4 on-demand") for k in res.skipped)
    assert any(k.startswith("a3-highgpu-8g us-central1 on-demand: no core/ram/gpu") for k in res.skipped)


def test_cli_refresh_gcp_then_prices_use_cache(gcp_env, capsys, _isolated_home):
    with FakeServer(Fake()) as srv:
        gcp_env(srv)
        assert main(["catalog", "refresh", "--cloud", "gcp", "--format", "json"]) == 0
    (res,) = json.loads(capsys.readouterr().out)
    assert res["cloud"] == "gcp" and res["rows_fetched"] == 6
    assert main(["prices", "--gpu", "A100", "--cloud", "gcp", "--region", "us-central1", "--market", "on-demand",
                 "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and {r["source"] for r in rows} == {live_gcp.SOURCE}
    assert rows[0]["usd_per_hour"] == pytest.approx(3.673385, abs=1e-6)


def test_failing_page_keeps_previous_cache(gcp_env, capsys, _isolated_home):
    cache = _isolated_home / "prices" / "gcp.csv"
    cache.parent.mkdir(parents=True)
    cache.write_text("previous\n")
    with FakeServer(Fake(fail={"page-3": [500] * 10})) as srv:
        gcp_env(srv)
        with pytest.raises(FetchError, match="page 3 still failing after 2 attempts.*previous cache is kept"):
            live_gcp.fetch(FetchQuery(sleep=lambda s: None, attempts=2))
    assert cache.read_text() == "previous\n"


def test_invalid_api_key_and_missing_credentials_are_clear(gcp_env, monkeypatch, tmp_path, capsys):
    with FakeServer(Fake(sku_status=400)) as srv:
        gcp_env(srv)
        with pytest.raises(FetchError, match="API key not valid.*SPOTWISE_GCP_API_KEY"):
            live_gcp.fetch(FetchQuery(sleep=lambda s: None))
    for var in ("SPOTWISE_GCP_ANONYMOUS", "SPOTWISE_GCP_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    assert main(["catalog", "refresh", "--cloud", "gcp"]) != 0
    err = capsys.readouterr().err
    assert "GCP prices need credentials" in err and "SPOTWISE_GCP_API_KEY" in err and "Traceback" not in err

"""``spotwise catalog info|refresh`` through the CLI entry point (Azure against a local HTTP fake)."""

from __future__ import annotations

import json
from pathlib import Path

from spotwise.cli import main

from .fakehttp import FakeServer

PAYLOAD = json.loads((Path(__file__).parent / "fixtures" / "azure_retail_prices.json").read_text())["response"]


def test_info_on_snapshot(capsys):
    assert main(["catalog", "info", "--format", "json"]) == 0
    rows = {r["cloud"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"aws", "azure", "gcp"}
    for r in rows.values():
        assert r["source"] == "snapshot" and r["rows"] > 100 and r["integrity_new"] == []
        assert r["as_of_min"] <= r["as_of_max"]


def test_refresh_azure_then_info_shows_cache(monkeypatch, capsys, _isolated_home):
    with FakeServer(lambda path: (200, PAYLOAD)) as srv:
        monkeypatch.setenv("SPOTWISE_AZURE_PRICES_ENDPOINT", srv.url)
        assert main(["catalog", "refresh", "--cloud", "azure", "--region", "eastus", "--format", "json"]) == 0
    (res,) = json.loads(capsys.readouterr().out)
    assert res["cloud"] == "azure" and res["rows_fetched"] == 5
    assert (_isolated_home / "prices" / "azure.csv").is_file()
    assert main(["catalog", "info", "--format", "json"]) == 0
    rows = {r["cloud"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["azure"]["source"] == "cache" and rows["azure"]["cache_age_hours"] >= 0
    assert "azure:retail-prices-api" in rows["azure"]["sources"]
    assert main(["prices", "--gpu", "H100:8", "--cloud", "azure", "--region", "eastus", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out and all(r["source"] == "azure:retail-prices-api" for r in out)


def test_refresh_bad_cloud_exit_2(capsys):
    assert main(["catalog", "refresh", "--cloud", "oracle"]) == 2
    assert "--cloud" in capsys.readouterr().err

"""Azure fetcher against a local HTTP fake serving the real Retail Prices payload."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from spotwise.pricing.catalog import Catalog
from spotwise.pricing.live import FetchError, FetchQuery
from spotwise.pricing.live import azure as live_azure
from spotwise.pricing.live.cache import write_cloud_cache
from spotwise.pricing.offer import Market

from .fakehttp import FakeServer

PAYLOAD = json.loads((Path(__file__).parent / "fixtures" / "azure_retail_prices.json").read_text())["response"]


def _paged(server_url_holder, fail_first: int = 0):
    items = PAYLOAD["Items"]
    calls = {"n": 0}

    def handler(path: str):
        calls["n"] += 1
        if calls["n"] <= fail_first:
            return 503, {"error": "busy"}
        q = parse_qs(urlparse(path).query)
        if q.get("page") == ["2"]:
            return 200, dict(PAYLOAD, Items=items[5:], NextPageLink=None)
        if "armRegionName eq 'eastus'" not in q.get("$filter", [""])[0]:
            return 400, {"error": "bad filter"}
        return 200, dict(PAYLOAD, Items=items[:5], NextPageLink=f"{server_url_holder[0]}/p?page=2")
    return handler


def test_parse_real_page_classifies_markets():
    facts = live_azure.known_facts()
    offers = live_azure.parse_items(PAYLOAD["Items"], facts, "2026-07-27")
    got = {(o.instance_type, o.market, o.payment_option): o.usd_per_hour for o in offers}
    assert got == {
        ("Standard_ND96isr_H100_v5", Market.ON_DEMAND, None): 98.32,
        ("Standard_ND96isr_H100_v5", Market.RESERVED_1Y, "upfront-or-monthly"): pytest.approx(551221 / 8760, abs=1e-5),
        ("Standard_ND96isr_H100_v5", Market.RESERVED_3Y, "upfront-or-monthly"): pytest.approx(1134310 / 26280, abs=1e-5),
        ("Standard_ND96asr_v4", Market.SPOT, None): 5.98334,          # Linux Spot meter
        ("Standard_ND96is_H100_v5", Market.ON_DEMAND, None): 88.488,
    }   # Windows, Low Priority and DevTest rows are all skipped
    assert all(o.zone == "" and o.accelerator_count == 8 for o in offers)


def test_fetch_follows_next_page_link_retries_and_writes_cache(monkeypatch, _isolated_home):
    holder = [""]
    with FakeServer(_paged(holder, fail_first=1)) as srv:
        holder[0] = srv.url
        monkeypatch.setenv("SPOTWISE_AZURE_PRICES_ENDPOINT", srv.url + "/api/retail/prices")
        offers = live_azure.fetch(FetchQuery(regions=("eastus",), sleep=lambda s: None))
        assert len(srv.requests) == 3          # one 503 retried, then two pages
    assert len(offers) == 5
    write_cloud_cache("azure", offers, source="azure live", regions=["eastus"])
    got = Catalog.load().find_offers({"H100": 8}, clouds="azure", regions="eastus", market="reserved-3y")
    assert [round(o.usd_per_hour, 3) for o in got] == [43.162]


def test_failing_page_keeps_previous_cache(monkeypatch, _isolated_home):
    cache = _isolated_home / "prices" / "azure.csv"
    cache.parent.mkdir(parents=True)
    cache.write_text("previous\n")
    with FakeServer(lambda path: (500, {"error": "boom"})) as srv:
        monkeypatch.setenv("SPOTWISE_AZURE_PRICES_ENDPOINT", srv.url)
        with pytest.raises(FetchError, match="still failing after 5 attempts"):
            live_azure.fetch(FetchQuery(regions=("eastus",), sleep=lambda s: None))
    assert cache.read_text() == "previous\n"

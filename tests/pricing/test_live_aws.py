"""AWS fetcher: real boto3 clients — moto for EC2, botocore Stubber with the real payload shapes
for the Price List API (moto has none)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import boto3
import pytest
from botocore.stub import ANY, Stubber
from moto import mock_aws

from spotwise.pricing.catalog import Catalog
from spotwise.pricing.live import FetchError, FetchQuery
from spotwise.pricing.live import aws as live_aws
from spotwise.pricing.live.cache import write_cloud_cache
from spotwise.pricing.offer import Market

FIX = json.loads((Path(__file__).parent / "fixtures" / "aws_pricing_get_products.json").read_text())
SPOT = json.loads((Path(__file__).parent / "fixtures" / "aws_describe_spot_price_history.json").read_text())


@pytest.fixture
def aws_env(monkeypatch):
    for k, v in dict(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                     AWS_DEFAULT_REGION="us-east-1").items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def _gpu_item(instance_type: str, usd: str) -> str:
    """The real c5.xlarge price-list item re-keyed to a GPU type with its observed 2026 price."""
    item = copy.deepcopy(FIX["ec2_price_list_item_decoded"])
    item["product"]["attributes"]["instanceType"] = instance_type
    (term,) = item["terms"]["OnDemand"].values()
    (dim,) = term["priceDimensions"].values()
    dim["pricePerUnit"]["USD"] = usd
    return json.dumps(item)


def test_parse_real_item_on_demand_and_all_twelve_reserved_terms():
    parsed = live_aws.parse_price_list(FIX["ec2_price_list_response_shape"]["PriceList"])
    rows = parsed["c5.xlarge"]
    od = [r for r in rows if r[0] == "on-demand"]
    res = [r for r in rows if r[0].startswith("reserved")]
    assert od == [("on-demand", None, 0.17)]
    assert len(res) == 12
    assert {r[1] for r in res} >= {"standard-all-upfront", "convertible-no-upfront", "standard-partial-upfront"}
    # 3yr standard partial upfront: 867 upfront + 0.033/h -> 867/26280 + 0.033
    assert ("reserved-3y", "standard-partial-upfront", pytest.approx(867 / 26280 + 0.033, abs=1e-6)) in res
    assert all(r[2] < 0.17 for r in res)


def test_capacity_block_twin_is_skipped():
    item = json.loads(_gpu_item("p5.48xlarge", "0.0"))
    item["product"]["attributes"]["marketoption"] = "CapacityBlock"
    assert live_aws.parse_price_list([json.dumps(item)]) == {}


def test_spot_is_newest_per_az_never_regional_minimum():
    base = SPOT["official_example"]["output"]["SpotPriceHistory"]
    rows = [dict(base[0], SpotPrice="0.090000", Timestamp="2014-01-06T05:00:00.000Z"),  # newer, dearer
            dict(base[0]),                                                              # older 0.08
            dict(base[1], SpotPrice="0.010000", Timestamp="2014-01-01T00:00:00.000Z"),  # older, cheaper
            dict(base[1]),
            dict(base[1], ProductDescription="Windows", SpotPrice="0.001")]
    got = live_aws.current_spot_prices(rows, {"us-west-1a": "usw1-az1", "us-west-1c": "usw1-az3"})
    assert got[("m1.xlarge", "usw1-az1")][0] == 0.09
    assert got[("m1.xlarge", "usw1-az3")][0] == 0.08


def _stubbed_pricing(region_items: dict[str, list[str]]):
    client = boto3.client("pricing", region_name="us-east-1")
    stub = Stubber(client)
    for region, items in region_items.items():
        half = len(items) // 2 or 1
        stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": items[:half], "NextToken": "p2"},
                          {"ServiceCode": "AmazonEC2", "FormatVersion": "aws_v1", "Filters": ANY, "MaxResults": 100})
        stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": items[half:]},
                          {"ServiceCode": "AmazonEC2", "FormatVersion": "aws_v1", "Filters": ANY,
                           "MaxResults": 100, "NextToken": "p2"})
    stub.activate()
    return client, stub


def test_fetch_end_to_end_with_moto_ec2_and_stubbed_pricing_writes_cache(aws_env, _isolated_home):
    items = [_gpu_item("p5.48xlarge", "55.0400000000"), _gpu_item("p4d.24xlarge", "21.9576420000")]
    pricing, stub = _stubbed_pricing({"us-east-1": items})
    with mock_aws():
        def factory(service, region):
            return pricing if service == "pricing" else boto3.client(service, region_name=region)
        query = FetchQuery(regions=("us-east-1",), instance_types=("p5.48xlarge", "p4d.24xlarge", "c5.xlarge"),
                           client_factory=factory)
        offers = live_aws.fetch(query)
    stub.assert_no_pending_responses()
    by = {(o.instance_type, o.market, o.payment_option, o.zone): o for o in offers}
    od = [o for o in offers if o.instance_type == "p5.48xlarge" and o.market is Market.ON_DEMAND]
    assert od and all(o.usd_per_hour == 55.04 and o.zone.startswith("use1-az") for o in od)
    assert {o.accelerator for o in offers} == {"H100", "A100"}          # c5.xlarge has no GPU: dropped
    p5 = od[0]
    assert (p5.accelerator_count, p5.gpu_memory_gib, p5.vcpus) == (8, 80.0, 192.0)
    spot = [o for o in offers if o.market is Market.SPOT]
    assert spot and all(o.zone.startswith("use1-az") for o in spot)
    assert len({(o.instance_type, o.zone) for o in spot}) == len(spot)   # one per AZ
    res = [o for o in offers if o.market is Market.RESERVED_3Y and o.instance_type == "p5.48xlarge"]
    assert len(res) == 6 and all(o.zone == "" and o.payment_option for o in res)
    assert ("p5.48xlarge", Market.ON_DEMAND, None, p5.zone) in by

    meta = write_cloud_cache("aws", offers, source="aws live", regions=["us-east-1"])
    assert meta["rows"] == len(offers)
    cat = Catalog.load()
    east = cat.find_offers({"H100": 8}, clouds="aws", regions="us-east-1", market="on-demand")
    assert east and all(o.source == "aws:pricing.get_products" for o in east)
    assert cat.find_offers({"H100": 8}, clouds="aws", regions="us-west-2")   # snapshot still answers


def test_missing_credentials_is_a_clear_error_and_cache_survives(monkeypatch, _isolated_home, tmp_path):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")   # never reach a real endpoint
    cache = _isolated_home / "prices" / "aws.csv"
    cache.parent.mkdir(parents=True)
    cache.write_text("previous\n")
    with pytest.raises(FetchError, match="credentials"):
        live_aws.fetch(FetchQuery(regions=("us-east-1",), instance_types=("p5.48xlarge",)))
    assert cache.read_text() == "previous\n"


def test_throttling_is_retried_with_backoff_then_reported(aws_env):
    pricing = boto3.client("pricing", region_name="us-east-1")
    stub = Stubber(pricing)
    for _ in range(5):
        stub.add_client_error("get_products", service_error_code="ThrottlingException", http_status_code=400)
    stub.activate()
    slept = []
    with mock_aws():
        def factory(service, region):
            return pricing if service == "pricing" else boto3.client(service, region_name=region)
        with pytest.raises(FetchError, match="after 5 attempts"):
            live_aws.fetch(FetchQuery(regions=("us-east-1",), instance_types=("p5.48xlarge",), client_factory=factory,
                                      sleep=slept.append))
    assert len(slept) == 4 and slept[0] < slept[-1]

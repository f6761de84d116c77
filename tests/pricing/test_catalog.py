"""Catalog.find_offers on the shipped snapshot and on small hand-made catalogs."""

from __future__ import annotations

import pytest

from spotwise.errors import InputError
from spotwise.pricing import Market, Offer, load_catalog
from spotwise.pricing.catalog import Catalog, find_offers
from spotwise.pricing.store import read_offers, write_offers


def _o(**kw) -> Offer:
    base = dict(cloud="aws", instance_type="p5.48xlarge", accelerator="H100", accelerator_count=8,
                region="us-east-1", zone="use1-az1", market=Market.SPOT, usd_per_hour=10.0,
                source="test", as_of="2026-01-01")
    base.update(kw)
    return Offer(**base)


def test_snapshot_h100x8_cheapest_first_and_well_formed():
    offers = find_offers({"H100": 8})
    assert len(offers) > 50
    prices = [o.usd_per_hour for o in offers]
    assert prices == sorted(prices)
    assert {o.cloud for o in offers} == {"aws", "gcp", "azure"}
    for o in offers:
        assert o.accelerator == "H100" and o.accelerator_count == 8
        assert o.market in (Market.SPOT, Market.ON_DEMAND)   # default: hourly markets only
        assert o.source and len(o.as_of) == 10
        assert o.usd_per_hour > 0


def test_alternatives_match_either_accelerator():
    offers = find_offers({"H100": 8, "A100-80GB": 8}, market="spot")
    accs = {o.accelerator for o in offers}
    assert accs == {"H100", "A100-80GB"}
    assert all(o.accelerator_count == 8 for o in offers)
    assert [o.usd_per_hour for o in offers] == sorted(o.usd_per_hour for o in offers)


def test_flagged_rows_excluded_by_default_but_available():
    default = find_offers({"H100": 8}, clouds=["azure"], market="spot")
    everything = find_offers({"H100": 8}, clouds=["azure"], market="spot", include_flagged=True)
    # Azure ND96isr_H100_v5 spot == on-demand in the source ("no spot price known"): flagged.
    flagged = [o for o in everything if "spot_ge_on_demand" in o.flags]
    assert flagged and not any("spot_ge_on_demand" in o.flags for o in default)


def test_gcp_on_demand_uses_list_price_not_understated_composed_price():
    (o,) = [o for o in find_offers({"H100": 8}, clouds="gcp", regions="us-central1", market="on-demand")
            if o.instance_type == "a3-highgpu-8g"][:1]
    # Cyclenerd full-VM list price (2026-08-20) is ~88.49/h; SkyPilot's composed value was 43.07.
    assert o.usd_per_hour > 80
    assert o.source.startswith("Cyclenerd") and o.as_of == "2026-08-20"


def test_filters_clouds_regions_zone_market_and_max_price_per_request():
    offers = find_offers({"H100": 8}, clouds="aws", regions=["us-east-1"], market=["spot", "on-demand"])
    assert offers and all(o.cloud == "aws" and o.region == "us-east-1" for o in offers)
    zone = offers[0].zone
    assert all(o.zone == zone for o in find_offers({"H100": 8}, regions=zone))
    cheapest = offers[0].usd_per_hour
    # max_price caps nodes x usd_per_hour
    two = find_offers({"H100": 8}, clouds="aws", regions="us-east-1", max_price=2 * cheapest, nodes=2)
    assert two and all(o.usd_per_hour * 2 <= 2 * cheapest + 1e-9 for o in two)
    assert find_offers({"H100": 8}, clouds="aws", regions="us-east-1", max_price=cheapest * 0.99) == []


def test_reserved_only_when_asked_and_carries_payment_option():
    assert not any(o.market.value.startswith("reserved") for o in find_offers({"H100": 8}))
    res = find_offers({"H100": 8}, market="reserved-3y")
    assert res and all(o.market is Market.RESERVED_3Y and o.payment_option for o in res)


@pytest.mark.parametrize("kwargs, field", [
    (dict(accelerators={"H900": 8}), "accelerators"),
    (dict(accelerators={"H100": 0}), "accelerators.H100"),
    (dict(accelerators={"H100": 8}, clouds=["oracle"]), "clouds"),
    (dict(accelerators={"H100": 8}, market="cheap"), "market"),
    (dict(accelerators={"H100": 8}, max_price=-1), "max_price"),
    (dict(accelerators={"H100": 8}, nodes=0), "nodes"),
    (dict(accelerators={}), "accelerators"),
])
def test_bad_arguments_raise_input_error_naming_the_field(kwargs, field):
    acc = kwargs.pop("accelerators")
    with pytest.raises(InputError) as e:
        find_offers(acc, **kwargs)
    assert e.value.problems[0].field == field
    assert "allowed" in str(e.value)


def test_ties_are_deterministic_and_ranking_is_by_request_price():
    cat = Catalog([_o(zone="b", usd_per_hour=5), _o(zone="a", usd_per_hour=5),
                   _o(zone="c", usd_per_hour=4, accelerator="A100-80GB", instance_type="p4de.24xlarge")])
    got = cat.find_offers({"H100": 8, "A100-80GB": 8})
    assert [o.zone for o in got] == ["c", "a", "b"]


def test_info_flags_do_not_exclude_blocking_flags_do():
    cat = Catalog([_o(zone="a", flags=("merged_duplicate_rows",)), _o(zone="b", flags=("spot_ge_on_demand",))])
    assert [o.zone for o in cat.find_offers({"H100": 8})] == ["a"]
    assert len(cat.find_offers({"H100": 8}, include_flagged=True)) == 2


def test_live_cache_replaces_snapshot_rows_of_the_regions_it_covers(_isolated_home):
    cached = [_o(region="us-east-1", zone="use1-az9", usd_per_hour=1.25, source="aws:test", as_of="2026-12-01")]
    write_offers(_isolated_home / "prices" / "aws.csv", cached)
    offers = find_offers({"H100": 8}, clouds="aws")
    east = [o for o in offers if o.region == "us-east-1"]
    assert [(o.zone, o.usd_per_hour, o.source) for o in east] == [("use1-az9", 1.25, "aws:test")]
    assert any(o.region != "us-east-1" for o in offers)        # other regions still from the snapshot
    assert offers[0].source == "aws:test"
    # the snapshot alone is still there when asked for
    snap = Catalog.load(use_cache=False).find_offers({"H100": 8}, clouds="aws", regions="us-east-1")
    assert all(o.source != "aws:test" for o in snap)


def test_store_roundtrip(tmp_path):
    offers = [_o(), _o(market=Market.RESERVED_1Y, zone="", payment_option="all-upfront", vcpus=192.0,
                    flags=("x", "y"))]
    write_offers(tmp_path / "o.csv", offers)
    assert read_offers(tmp_path / "o.csv") == offers


def test_load_catalog_dataframe():
    df = load_catalog()
    assert {"cloud", "instance_type", "accelerator", "usd_per_hour", "usd_per_gpu_hour", "market",
            "source", "as_of", "flags", "flagged"} <= set(df.columns)
    assert len(df) == len(Catalog.load(use_cache=False))
    assert df["flagged"].any() and not load_catalog(include_flagged=False)["flagged"].any()
    for acc in ("A100", "A100-80GB", "H100", "H200", "L4", "L40S", "A10G", "V100"):
        assert (df["accelerator"] == acc).any(), acc
    for market in ("on-demand", "spot", "reserved-1y", "reserved-3y"):
        assert (df["market"] == market).any(), market

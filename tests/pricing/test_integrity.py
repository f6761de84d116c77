"""Integrity checks: on the shipped data itself, and on hand-made bad rows."""

from __future__ import annotations

from dataclasses import replace

from spotwise.pricing import Market, Offer
from spotwise.pricing.catalog import Catalog
from spotwise.pricing.integrity import check_offers, flag_findings, price_jumps


def _o(**kw) -> Offer:
    base = dict(cloud="gcp", instance_type="a3-highgpu-8g", accelerator="H100", accelerator_count=8,
                region="us-central1", zone="us-central1-a", market=Market.ON_DEMAND, usd_per_hour=88.0,
                source="test", as_of="2026-01-01", gpu_memory_gib=80.0)
    base.update(kw)
    return Offer(**base)


def test_shipped_snapshot_has_no_unflagged_integrity_problem():
    offers = list(Catalog.load(use_cache=False))
    findings = check_offers(offers)
    new = [f for f in findings if not f.known]
    assert new == [], new[:5]
    # and the known ones really are there (the snapshot does contain stale spot quotes)
    assert any(f.check == "spot_ge_on_demand" for f in findings)


def test_every_check_fires_on_bad_rows():
    od = _o()
    rows = [
        od,
        _o(market=Market.SPOT, usd_per_hour=90.0),                                  # spot >= od
        _o(market=Market.RESERVED_1Y, zone="", usd_per_hour=95.0),                  # reserved >= od
        _o(instance_type="a3-highgpu-4g", accelerator_count=8, zone="b"),           # name says 4
        _o(instance_type="a2-highgpu-1g", accelerator="A100", accelerator_count=1, gpu_memory_gib=80.0),
        _o(zone="us-central1-b", usd_per_hour=0.0),                                 # price 0
    ]
    checks = {f.check for f in check_offers(rows)}
    assert checks == {"spot_ge_on_demand", "reserved_ge_on_demand", "gpu_fields_inconsistent",
                      "price_not_positive"}
    shape = [f for f in check_offers([od, _o(zone="z", accelerator_count=4)]) if f.check == "gpu_fields_inconsistent"]
    assert shape


def test_price_jump_over_30_percent_is_flagged_and_marked():
    before = [_o(), _o(zone="b")]
    after = [_o(usd_per_hour=88.0 * 1.29), _o(zone="b", usd_per_hour=88.0 * 1.31)]
    jumps = price_jumps(before, after)
    assert [f.key for f in jumps] == [after[1].key]
    marked = flag_findings(after, check_offers(after, previous=before))
    assert marked[0].flags == () and marked[1].flags == ("price_jump",)


def test_known_flag_is_reported_as_known():
    rows = [_o(), replace(_o(market=Market.SPOT, usd_per_hour=99.0), flags=("spot_ge_on_demand",))]
    (f,) = check_offers(rows)
    assert f.known

"""Price truth: no offer the catalog ranks may disagree with its current reference by > 10 %.

References: ``fixtures/current_reference_prices.csv`` (an extract of the shared price data, see
``fixtures/README.md``): the post-cut SkyPilot v8 AWS catalog, AWS's price list, Azure's Retail API
and Cyclenerd's GCP list. A reference with an empty zone applies to every zone of its region.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from spotwise.cli import main
from spotwise.pricing import Market, Offer
from spotwise.pricing.catalog import Catalog, STALE_FLAGS, find_offers

FIXTURE = Path(__file__).parent / "fixtures" / "current_reference_prices.csv"
TOLERANCE = 0.10


def references() -> dict[tuple, list[tuple[float, str]]]:
    out: dict[tuple, list[tuple[float, str]]] = {}
    with FIXTURE.open(newline="") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        for r in rows:
            key = (r["cloud"], r["instance_type"], r["region"], r["zone"], r["market"])
            out.setdefault(key, []).append((float(r["usd_per_hour"]), r["source"]))
    return out


def disagreements(offers, refs) -> list[str]:
    bad = []
    for o in offers:
        for key in ((o.cloud, o.instance_type, o.region, o.zone, o.market.value),
                    (o.cloud, o.instance_type, o.region, "", o.market.value)):
            for ref, src in refs.get(key, ()):
                if abs(o.usd_per_hour / ref - 1) > TOLERANCE:
                    bad.append(f"{o.key} {o.usd_per_hour} vs {ref} ({src})")
    return bad


def ranked(catalog: Catalog | None = None) -> list[Offer]:
    cat = catalog
    if cat is None:
        from spotwise.pricing.catalog import default_catalog

        cat = default_catalog()
    return cat.select(None, market=[m.value for m in Market])


def test_reference_fixture_is_substantial():
    refs = references()
    assert len(refs) > 200
    assert {k[0] for k in refs} == {"aws", "azure", "gcp"}


def test_no_ranked_offer_disagrees_with_its_current_reference():
    offers = ranked()
    refs = references()
    checked = sum(1 for o in offers if (o.cloud, o.instance_type, o.region, o.zone, o.market.value) in refs
                  or (o.cloud, o.instance_type, o.region, "", o.market.value) in refs)
    assert checked > 300          # the check covers the rows that matter, not a handful
    assert disagreements(offers, refs) == []


def test_the_check_fails_on_a_pre_cut_price():
    # The rows the audit found: p5 us-west-2 on-demand at the pre-cut 98.32, p4d use1-az6 spot 5.09.
    stale = [Offer(cloud="aws", instance_type="p5.48xlarge", accelerator="H100", accelerator_count=8,
                   region="us-west-2", zone="usw2-az1", market=Market.ON_DEMAND, usd_per_hour=98.32,
                   source="v7", as_of="2025-05-31"),
             Offer(cloud="aws", instance_type="p4d.24xlarge", accelerator="A100", accelerator_count=8,
                   region="us-east-1", zone="use1-az6", market=Market.SPOT, usd_per_hour=5.09,
                   source="v7", as_of="2025-05-31")]
    bad = disagreements(ranked(Catalog(stale)), references())
    assert len(bad) == 2


def test_audited_rows_now_carry_current_prices():
    (p5,) = [o for o in find_offers({"H100": 8}, clouds="aws", regions="us-west-2", market="on-demand")][:1]
    assert p5.usd_per_hour == pytest.approx(55.04)
    assert p5.as_of_kind == "lower_bound" and "v8" in p5.source
    east = find_offers({"H100": 8}, clouds="aws", regions="us-east-1", market="on-demand")
    assert east and all(o.as_of == "2026-07-28" and o.as_of_kind == "exact" for o in east)
    p4d = [o for o in find_offers({"A100": 8}, clouds="aws", market="spot") if o.zone == "use1-az6"]
    assert p4d and all(o.usd_per_hour > 10 for o in p4d)        # v8: 12.50, not the pre-cut 5.09
    # no ranked AWS row comes from the pre-cut v7 catalog
    assert not [o for o in ranked() if o.cloud == "aws" and "v7" in o.source]


def test_stale_rows_are_not_ranked_but_can_be_shown():
    spot = find_offers({"A100": 8}, clouds="azure", market="spot")
    # ND96asr_v4: only eastus has a current spot price (5.98, 2026-07-27); westus2's 2024 $2.99 is stale
    assert [(o.region, o.usd_per_hour) for o in spot] == [("eastus", pytest.approx(5.98334))]
    assert not find_offers({"A100": 8}, clouds="azure", regions="westus2", market="spot")
    with_stale = find_offers({"A100": 8}, clouds="azure", market="spot", include_stale=True)
    assert [o for o in with_stale if o.region == "westus2" and "stale_spot_2024" in o.flags]
    assert all(set(o.flags) & STALE_FLAGS for o in with_stale if o.region != "eastus")
    amsr = find_offers({"A100-80GB": 8}, clouds="azure", regions="eastus", market="spot", include_stale=True)
    assert amsr and all("stale_spot_2024" in o.flags for o in amsr)   # $3.60 vs $6.55 low-priority


def test_single_source_deep_spot_discount_is_not_ranked():
    offers = find_offers({"H100": 8})
    assert not [o for o in offers if o.region == "europe-north1" and o.market is Market.SPOT]
    assert offers[0].usd_per_hour > 10        # the $9.14 row no longer leads
    flagged = find_offers({"H100": 8}, regions="europe-north1", market="spot", include_flagged=True)
    assert flagged and all("spot_unconfirmed_low" in o.flags for o in flagged)


def test_as_of_kind_marked_in_json_and_table(capsys):
    import json

    assert main(["prices", "--gpu", "H100:8", "--cloud", "aws", "--format", "json", "--limit", "5"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["as_of_kind"] in ("exact", "upper_bound", "lower_bound", "approximate") for r in rows)
    assert main(["prices", "--gpu", "H100:8", "--cloud", "aws", "--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert "≥2025-06-01" in out and "skypilot v8" in out


def test_catalog_info_sources_are_unique_untruncated_and_dated(capsys):
    import json

    assert main(["catalog", "info", "--format", "json"]) == 0
    rows = {r["cloud"]: r for r in json.loads(capsys.readouterr().out)}
    for r in rows.values():
        srcs = r["sources"]
        assert len(srcs) == len(set(srcs))
        # one spelling per repository file: no source is a prefix of another
        assert not [a for a in srcs for b in srcs if a != b and b.startswith(a)]
        assert all(d["as_of_kinds"] for d in r["source_detail"])
    assert rows["aws"]["stale_rows"] == 5 and rows["aws"]["notes"]
    assert rows["azure"]["stale_rows"] > 50

"""Azure live prices from the Retail Prices REST API (no authentication).

``GET {endpoint}?api-version=2023-01-01-preview&$filter=serviceName eq 'Virtual Machines' and
armRegionName eq '<region>' and (armSkuName eq '<size>' or …)``, following ``NextPageLink`` until
it is null. Endpoint: ``$SPOTWISE_AZURE_PRICES_ENDPOINT`` or the public one.

Rows are Linux only (``productName`` ending in `` Windows`` is skipped) and:

* ``type == Consumption`` with `` Spot`` in meter/sku name -> ``spot``;
  `` Low Priority`` (the retired Batch/VMSS tier) is skipped; any other Consumption -> ``on-demand``;
* ``type == Reservation`` -> ``reserved-1y``/``reserved-3y``; ``retailPrice`` is the **term total**,
  so the hourly rate is price / (8760 h × years); ``payment_option`` ``upfront-or-monthly`` (Azure
  charges the same total either way);
* ``DevTestConsumption`` is skipped (needs a Dev/Test subscription).

Azure prices per region, so ``zone`` is empty. The API has no VM facts; GPU fields come from the
snapshot's rows for the same size (plus :data:`EXTRA_FACTS`); unknown sizes are dropped.
"""

from __future__ import annotations

import urllib.parse
from datetime import datetime, timezone
from typing import Iterable

from spotwise.config import setting
from spotwise.pricing.live import FetchQuery, register_fetcher
from spotwise.pricing.live.http import get_json
from spotwise.pricing.offer import Market, Offer

DEFAULT_ENDPOINT = "https://prices.azure.com/api/retail/prices"
API_VERSION = "2023-01-01-preview"
HOURS_PER_YEAR = 8760

#: GPU sizes that the snapshot lacks: (accelerator, count, gpu GiB, vCPUs, memory GiB), Microsoft docs.
EXTRA_FACTS = {
    "Standard_ND96is_H100_v5": ("H100", 8, 80.0, 96.0, 1900.0),
    "Standard_ND96isr_H200_v5": ("H200", 8, 141.0, 96.0, 1850.0),
}


def endpoint() -> str:
    return setting("SPOTWISE_AZURE_PRICES_ENDPOINT") or DEFAULT_ENDPOINT


def known_facts() -> dict[str, dict]:
    from spotwise.pricing.catalog import Catalog

    out = {k: dict(zip(("accelerator", "accelerator_count", "gpu_memory_gib", "vcpus", "memory_gib"), v))
           for k, v in EXTRA_FACTS.items()}
    for o in Catalog.load(use_cache=False):
        if o.cloud == "azure":
            out[o.instance_type] = dict(accelerator=o.accelerator, accelerator_count=o.accelerator_count,
                                        gpu_memory_gib=o.gpu_memory_gib, vcpus=o.vcpus, memory_gib=o.memory_gib)
    return out


def default_regions() -> list[str]:
    from spotwise.pricing.catalog import Catalog

    return sorted({o.region for o in Catalog.load(use_cache=False) if o.cloud == "azure"})


def classify(item: dict) -> tuple[Market, str | None, float] | None:
    """One Retail Prices item -> (market, payment_option, usd per hour), or None to skip it."""
    if item.get("productName", "").endswith(" Windows"):
        return None
    names = f"{item.get('meterName', '')} {item.get('skuName', '')}"
    kind = item.get("type")
    price = float(item.get("retailPrice") or item.get("unitPrice") or 0)
    if price <= 0 or item.get("currencyCode", "USD") != "USD":
        return None
    if "Low Priority" in names:
        return None
    if kind == "Consumption":
        return (Market.SPOT if " Spot" in names else Market.ON_DEMAND, None, price)
    if kind == "Reservation":
        term = item.get("reservationTerm", "")
        years = 1 if term.startswith("1 ") else 3 if term.startswith("3 ") else None
        if years is None:
            return None
        market = Market.RESERVED_1Y if years == 1 else Market.RESERVED_3Y
        return (market, "upfront-or-monthly", round(price / (HOURS_PER_YEAR * years), 6))
    return None


def parse_items(items: Iterable[dict], facts: dict[str, dict], as_of: str) -> list[Offer]:
    out = []
    for it in items:
        size = it.get("armSkuName", "")
        got = classify(it)
        if got is None or size not in facts:
            continue
        market, option, usd = got
        out.append(Offer(cloud="azure", instance_type=size, region=it["armRegionName"], zone="", market=market,
                         usd_per_hour=usd, payment_option=option, source="azure:retail-prices-api",
                         as_of=as_of, **facts[size]))
    return out


def region_url(region: str, sizes: list[str]) -> str:
    sku = " or ".join(f"armSkuName eq '{s}'" for s in sizes)
    flt = f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and ({sku})"
    return f"{endpoint()}?api-version={API_VERSION}&" + urllib.parse.urlencode({"$filter": flt}, quote_via=urllib.parse.quote)


@register_fetcher("azure", default_regions=default_regions)
def fetch(query: FetchQuery) -> list[Offer]:
    """Azure offers for ``query.regions`` (default: the snapshot's) and VM sizes
    ``query.instance_types`` (default: every GPU size with known facts), page by page."""
    facts = known_facts()
    sizes = sorted(query.instance_types or facts)
    as_of = datetime.now(timezone.utc).date().isoformat()
    offers: list[Offer] = []
    for region in query.regions or default_regions():
        query.say(f"azure {region}")
        url: str | None = region_url(region, sizes)
        page = 0
        while url:
            page += 1
            body = get_json(url, what=f"Azure Retail Prices {region} page {page}", sleep=query.sleep,
                            attempts=query.attempts)
            offers.extend(parse_items(body.get("Items", []), facts, as_of))
            url = body.get("NextPageLink")
    return offers

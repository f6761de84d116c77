"""AWS live prices through boto3.

* On-demand and reserved: Price List Query API ``pricing.get_products`` (endpoint region
  us-east-1), filtered to Linux / Shared tenancy / no pre-installed software / capacitystatus
  Used / no license, one ``ANY_OF`` filter for the GPU instance types. Items whose
  ``marketoption`` is not ``OnDemand`` (the $0 CapacityBlock twin of each SKU) are skipped.
  Reserved terms become ``reserved-1y``/``reserved-3y`` offers, one per offering class ×
  purchase option (``payment_option`` e.g. ``standard-all-upfront``), priced at the effective
  hourly rate upfront / (8760 h × years) + hourly. Savings Plans are not in this API.
* Spot: ``ec2.describe_spot_price_history`` with StartTime = EndTime = now, which returns the
  price in force now for each AZ; the newest row per (type, AZ) is kept — one offer per AZ,
  never a regional minimum. Zones are AZ **IDs** (``use1-az1``), which name the same place in every
  account (AZ names do not), mapped with ``describe_availability_zones``.
* Instance facts (GPU model, count, GPU memory, vCPUs, memory) from ``describe_instance_types``;
  on-demand rows are written for each AZ that offers the type (``describe_instance_type_offerings``).

Endpoints follow boto3's own configuration (``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_EC2`` …).
Throttling and 5xx are retried with backoff (botocore's standard mode, then ours per page).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

from spotwise.extras import MissingExtra, require
from spotwise.pricing.live import FetchError, FetchQuery, register_fetcher
from spotwise.pricing.live.retry import with_retries
from spotwise.pricing.offer import Market, Offer

PRICING_REGION = "us-east-1"
HOURS_PER_YEAR = 8760
_RETRY_CODES = {"Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException",
                "ServiceUnavailable", "InternalError", "InternalFailure", "RequestTimeout"}


def default_instance_types() -> list[str]:
    from spotwise.pricing.catalog import Catalog

    return sorted({o.instance_type for o in Catalog.load(use_cache=False) if o.cloud == "aws"})


def default_regions() -> list[str]:
    from spotwise.pricing.catalog import Catalog

    return sorted({o.region for o in Catalog.load(use_cache=False) if o.cloud == "aws"})


def _retryable(e: BaseException) -> bool:
    exc = require("botocore.exceptions", "aws", "AWS live prices")
    ClientError, BotoConnectionError = exc.ClientError, exc.ConnectionError

    if isinstance(e, ClientError):
        code = e.response.get("Error", {}).get("Code", "")
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return code in _RETRY_CODES or status >= 500
    return isinstance(e, BotoConnectionError)


def _translate(e: BaseException, what: str) -> FetchError:
    exc = require("botocore.exceptions", "aws", "AWS live prices")
    ClientError = exc.ClientError
    if isinstance(e, (exc.NoCredentialsError, exc.PartialCredentialsError)):
        return FetchError("AWS credentials not found: set AWS_PROFILE or AWS_ACCESS_KEY_ID/"
                          "AWS_SECRET_ACCESS_KEY (the Price List API needs pricing:GetProducts, "
                          "spot prices need ec2:DescribeSpotPriceHistory); the previous cache is kept")
    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        return FetchError(f"AWS {what} failed: {err.get('Code')}: {err.get('Message')}; the previous cache is kept")
    if isinstance(e, FetchError):
        return e
    return FetchError(f"AWS {what} failed: {e}; the previous cache is kept")


def _paged(call: Callable[..., dict], key: str, token_in: str, token_out: str, what: str,
           sleep: Callable[[float], None], attempts: int = 5, **kwargs: Any) -> list:
    """Every item of ``key`` across pages; each page retried on throttling/5xx."""
    items: list = []
    token = None
    while True:
        args = dict(kwargs)
        if token:
            args[token_in] = token
        page = with_retries(lambda: call(**args), retryable=_retryable, what=what, sleep=sleep, attempts=attempts)
        items.extend(page.get(key, []))
        token = page.get(token_out)
        if not token:
            return items


# ----------------------------------------------------------------------------- parsing (pure)

def canonical_gpu(name: str, memory_mib: int | None) -> str:
    """EC2 GpuInfo name + memory -> our accelerator name (A100 80 GB -> A100-80GB, V100 32 GB -> V100-32GB)."""
    gib = (memory_mib or 0) / 1024
    if name == "A100" and gib > 60:
        return "A100-80GB"
    if name == "V100" and gib > 24:
        return "V100-32GB"
    return name


def instance_facts(types: Iterable[dict]) -> dict[str, dict]:
    """``describe_instance_types`` items -> {type: accelerator, count, gpu_memory_gib, vcpus, memory_gib}."""
    out = {}
    for t in types:
        gpus = (t.get("GpuInfo") or {}).get("Gpus") or []
        if not gpus:
            continue
        g = gpus[0]
        mem_mib = (g.get("MemoryInfo") or {}).get("SizeInMiB")
        acc = canonical_gpu(g["Name"], mem_mib)
        out[t["InstanceType"]] = dict(
            accelerator=acc, accelerator_count=int(sum(x.get("Count", 0) for x in gpus)),
            gpu_memory_gib=float(round(mem_mib / 1024)) if mem_mib else None,
            vcpus=float(t["VCpuInfo"]["DefaultVCpus"]),
            memory_gib=round(t["MemoryInfo"]["SizeInMiB"] / 1024, 3))
    return out


def parse_price_list(items: Iterable[str | dict]) -> dict[str, list[tuple[str, str | None, float]]]:
    """``get_products`` PriceList -> {instance type: [(market, payment_option, usd/h), ...]}.

    Skips non-OnDemand market options (CapacityBlock) and zero/absent prices.
    """
    out: dict[str, list] = {}
    for raw in items:
        item = json.loads(raw) if isinstance(raw, str) else raw
        attrs = item.get("product", {}).get("attributes", {})
        itype = attrs.get("instanceType")
        if not itype or attrs.get("marketoption", "OnDemand") != "OnDemand":
            continue
        if attrs.get("capacitystatus", "Used") != "Used" or attrs.get("tenancy", "Shared") != "Shared":
            continue
        rows = out.setdefault(itype, [])
        for term in item.get("terms", {}).get("OnDemand", {}).values():
            for dim in term.get("priceDimensions", {}).values():
                if dim.get("unit") == "Hrs":
                    usd = float(dim["pricePerUnit"]["USD"])
                    if usd > 0:
                        rows.append((Market.ON_DEMAND.value, None, usd))
        for term in item.get("terms", {}).get("Reserved", {}).values():
            ta = term.get("termAttributes", {})
            years = {"1yr": 1, "3yr": 3}.get(ta.get("LeaseContractLength", ""))
            if years is None:
                continue
            upfront = hourly = 0.0
            for dim in term.get("priceDimensions", {}).values():
                usd = float(dim["pricePerUnit"]["USD"])
                if dim.get("unit") == "Quantity":
                    upfront += usd
                elif dim.get("unit") == "Hrs":
                    hourly += usd
            eff = upfront / (HOURS_PER_YEAR * years) + hourly
            if eff <= 0:
                continue
            option = "-".join([ta.get("OfferingClass", "standard"),
                               ta.get("PurchaseOption", "").lower().replace(" ", "-")])
            rows.append((f"reserved-{years}y", option, round(eff, 6)))
    return out


def current_spot_prices(history: Iterable[dict], zone_ids: dict[str, str]) -> dict[tuple[str, str], tuple[float, str]]:
    """Spot history rows -> {(type, AZ id): (usd/h, timestamp)}: the NEWEST row per AZ (never the min).

    Only Linux/UNIX descriptions count (VPC or not). ``zone_ids`` maps AZ names to AZ IDs.
    """
    best: dict[tuple[str, str], tuple[float, str, object]] = {}
    for r in history:
        if not str(r.get("ProductDescription", "")).startswith("Linux/UNIX"):
            continue
        zone = r.get("AvailabilityZoneId") or zone_ids.get(r["AvailabilityZone"], r["AvailabilityZone"])
        ts = r.get("Timestamp")
        key = (r["InstanceType"], zone)
        cur = best.get(key)
        if cur is None or _ts(ts) > _ts(cur[2]):
            best[key] = (float(r["SpotPrice"]), str(ts), ts)
    return {k: (v[0], v[1]) for k, v in best.items()}


def _ts(ts) -> float:
    if isinstance(ts, datetime):
        return ts.timestamp()
    if isinstance(ts, str):
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    return 0.0


# ----------------------------------------------------------------------------- fetching

def _default_client_factory() -> Callable[[str, str], Any]:
    """boto3 clients from the default session, botocore's standard retry mode (4 attempts)."""
    boto3 = require("boto3", "aws", "AWS live prices")
    config = require("botocore.config", "aws", "AWS live prices").Config(
        retries={"max_attempts": 4, "mode": "standard"})
    session = boto3.session.Session()

    def factory(service: str, region: str) -> Any:
        return session.client(service, region_name=region, config=config)

    return factory


@register_fetcher("aws", default_regions=default_regions)
def fetch(query: FetchQuery) -> list[Offer]:
    """All AWS offers (on-demand per AZ, spot per AZ, reserved per region) for ``query.regions``
    (default: the snapshot's), GPU types ``query.instance_types`` (default: the snapshot's).

    ``query.client_factory(service, region)`` builds the boto3 clients (default: the default
    session's); tests pass one that returns a Stubber-backed pricing client. Any failure is one
    :class:`FetchError` that says what to fix.
    """
    types = list(query.instance_types or default_instance_types())
    today = datetime.now(timezone.utc).date().isoformat()
    offers: list[Offer] = []
    try:
        client_factory = query.client_factory or _default_client_factory()
        pricing = client_factory("pricing", PRICING_REGION)
        for region in query.regions or default_regions():
            query.say(f"aws {region}")
            offers += _fetch_region(region, types, ec2=client_factory("ec2", region), pricing=pricing,
                                    query=query, as_of=today)
    except MissingExtra:
        raise
    except Exception as e:  # noqa: BLE001 - every failure (boto, network, parsing) becomes one clear FetchError
        raise _translate(e, "price fetch") from e
    return offers


def _fetch_region(region: str, types: list[str], *, ec2: Any, pricing: Any, query: FetchQuery,
                  as_of: str) -> list[Offer]:
    """One region's offers: GPU facts of ``types`` there, the AZs that offer each, spot prices in
    force now per AZ and the Price List's on-demand and reserved rates."""
    def paged(call: Callable[..., dict], key: str, what: str, **kwargs: Any) -> list:
        return _paged(call, key, "NextToken", "NextToken", f"{what} {region}", query.sleep, query.attempts, **kwargs)

    facts = instance_facts(paged(ec2.describe_instance_types, "InstanceTypes", "ec2.describe_instance_types",
                                 Filters=[{"Name": "instance-type", "Values": types}]))
    if not facts:
        return []
    azs = ec2.describe_availability_zones()["AvailabilityZones"]
    zone_ids = {z["ZoneName"]: z["ZoneId"] for z in azs}
    offered: dict[str, list[str]] = {}
    for o in paged(ec2.describe_instance_type_offerings, "InstanceTypeOfferings",
                   "ec2.describe_instance_type_offerings", LocationType="availability-zone-id",
                   Filters=[{"Name": "instance-type", "Values": sorted(facts)}]):
        offered.setdefault(o["InstanceType"], []).append(o["Location"])
    now = datetime.now(timezone.utc)
    history = paged(ec2.describe_spot_price_history, "SpotPriceHistory", "ec2.describe_spot_price_history",
                    InstanceTypes=sorted(facts), ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                    StartTime=now, EndTime=now)
    spot = current_spot_prices(history, zone_ids)
    filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in (
        ("regionCode", region), ("operatingSystem", "Linux"), ("tenancy", "Shared"),
        ("preInstalledSw", "NA"), ("capacitystatus", "Used"), ("licenseModel", "No License required"))]
    filters.append({"Type": "ANY_OF", "Field": "instanceType", "Value": ",".join(sorted(facts))})
    listed = parse_price_list(paged(pricing.get_products, "PriceList", "pricing.get_products",
                                    ServiceCode="AmazonEC2", FormatVersion="aws_v1", Filters=filters,
                                    MaxResults=100))
    offers: list[Offer] = []
    for itype, f in sorted(facts.items()):
        zones = sorted(offered.get(itype, [])) or [""]
        for market, option, usd in listed.get(itype, []):
            for z in (zones if market == Market.ON_DEMAND.value else [""]):
                offers.append(Offer(cloud="aws", instance_type=itype, region=region, zone=z,
                                    market=Market(market), usd_per_hour=usd, payment_option=option,
                                    source="aws:pricing.get_products", as_of=as_of, **f))
        for (t, z), (usd, _ts_) in sorted(spot.items()):
            if t == itype:
                offers.append(Offer(cloud="aws", instance_type=itype, region=region, zone=z,
                                    market=Market.SPOT, usd_per_hour=usd,
                                    source="aws:ec2.describe_spot_price_history", as_of=as_of, **f))
    return offers

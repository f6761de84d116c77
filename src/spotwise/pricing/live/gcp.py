"""GCP live prices: Cloud Billing Catalog SKUs composed with Compute machine types.

GCP does not price a GPU VM as one item. A VM's hourly price is the sum of its parts, each a SKU
of the Compute Engine service (``services/6F81-5844-456A``)::

    vCPUs × "<Family> Instance Core" + GiB × "<Family> Instance Ram" + GPUs × "<GPU> GPU"

a2/a3/g2 machine types include their GPUs (``machineType.accelerators``), so every such machine
type in a zone becomes one full-VM offer per market. Parts:

* **SKUs** — ``google-cloud-billing`` ``CloudCatalogClient.list_skus`` over REST, one page at a
  time (``pageSize`` 5000, following ``nextPageToken``), each page retried on 429/5xx/connection
  errors with backoff (:mod:`.retry`). ``category.usageType`` ``OnDemand`` → on-demand,
  ``Preemptible`` → spot (descriptions "Spot Preemptible …" win over legacy "Preemptible"),
  ``Commit1Yr``/``Commit3Yr`` or a "Commitment v1: … for N Year" description → reserved-1y/3y
  (payment option ``no-upfront``: GCP bills CUDs monthly). A SKU applies to the regions in its
  ``serviceRegions``. Price = ``units + nanos/1e9`` of the first tier.
* **Excluded by description** (:data:`EXCLUDED`): DWS Defined Duration / Flex Start, Calendar
  Mode, Sole Tenancy, custom/extended shapes. DWS and calendar-mode SKUs have ``usageType
  OnDemand`` too and are cheaper; taking them as on-demand understates the VM by up to ~2.5× (the
  shipped snapshot's README: SkyPilot's GCP catalog carries DWS rates as on-demand).
* **Shapes** — ``google-cloud-compute`` ``MachineTypesClient.aggregated_list`` (vCPUs, memory,
  accelerators, zones) and ``AcceleratorTypesClient.aggregated_list`` (a zone must list the GPU
  type too). Memory GiB = ``memoryMb / 1024``.

Which host SKU family a machine type uses is :data:`HOST_FAMILY` (a2 → "A2", a3-megagpu →
"A3Plus", …). A machine type whose host or GPU SKU is not found in a region is **skipped and
counted** (``FetchResult.skipped``), never priced from a guess. Bundled local SSD (a3) is billed
separately by GCP and is not included.

Credentials: the Billing Catalog takes an API key (``SPOTWISE_GCP_API_KEY`` or
``GOOGLE_API_KEY``) or Application Default Credentials; the Compute API needs ADC and a project
(``SPOTWISE_GCP_PROJECT`` or the ADC project). ``SPOTWISE_GCP_ANONYMOUS=1`` uses anonymous
credentials (local fakes). Endpoints: ``SPOTWISE_GCP_BILLING_ENDPOINT`` and
``SPOTWISE_GCP_ENDPOINT`` (an ``http://`` URL is used as given).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import ModuleType
from typing import Any, Callable, Iterable

from spotwise.config import setting
from spotwise.extras import require
from spotwise.pricing.live import FetchError, FetchQuery, register_fetcher
from spotwise.pricing.live.retry import with_retries
from spotwise.pricing.offer import Market, Offer

SERVICE = "services/6F81-5844-456A"   # Compute Engine in the Billing Catalog
PAGE_SIZE = 5000
TIMEOUT_S = 60.0
SOURCE = "gcp:cloud-billing-catalog+compute-api"

#: Lower-case description fragments of SKUs that are not the plain market price.
EXCLUDED = ("dws defined duration", "flex start", "flex-start", "calendar mode", "sole tenancy",
            "sole-tenancy", "custom", "extended", "reserved ")

#: Machine-type prefix -> host SKU family label (upper-cased) in "<Family> Instance Core/Ram".
HOST_FAMILY = {
    "a2-highgpu": "A2", "a2-megagpu": "A2", "a2-ultragpu": "A2",
    "a3-highgpu": "A3", "a3-edgegpu": "A3", "a3-megagpu": "A3PLUS", "a3-ultragpu": "A3ULTRA",
    "g2-standard": "G2",
}
#: Compute accelerator type -> (GPU SKU key, catalog accelerator name, GPU memory GiB).
ACCELERATORS = {
    "nvidia-tesla-a100": ("A100", "A100", 40.0),
    "nvidia-a100-80gb": ("A100-80GB", "A100-80GB", 80.0),
    "nvidia-h100-80gb": ("H100", "H100", 80.0),
    "nvidia-h100-mega-80gb": ("H100-MEGA", "H100", 80.0),
    "nvidia-h200-141gb": ("H200", "H200", 141.0),
    "nvidia-l4": ("L4", "L4", 24.0),
    "nvidia-tesla-v100": ("V100", "V100", 16.0),
}
_MARKETS = (Market.ON_DEMAND, Market.SPOT, Market.RESERVED_1Y, Market.RESERVED_3Y)

_HOST_RE = re.compile(r"^(?P<fam>[a-z0-9]+) (?:instance )?(?P<kind>core|cpu|ram)\b")
_LOC_RE = re.compile(r"\s+(?:running )?in [a-z ]+(?: for \d+ years?)?$")


# -- SKUs ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SkuPrice:
    """One SKU reduced to what composition needs: which part, which market, where, how much."""

    part: str                 # "core" | "ram" | "gpu"
    key: str                  # host family ("A2") or GPU SKU key ("A100-80GB")
    market: Market
    regions: tuple[str, ...]
    usd: float                # per vCPU-hour, GiB-hour or GPU-hour
    description: str
    sku_id: str


def sku_market(sku: dict) -> Market | None:
    desc = sku.get("description", "").lower()
    usage = (sku.get("category") or {}).get("usageType", "")
    if desc.startswith("commitment") or usage.startswith("Commit"):
        m = re.search(r"for (\d+) year", desc)
        years = m.group(1) if m else ("1" if "1Yr" in usage else "3" if "3Yr" in usage else None)
        return {"1": Market.RESERVED_1Y, "3": Market.RESERVED_3Y}.get(years or "")
    if usage == "Preemptible":
        return Market.SPOT
    if usage == "OnDemand":
        return Market.ON_DEMAND
    return None


def gpu_key(desc: str) -> str | None:
    """The GPU SKU key named by a GPU SKU description (``None``: a GPU we do not price)."""
    d = desc.lower()
    if "h200" in d:
        return "H200"
    if "h100" in d:
        return "H100-MEGA" if ("mega" in d or "plus" in d) else "H100"
    if "a100" in d:
        return "A100-80GB" if "80gb" in d else "A100"
    if re.search(r"\bl4\b", d):
        return "L4"
    if "v100" in d:
        return "V100"
    return None


def _unit_price(sku: dict) -> float | None:
    infos = sku.get("pricingInfo") or []
    if not infos:
        return None
    tiers = (infos[-1].get("pricingExpression") or {}).get("tieredRates") or []
    if not tiers:
        return None
    tier = min(tiers, key=lambda t: float(t.get("startUsageAmount") or 0))
    up = tier.get("unitPrice") or {}
    if up.get("currencyCode", "USD") != "USD":
        return None
    return float(up.get("units") or 0) + int(up.get("nanos") or 0) / 1e9


def classify_sku(sku: dict) -> SkuPrice | None:
    """A Billing Catalog SKU (JSON/camelCase dict) -> its priced part, or None to ignore it."""
    desc = sku.get("description", "")
    low = desc.lower()
    if any(x in low for x in EXCLUDED):
        return None
    market = sku_market(sku)
    usd = _unit_price(sku)
    regions = tuple(sku.get("serviceRegions") or ())
    if market is None or usd is None or usd <= 0 or not regions:
        return None
    group = (sku.get("category") or {}).get("resourceGroup", "")
    sid = sku.get("skuId", "")
    if group == "GPU" or " gpu" in low:
        key = gpu_key(desc)
        return SkuPrice("gpu", key, market, regions, usd, desc, sid) if key else None
    core = low
    for prefix in ("commitment v1:", "spot preemptible", "preemptible"):
        if core.startswith(prefix):
            core = core[len(prefix):].strip()
    core = _LOC_RE.sub("", core)
    m = _HOST_RE.match(core)
    if not m:
        return None
    part = "ram" if m.group("kind") == "ram" else "core"
    return SkuPrice(part, m.group("fam").upper(), market, regions, usd, desc, sid)


def price_table(skus: Iterable[dict]) -> dict[tuple[str, str, Market, str], SkuPrice]:
    """(part, key, market, region) -> SKU. For spot, a "Spot" SKU wins over a legacy preemptible one."""
    table: dict[tuple[str, str, Market, str], SkuPrice] = {}
    for raw in skus:
        p = classify_sku(raw)
        if p is None:
            continue
        for region in p.regions:
            k = (p.part, p.key, p.market, region)
            old = table.get(k)
            if old is None or ("spot" in p.description.lower() and "spot" not in old.description.lower()):
                table[k] = p
    return table


# -- machine types --------------------------------------------------------------------------------
@dataclass(frozen=True)
class MachineShape:
    name: str
    zone: str
    vcpus: int
    memory_gib: float
    accelerator_type: str
    accelerator_count: int

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    @property
    def family(self) -> str | None:
        return HOST_FAMILY.get("-".join(self.name.split("-")[:2]))


def shapes_from_aggregated(items: Iterable[tuple[str, list[dict]]],
                           accelerators_by_zone: dict[str, set[str]] | None = None) -> list[MachineShape]:
    """Zone scope -> machineTypes (JSON dicts) into GPU machine shapes we can price."""
    out = []
    for scope, types in items:
        zone = scope.split("/", 1)[-1]
        for mt in types:
            accs = mt.get("accelerators") or []
            if len(accs) != 1 or mt.get("deprecated"):
                continue
            acc = accs[0].get("guestAcceleratorType", "")
            if acc not in ACCELERATORS or "-".join(mt["name"].split("-")[:2]) not in HOST_FAMILY:
                continue
            if accelerators_by_zone is not None and acc not in accelerators_by_zone.get(zone, set()):
                continue
            out.append(MachineShape(mt["name"], zone, int(mt["guestCpus"]), int(mt["memoryMb"]) / 1024,
                                    acc, int(accs[0]["guestAcceleratorCount"])))
    return out


# -- composition ----------------------------------------------------------------------------------
@dataclass
class FetchResult:
    offers: list[Offer] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)   # "type region market: missing part" -> n
    skus_seen: int = 0
    pages: int = 0


def compose(shapes: Iterable[MachineShape], table: dict, *, as_of: str,
            regions: set[str] | None = None) -> FetchResult:
    """Full-VM offers: on-demand/spot per zone, reserved-1y/3y per region (zone "")."""
    res = FetchResult()
    seen_reserved: set[tuple[str, str, Market]] = set()
    for s in sorted(shapes, key=lambda s: (s.name, s.zone)):
        if regions and s.region not in regions:
            continue
        gpu_sku_key, accel, gpu_mem = ACCELERATORS[s.accelerator_type]
        for market in _MARKETS:
            reserved = market in (Market.RESERVED_1Y, Market.RESERVED_3Y)
            if reserved:
                if (s.name, s.region, market) in seen_reserved:
                    continue
                seen_reserved.add((s.name, s.region, market))
            core = table.get(("core", s.family, market, s.region))
            ram = table.get(("ram", s.family, market, s.region))
            gpu = table.get(("gpu", gpu_sku_key, market, s.region))
            if core is None or ram is None or gpu is None:
                missing = [k for k, v in (("core", core), ("ram", ram), ("gpu", gpu)) if v is None]
                why = f"{s.name} {s.region} {market.value}: no {'/'.join(missing)} SKU"
                res.skipped[why] = res.skipped.get(why, 0) + 1
                continue
            usd = s.vcpus * core.usd + s.memory_gib * ram.usd + s.accelerator_count * gpu.usd
            res.offers.append(Offer(
                cloud="gcp", instance_type=s.name, accelerator=accel, accelerator_count=s.accelerator_count,
                region=s.region, zone="" if reserved else s.zone, market=market, usd_per_hour=round(usd, 6),
                payment_option="no-upfront" if reserved else None, source=SOURCE, as_of=as_of,
                vcpus=float(s.vcpus), memory_gib=round(s.memory_gib, 3), gpu_memory_gib=gpu_mem))
    return res


# -- clients --------------------------------------------------------------------------------------
_CRED_HELP = ("GCP prices need credentials: set SPOTWISE_GCP_API_KEY (an API key with the Cloud Billing "
              "API enabled) for the price catalog, and Application Default Credentials for machine types "
              "('gcloud auth application-default login' or GOOGLE_APPLICATION_CREDENTIALS) with "
              "SPOTWISE_GCP_PROJECT; the previous cache is kept")


def _sdk(module: str) -> ModuleType:
    """A module of the Google Cloud SDK (the ``spotwise[gcp]`` extra), or :class:`MissingExtra`."""
    return require(module, "gcp", "GCP live prices")


def _endpoint(var: str) -> str | None:
    return setting(var) or None


def resolve_credentials(credentials: Any = None, project: str | None = None) -> tuple[Any, str, str | None]:
    """(compute credentials, project, billing API key); FetchError with what to set when missing."""
    api_key = setting("SPOTWISE_GCP_API_KEY") or os.environ.get("GOOGLE_API_KEY") or None
    project = project or setting("SPOTWISE_GCP_PROJECT") or None
    if credentials is None and setting("SPOTWISE_GCP_ANONYMOUS") == "1":
        credentials = _sdk("google.auth.credentials").AnonymousCredentials()
    if credentials is None:
        google_auth = _sdk("google.auth")
        DefaultCredentialsError = _sdk("google.auth.exceptions").DefaultCredentialsError
        try:
            credentials, adc_project = google_auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        except DefaultCredentialsError:
            raise FetchError(_CRED_HELP) from None
        project = project or adc_project
    if not project:
        raise FetchError("GCP machine types need a project: set SPOTWISE_GCP_PROJECT; the previous cache is kept")
    return credentials, project, api_key


def _retryable(e: BaseException) -> bool:
    gx = _sdk("google.api_core.exceptions")

    if isinstance(e, (gx.TooManyRequests, gx.InternalServerError, gx.BadGateway, gx.ServiceUnavailable,
                      gx.GatewayTimeout, gx.DeadlineExceeded)):
        return True
    try:
        import requests

        return isinstance(e, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError))
    except ImportError:  # pragma: no cover
        return isinstance(e, (ConnectionError, TimeoutError))


def _call(fn: Callable[[], Any], *, what: str, sleep: Callable[[float], None], attempts: int) -> Any:
    gx = _sdk("google.api_core.exceptions")
    GoogleAuthError = _sdk("google.auth.exceptions").GoogleAuthError

    try:
        return with_retries(fn, retryable=_retryable, attempts=attempts, sleep=sleep, what=what)
    except FetchError as e:
        raise FetchError(f"{e}; the previous cache is kept") from e
    except (gx.Unauthenticated, gx.PermissionDenied, GoogleAuthError) as e:
        raise FetchError(f"{what}: credentials rejected ({getattr(e, 'message', e)}). {_CRED_HELP}") from None
    except gx.GoogleAPICallError as e:
        msg = getattr(e, "message", str(e))
        if "api key" in str(msg).lower():
            raise FetchError(f"{what}: {msg}. {_CRED_HELP}") from None
        raise FetchError(f"{what} failed: HTTP {e.code} {msg}; the previous cache is kept") from None


def list_skus(*, api_key: str | None, credentials: Any, sleep: Callable[[float], None] = time.sleep,
              attempts: int = 5, page_size: int = PAGE_SIZE,
              progress: Callable[[str], None] | None = None) -> tuple[list[dict], int]:
    """Every Compute Engine SKU as a JSON dict, page by page; (skus, pages)."""
    ClientOptions = _sdk("google.api_core.client_options").ClientOptions
    billing_v1 = _sdk("google.cloud.billing_v1")

    opts = ClientOptions(api_endpoint=_endpoint("SPOTWISE_GCP_BILLING_ENDPOINT"), api_key=api_key)
    client = billing_v1.CloudCatalogClient(transport="rest", client_options=opts,
                                           credentials=None if api_key else credentials)
    out: list[dict] = []
    token, pages = "", 0
    while True:
        pages += 1
        req = billing_v1.ListSkusRequest(parent=SERVICE, page_size=page_size, page_token=token, currency_code="USD")
        if progress:
            progress(f"gcp SKUs page {pages}")
        pager = _call(lambda: client.list_skus(request=req, retry=None, timeout=TIMEOUT_S),
                      what=f"GCP Billing Catalog page {pages}", sleep=sleep, attempts=attempts)
        out.extend(billing_v1.Sku.to_dict(s, preserving_proto_field_name=False) for s in pager.skus)
        token = pager.next_page_token
        if not token:
            return out, pages


def list_shapes(*, project: str, credentials: Any, sleep: Callable[[float], None] = time.sleep,
                attempts: int = 5) -> list[MachineShape]:
    """GPU machine shapes in every zone (machine types cross-checked with accelerator types)."""
    ClientOptions = _sdk("google.api_core.client_options").ClientOptions
    compute_v1 = _sdk("google.cloud.compute_v1")

    ep = _endpoint("SPOTWISE_GCP_ENDPOINT")
    opts = ClientOptions(api_endpoint=ep) if ep else None
    mt_client = compute_v1.MachineTypesClient(transport="rest", client_options=opts, credentials=credentials)
    acc_client = compute_v1.AcceleratorTypesClient(transport="rest", client_options=opts, credentials=credentials)

    def accelerators() -> dict[str, set[str]]:
        req = compute_v1.AggregatedListAcceleratorTypesRequest(project=project)
        out: dict[str, set[str]] = {}
        for scope, scoped in acc_client.aggregated_list(request=req, retry=None, timeout=TIMEOUT_S):
            out[scope.split("/", 1)[-1]] = {a.name for a in scoped.accelerator_types}
        return out

    def machine_types() -> list[tuple[str, list[dict]]]:
        req = compute_v1.AggregatedListMachineTypesRequest(
            project=project, filter='name eq "(a2|a3|g2)-.*"')
        return [(scope, [compute_v1.MachineType.to_dict(m, preserving_proto_field_name=False)
                         for m in scoped.machine_types])
                for scope, scoped in mt_client.aggregated_list(request=req, retry=None, timeout=TIMEOUT_S)]

    accs = _call(accelerators, what="GCP acceleratorTypes.aggregatedList", sleep=sleep, attempts=attempts)
    mts = _call(machine_types, what="GCP machineTypes.aggregatedList", sleep=sleep, attempts=attempts)
    return shapes_from_aggregated(mts, accs)


def default_regions() -> list[str]:
    from spotwise.pricing.catalog import Catalog

    return sorted({o.region for o in Catalog.load(use_cache=False) if o.cloud == "gcp"})


def fetch_result(query: FetchQuery, *, page_size: int = PAGE_SIZE) -> FetchResult:
    """Fetch SKUs and shapes, compose offers for ``query.regions`` (default: every region with
    shapes), with what was skipped and why (:class:`FetchResult`)."""
    credentials, project, api_key = resolve_credentials(query.credentials, query.project)
    query.say("gcp machine types")
    shapes = list_shapes(project=project, credentials=credentials, sleep=query.sleep, attempts=query.attempts)
    skus, pages = list_skus(api_key=api_key, credentials=credentials, sleep=query.sleep, attempts=query.attempts,
                            page_size=page_size, progress=query.progress)
    as_of = datetime.now(timezone.utc).date().isoformat()
    res = compose(shapes, price_table(skus), as_of=as_of, regions=set(query.regions) if query.regions else None)
    res.skus_seen, res.pages = len(skus), pages
    return res


@register_fetcher("gcp", default_regions=default_regions, all_regions_at_once=True)   # SKUs are global
def fetch(query: FetchQuery) -> list[Offer]:
    """Same contract as the AWS/Azure fetchers: offers for ``query.regions`` or a :class:`FetchError`."""
    return fetch_result(query).offers

"""The GPU catalog: every known offer, and ranking them for a request.

Where offers come from
    The snapshot shipped in ``spotwise/pricing/data/offers.csv`` (see its README for provenance)
    is the base. A live fetch (``spotwise catalog refresh``) writes ``$SPOTWISE_HOME/prices/
    <cloud>.csv``; when such a cache file exists, its rows replace the snapshot's rows for every
    (cloud, region) the cache covers, and the snapshot still answers for the rest. So a partial
    refresh (one region) never hides the other regions, and a cache never mixes with stale rows of
    the same region.

Flags
    Rows carry data-quality ``flags``. Flags in :data:`INFO_FLAGS` are notes (the price is still
    the best we have). Flags in :data:`STALE_FLAGS` mean no current source confirms the price (it
    predates a known price change, or its only source is old): such offers are left out of
    :meth:`Catalog.find_offers` unless ``include_stale=True`` (or ``include_flagged=True``), so a
    stale price never ranks as if it were current. Any other flag means the price is wrong or
    unconfirmed, and such offers are left out unless ``include_flagged=True``.

Ranking is cheapest first by the price of the whole request per hour (``nodes`` × the instance's
``usd_per_hour``), ties broken by cloud/region/zone/type so the order is deterministic. The catalog
keeps one index per accelerator, so ranking touches only the rows of the requested GPUs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from spotwise.config import setting
from spotwise.errors import InputError, Problem
from spotwise.pricing.accelerators import canonical
from spotwise.pricing.offer import Market, Offer
from spotwise.pricing.store import SNAPSHOT, read_offers

#: Clouds the catalog prices (the local cloud prices itself).
CATALOG_CLOUDS: tuple[str, ...] = ("aws", "azure", "gcp")

#: Flags that annotate a row without making its price untrustworthy.
INFO_FLAGS = frozenset({"accelerator_count_corrected", "merged_duplicate_rows"})

#: Flags that say the price is old and no current source confirms it (shown with ``include_stale``).
STALE_FLAGS = frozenset({"stale_no_current_source", "stale_spot_2024", "on_demand_predates_2025_06_cut"})

#: Markets you can buy by the hour; ``market=None`` means these (reserved needs a commitment).
HOURLY_MARKETS = (Market.SPOT, Market.ON_DEMAND)


def blocking_flags(offer: Offer) -> tuple[str, ...]:
    """Flags that keep the offer out of ranking by default (stale ones included)."""
    return tuple(f for f in offer.flags if f not in INFO_FLAGS)


def stale_flags(offer: Offer) -> tuple[str, ...]:
    return tuple(f for f in offer.flags if f in STALE_FLAGS)


def is_stale(offer: Offer) -> bool:
    return any(f in STALE_FLAGS for f in offer.flags)


def _admitted(o: Offer, include_flagged: bool, include_stale: bool) -> bool:
    if include_flagged or not o.flags:
        return True
    blocking = blocking_flags(o)
    if not blocking:
        return True
    return include_stale and all(f in STALE_FLAGS for f in blocking)


#: GCP machine types that differ from their twin only by local SSD (same GPUs, price, market).
_VARIANT_SUFFIXES = ("-nolssd",)


def family_key(o: Offer) -> tuple:
    """What two offers must share to be "the same offer" for a reader: cloud, region, instance type
    without a ``-nolssd``-style suffix, market, payment option and price (to the cent)."""
    itype = o.instance_type
    for suf in _VARIANT_SUFFIXES:
        if itype.endswith(suf):
            itype = itype[: -len(suf)]
    return (o.cloud, o.region, itype, o.market.value, o.payment_option or "", round(o.usd_per_hour, 2))


def collapse_offers(offers: Sequence[Offer]) -> list[tuple[Offer, int]]:
    """Keep the first offer of each :func:`family_key` (input order, so the cheapest when ranked),
    with how many rows it stands for (zones, ``-nolssd`` twins). ``--all`` skips this."""
    first: dict[tuple, int] = {}
    out: list[list] = []
    for o in offers:
        k = family_key(o)
        if k in first:
            out[first[k]][1] += 1
        else:
            first[k] = len(out)
            out.append([o, 1])
    return [(o, n) for o, n in out]


def cache_dir() -> Path:
    """``$SPOTWISE_HOME/prices``: where live fetchers write ``<cloud>.csv`` + ``<cloud>.json``."""
    from spotwise.paths import home

    return home() / "prices"


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """Where one cloud's rows came from: ``snapshot`` or ``cache`` (+ the cache's metadata)."""

    cloud: str
    kind: str
    path: str
    meta: dict = field(default_factory=dict)


def parse_markets(market: str | Market | Iterable[str | Market] | None, *, field: str = "market") -> tuple[Market, ...]:
    """None -> spot + on-demand; ``"auto"`` likewise; otherwise one market or several."""
    if market is None:
        return HOURLY_MARKETS
    items = [market] if isinstance(market, (str, Market)) else list(market)
    out: list[Market] = []
    for m in items:
        if isinstance(m, Market):
            out.append(m)
            continue
        for part in str(m).split(","):
            part = part.strip()
            if not part:
                continue
            if part.lower() == "auto":
                out.extend(HOURLY_MARKETS)
                continue
            try:
                out.append(Market.parse(part))
            except ValueError:
                raise InputError(Problem(field, part, ", ".join(x.value for x in Market))) from None
    if not out:
        raise InputError(Problem(field, market, ", ".join(x.value for x in Market)))
    return tuple(dict.fromkeys(out))


def parse_clouds(clouds: str | Iterable[str] | None, *, field: str = "clouds") -> tuple[str, ...] | None:
    if clouds is None:
        return None
    items = [clouds] if isinstance(clouds, str) else list(clouds)
    out = []
    for c in items:
        for part in str(c).split(","):
            part = part.strip().lower()
            if not part:
                continue
            if part not in CATALOG_CLOUDS:
                raise InputError(Problem(field, part, ", ".join(CATALOG_CLOUDS)))
            out.append(part)
    return tuple(dict.fromkeys(out)) or None


def _str_list(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    out = tuple(p.strip() for v in items for p in str(v).split(",") if p.strip())
    return out or None


class Catalog:
    """An immutable set of offers with an index per accelerator."""

    def __init__(self, offers: Sequence[Offer], sources: Sequence[SourceInfo] = ()) -> None:
        self._offers: tuple[Offer, ...] = tuple(offers)
        self.sources: tuple[SourceInfo, ...] = tuple(sources)
        by_acc: dict[str, list[Offer]] = {}
        for o in self._offers:
            by_acc.setdefault(o.accelerator, []).append(o)
        self._by_acc = by_acc
        self._regions = frozenset(o.region for o in self._offers)

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, *, use_cache: bool = True, cache: Path | None = None, snapshot: Path | None = None) -> "Catalog":
        """Snapshot + (unless ``use_cache=False``) the live cache; see the module docstring."""
        snap_path = Path(snapshot or SNAPSHOT)
        offers = read_offers(snap_path)
        sources = {c: SourceInfo(c, "snapshot", str(snap_path)) for c in sorted({o.cloud for o in offers})}
        if use_cache:
            cdir = Path(cache) if cache is not None else _existing_cache_dir()
            if cdir is not None and cdir.is_dir():
                for cloud in CATALOG_CLOUDS:
                    path = cdir / f"{cloud}.csv"
                    if not path.is_file():
                        continue
                    cached = read_offers(path)
                    if not cached:
                        continue
                    covered = {(o.cloud, o.region) for o in cached}
                    offers = [o for o in offers if (o.cloud, o.region) not in covered] + cached
                    meta_path = cdir / f"{cloud}.json"
                    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
                    sources[cloud] = SourceInfo(cloud, "cache", str(path), meta)
        return cls(offers, list(sources.values()))

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._offers)

    def __iter__(self):
        return iter(self._offers)

    @property
    def offers_all(self) -> tuple[Offer, ...]:
        return self._offers

    def accelerators(self) -> list[str]:
        return sorted(self._by_acc)

    def regions(self) -> list[str]:
        return sorted(self._regions)

    def select(self, accelerators: Mapping[str, int | None] | None = None, *, clouds=None, regions=None,
               market=None, max_price: float | None = None, nodes: int = 1,
               include_flagged: bool = False, include_stale: bool = False) -> list[Offer]:
        """Like :meth:`find_offers`, but a count of ``None`` matches any GPU count and
        ``accelerators=None`` matches every accelerator. Arguments are validated here."""
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
            raise InputError(Problem("nodes", nodes, "a whole number >= 1"))
        if max_price is not None and not (isinstance(max_price, (int, float)) and max_price >= 0):
            raise InputError(Problem("max_price", max_price, "a number >= 0 (USD per hour)"))
        markets = frozenset(parse_markets(market))
        cloud_set = parse_clouds(clouds)
        region_set = _str_list(regions)
        if accelerators is None:
            wanted: dict[str, int | None] = {a: None for a in self._by_acc}
        else:
            wanted = {canonical(k, field="accelerators"): v for k, v in accelerators.items()}
        cap = None if max_price is None else max_price / nodes
        out: list[Offer] = []
        for acc, count in wanted.items():
            for o in self._by_acc.get(acc, ()):
                if count is not None and o.accelerator_count != count:
                    continue
                if o.market not in markets:
                    continue
                if cloud_set is not None and o.cloud not in cloud_set:
                    continue
                if region_set is not None and o.region not in region_set and o.zone not in region_set:
                    continue
                if cap is not None and o.usd_per_hour > cap:
                    continue
                if not _admitted(o, include_flagged, include_stale):
                    continue
                out.append(o)
        out.sort(key=_rank_key)
        return out

    def find_offers(self, accelerators: dict[str, int], *, clouds=None, regions=None, market=None,
                    max_price: float | None = None, nodes: int = 1,
                    include_flagged: bool = False, include_stale: bool = False) -> list[Offer]:
        """Offers matching one of the ``accelerators`` alternatives, cheapest first.

        ``accelerators`` maps alternatives to GPUs per node, e.g. ``{"H100": 8, "A100-80GB": 8}``;
        an offer matches when its accelerator and count equal one alternative. ``clouds`` and
        ``regions`` (names or comma-separated strings; a region filter also accepts a zone name)
        restrict where; ``market`` is one market, several, or None (spot and on-demand).
        ``max_price`` caps the request's price per hour: ``nodes`` × the offer's ``usd_per_hour``.
        Offers with a blocking data-quality flag are excluded unless ``include_flagged``; offers
        whose only such flags are stale ones (:data:`STALE_FLAGS`) come back with ``include_stale``.
        Bad arguments raise :class:`~spotwise.errors.InputError`.
        """
        if not isinstance(accelerators, dict) or not accelerators:
            raise InputError(Problem("accelerators", accelerators, "a mapping {GPU name: count}, e.g. {'H100': 8}"))
        for name, n in accelerators.items():
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 16:
                raise InputError(Problem(f"accelerators.{name}", n, "a whole number 1..16"))
        return self.select(accelerators, clouds=clouds, regions=regions, market=market,
                           max_price=max_price, nodes=nodes, include_flagged=include_flagged,
                           include_stale=include_stale)

    offers = find_offers  # the name ARCHITECTURE.md uses: pricing.Catalog.offers()

    def to_dataframe(self):
        """All rows as a pandas DataFrame (imports pandas; not used on the CLI fast path)."""
        import pandas as pd

        rows = []
        for o in self._offers:
            d = o.to_dict()
            d["flags"] = ";".join(o.flags)
            d["flagged"] = bool(blocking_flags(o))
            d["stale"] = is_stale(o)
            rows.append(d)
        cols = ["cloud", "instance_type", "accelerator", "accelerator_count", "gpu_memory_gib", "vcpus",
                "memory_gib", "region", "zone", "market", "payment_option", "usd_per_hour",
                "usd_per_gpu_hour", "source", "as_of", "as_of_kind", "flags", "flagged", "stale"]
        return pd.DataFrame(rows, columns=cols)


def _rank_key(o: Offer):
    return (o.usd_per_hour, o.cloud, o.region, o.zone, o.instance_type, o.market.value, o.payment_option or "")


def _existing_cache_dir() -> Path | None:
    """The cache dir if SPOTWISE_HOME (or the default home) already has one; never creates it."""
    base = setting("SPOTWISE_HOME") or str(Path.home() / ".local" / "share" / "spotwise")
    p = Path(base) / "prices"
    return p if p.is_dir() else None


_DEFAULT: Catalog | None = None
_DEFAULT_KEY: tuple | None = None


def default_catalog() -> Catalog:
    """The process-wide catalog (snapshot + cache), reloaded when the cache files change."""
    global _DEFAULT, _DEFAULT_KEY
    cdir = _existing_cache_dir()
    key: tuple = (str(cdir),)
    if cdir is not None:
        key += tuple((p.name, p.stat().st_mtime_ns) for p in sorted(cdir.glob("*.csv")))
    if _DEFAULT is None or key != _DEFAULT_KEY:
        _DEFAULT, _DEFAULT_KEY = Catalog.load(), key
    return _DEFAULT


def find_offers(accelerators: dict[str, int], *, clouds=None, regions=None, market=None,
                max_price: float | None = None, nodes: int = 1, include_flagged: bool = False,
                include_stale: bool = False) -> list[Offer]:
    """:meth:`Catalog.find_offers` on the default catalog (snapshot + live cache)."""
    return default_catalog().find_offers(accelerators, clouds=clouds, regions=regions, market=market,
                                         max_price=max_price, nodes=nodes, include_flagged=include_flagged,
                                         include_stale=include_stale)


def load_catalog(*, include_flagged: bool = True, use_cache: bool = True):
    """The catalog as a pandas DataFrame, one row per offer, with ``flags`` and ``flagged`` columns.

    ``include_flagged=False`` drops rows whose price should not be trusted.
    """
    cat = default_catalog() if use_cache else Catalog.load(use_cache=False)
    df = cat.to_dataframe()
    if not include_flagged:
        df = df[~df["flagged"]].reset_index(drop=True)
    return df

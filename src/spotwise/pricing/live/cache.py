"""The live price cache: ``$SPOTWISE_HOME/prices/<cloud>.csv`` plus ``<cloud>.json`` metadata.

A refresh of some regions keeps the cached rows of the other regions. Before writing, the new
rows are checked (:mod:`spotwise.pricing.integrity`) against themselves and against the previous
rows for the same offers (>30 % jumps); failing rows are written with the check's name in
``flags`` so ranking leaves them out until someone looks. Both files are replaced atomically.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

from spotwise.pricing.integrity import check_offers, flag_findings
from spotwise.pricing.offer import Offer
from spotwise.pricing.store import atomic_write_text, read_offers, write_offers


def cache_paths(cloud: str, cache_dir: Path | None = None) -> tuple[Path, Path]:
    if cache_dir is None:
        from spotwise.pricing.catalog import cache_dir as _cd

        cache_dir = _cd()
    return Path(cache_dir) / f"{cloud}.csv", Path(cache_dir) / f"{cloud}.json"


def write_cloud_cache(cloud: str, offers: list[Offer], *, source: str, regions: list[str] | None = None,
                      cache_dir: Path | None = None) -> dict:
    """Merge ``offers`` (for ``regions``, default: the regions present) into the cloud's cache.

    Returns the metadata written (rows, regions, fetched_at, findings).
    """
    csv_path, meta_path = cache_paths(cloud, cache_dir)
    previous = read_offers(csv_path) if csv_path.is_file() else []
    covered = set(regions or ()) | {o.region for o in offers}
    kept = [o for o in previous if o.region not in covered]
    if not previous:
        # compare with the shipped snapshot the first time, so a first refresh also reports jumps
        from spotwise.pricing.catalog import Catalog

        previous = [o for o in Catalog.load(use_cache=False) if o.cloud == cloud]
    findings = check_offers(offers, previous=previous)
    offers = flag_findings(offers, findings)
    rows = kept + offers
    write_offers(csv_path, rows)
    meta = {
        "cloud": cloud,
        "source": source,
        "fetched_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "fetched_at_unix": time.time(),
        "rows": len(rows),
        "regions_refreshed": sorted(covered),
        "findings": [f.to_dict() for f in findings if not f.known][:200],
    }
    atomic_write_text(meta_path, json.dumps(meta, indent=2) + "\n")
    return meta

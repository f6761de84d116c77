"""Reading and writing offers as CSV: the shipped snapshot and the live cache share one format.

Stdlib only (no pandas) so a cold ``spotwise prices`` stays fast. Writes are atomic: a new file
is written next to the target and ``os.replace``d over it, so a crash or a failed fetch never
leaves a half-written cache and readers see either the old file or the new one.
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from pathlib import Path
from typing import Iterable

from spotwise.pricing.offer import Market, Offer

COLUMNS = ["cloud", "instance_type", "accelerator", "accelerator_count", "gpu_memory_gib", "vcpus",
           "memory_gib", "region", "zone", "market", "payment_option", "usd_per_hour", "source",
           "as_of", "as_of_kind", "flags"]
#: Columns a file may lack (caches written before the column existed): name -> default.
OPTIONAL_COLUMNS = {"as_of_kind": "exact"}

DATA_DIR = Path(__file__).resolve().parent / "data"
SNAPSHOT = DATA_DIR / "offers.csv"

_MARKETS = {m.value: m for m in Market}


def _num(s: str) -> float | None:
    return float(s) if s else None


def offer_from_row(r: dict) -> Offer:
    return Offer(
        cloud=r["cloud"], instance_type=r["instance_type"], accelerator=r["accelerator"],
        accelerator_count=int(r["accelerator_count"]), region=r["region"], zone=r["zone"],
        market=_MARKETS[r["market"]], usd_per_hour=float(r["usd_per_hour"]), source=r["source"],
        as_of=r["as_of"], vcpus=_num(r["vcpus"]), memory_gib=_num(r["memory_gib"]),
        gpu_memory_gib=_num(r["gpu_memory_gib"]), payment_option=r["payment_option"] or None,
        flags=tuple(f for f in r["flags"].split(";") if f),
        as_of_kind=r.get("as_of_kind") or OPTIONAL_COLUMNS["as_of_kind"],
    )


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.6f}".rstrip("0").rstrip(".")


def offer_to_row(o: Offer) -> dict:
    return {
        "cloud": o.cloud, "instance_type": o.instance_type, "accelerator": o.accelerator,
        "accelerator_count": str(o.accelerator_count), "gpu_memory_gib": _fmt(o.gpu_memory_gib),
        "vcpus": _fmt(o.vcpus), "memory_gib": _fmt(o.memory_gib), "region": o.region, "zone": o.zone,
        "market": o.market.value, "payment_option": o.payment_option or "",
        "usd_per_hour": _fmt(o.usd_per_hour), "source": o.source, "as_of": o.as_of,
        "as_of_kind": o.as_of_kind, "flags": ";".join(o.flags),
    }


def read_offers(path: Path) -> list[Offer]:
    """All offers in an offers CSV (header must contain :data:`COLUMNS`)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or []) and c not in OPTIONAL_COLUMNS]
        if missing:
            raise ValueError(f"{path}: not an offers file (missing columns {missing})")
        return [offer_from_row(r) for r in reader]


def write_offers(path: Path, offers: Iterable[Offer]) -> int:
    """Atomically (re)write ``path`` with ``offers``; returns the row count."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    n = 0
    for o in offers:
        w.writerow(offer_to_row(o))
        n += 1
    atomic_write_text(path, buf.getvalue())
    return n


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:   # anything, Ctrl-C included: remove the half-written temp file, then re-raise
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise

"""The ``Offer``: one way to rent GPUs, with its price, where the price came from and when.

Money is data: an Offer without ``source`` and ``as_of`` cannot be built, so a price can always
be traced back to the API response or snapshot row it came from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum


#: What ``as_of`` means: the price's date, or only a bound on it (the source has no date).
AS_OF_KINDS = ("exact", "upper_bound", "lower_bound", "approximate")
AS_OF_SYMBOL = {"exact": "", "upper_bound": "≤", "lower_bound": "≥", "approximate": "~"}


class Market(str, Enum):
    """How capacity is bought. Reserved terms are priced as an effective hourly rate."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"
    RESERVED_1Y = "reserved-1y"
    RESERVED_3Y = "reserved-3y"

    @classmethod
    def parse(cls, value: str) -> "Market":
        v = value.strip().lower().replace("_", "-")
        if v == "ondemand":
            v = "on-demand"
        for m in cls:
            if m.value == v:
                return m
        raise ValueError(f"unknown market {value!r}; allowed: {', '.join(m.value for m in cls)}")

    @property
    def preemptible(self) -> bool:
        return self is Market.SPOT


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """One purchasable configuration: cloud × instance type × region × zone × market.

    ``usd_per_hour`` is for the whole instance; ``usd_per_gpu_hour`` divides by the GPU count.
    ``zone`` is ``""`` where the cloud prices per region (Azure) .
    ``as_of_kind`` says whether ``as_of`` is the price's date (``exact``) or a bound
    (``upper_bound``: no later than; ``lower_bound``: no earlier than; ``approximate``).
    """

    cloud: str
    instance_type: str
    accelerator: str
    accelerator_count: int
    region: str
    zone: str
    market: Market
    usd_per_hour: float
    source: str
    as_of: str
    vcpus: float | None = None
    memory_gib: float | None = None
    gpu_memory_gib: float | None = None
    payment_option: str | None = None
    flags: tuple[str, ...] = field(default_factory=tuple)
    as_of_kind: str = "exact"

    def __post_init__(self) -> None:
        if not self.source or not self.as_of:
            raise ValueError("an Offer needs its price source and as_of date")
        if self.as_of_kind not in AS_OF_KINDS:
            raise ValueError(f"as_of_kind must be one of {', '.join(AS_OF_KINDS)}, got {self.as_of_kind!r}")
        if not (self.usd_per_hour >= 0):
            raise ValueError(f"usd_per_hour must be >= 0, got {self.usd_per_hour}")
        if self.accelerator_count < 0:
            raise ValueError("accelerator_count must be >= 0")

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / self.accelerator_count if self.accelerator_count else self.usd_per_hour

    @property
    def as_of_label(self) -> str:
        """``as_of`` with its kind: ``2026-07-28``, ``≤2025-05-31``, ``≥2025-06-01``, ``~2024-01-01``."""
        return AS_OF_SYMBOL[self.as_of_kind] + self.as_of

    @property
    def key(self) -> str:
        """Stable identity of the offer (used by failover caches and the ledger)."""
        return f"{self.cloud}/{self.region}/{self.zone or '-'}/{self.instance_type}/{self.market.value}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["market"] = self.market.value
        d["usd_per_gpu_hour"] = round(self.usd_per_gpu_hour, 6)
        d["flags"] = list(self.flags)
        return d

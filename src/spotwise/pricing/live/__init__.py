"""Live price fetchers (one module per cloud) and the cache they write.

Every fetcher has one signature, ``fetch(query: FetchQuery) -> list[Offer]``, and registers itself
in :data:`FETCHERS` with :func:`register_fetcher` in its own module, so ``spotwise catalog refresh``
names no cloud and adding one is one new module here. A fetcher returns the offers for the regions
asked, or raises :class:`FetchError` with a message a user can act on; :func:`spotwise.pricing.live.
cache.write_cloud_cache` then replaces the cloud's cache atomically. Nothing is written unless the
whole fetch succeeded, so the previous cache always survives a failed refresh.

Modules here are imported on the first lookup in :data:`FETCHERS`: they must stay cheap to import
and import their cloud's SDK inside the functions that call it (:func:`spotwise.extras.require`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from spotwise.errors import SpotwiseError
from spotwise.pricing.offer import Offer
from spotwise.registry import Registry


class FetchError(SpotwiseError):
    """A live fetch failed (missing credentials, throttling that outlasted the retries, a bad page)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchQuery:
    """What to fetch and how; every field has a default, so ``FetchQuery()`` fetches everything.

    ``regions`` / ``instance_types`` ``None`` mean the fetcher's default (the regions and GPU types
    of the shipped snapshot; GCP: every region that has GPU machine types). ``progress`` gets one
    short line per step, ``sleep`` is the back-off between retried pages (tests pass a recorder)
    and ``attempts`` the tries per page. The rest are for tests and local fakes, each read by one
    cloud only: ``client_factory(service, region)`` builds AWS's boto3 clients; ``credentials``
    and ``project`` are GCP's (default: Application Default Credentials and their project).
    """

    regions: tuple[str, ...] | None = None
    instance_types: tuple[str, ...] | None = None
    progress: Callable[[str], None] | None = None
    sleep: Callable[[float], None] = time.sleep
    attempts: int = 5
    client_factory: Callable[[str, str], Any] | None = None
    credentials: Any = None
    project: str | None = None

    def say(self, line: str) -> None:
        """Report progress, when someone listens."""
        if self.progress is not None:
            self.progress(line)


@dataclass(frozen=True, slots=True)
class Fetcher:
    """One cloud's registered fetcher.

    ``all_regions_at_once``: the fetch costs the same for one region as for all (GCP: SKUs are
    global), so a caller asks for every region in one call instead of one call per region."""

    cloud: str
    fetch: Callable[[FetchQuery], list[Offer]]
    default_regions: Callable[[], list[str]]
    all_regions_at_once: bool = False


#: Every cloud's live fetcher by name; an unknown name is an InputError on ``--cloud``.
FETCHERS: Registry[Fetcher] = Registry("price fetcher", ("spotwise.pricing.live",), field="--cloud")


def register_fetcher(cloud: str, *, default_regions: Callable[[], list[str]], all_regions_at_once: bool = False
                     ) -> Callable[[Callable[[FetchQuery], list[Offer]]], Callable[[FetchQuery], list[Offer]]]:
    """Decorator for a module's ``fetch(query)``: register it as ``cloud``'s fetcher (unchanged)."""

    def deco(fn: Callable[[FetchQuery], list[Offer]]) -> Callable[[FetchQuery], list[Offer]]:
        FETCHERS.register(cloud)(Fetcher(cloud, fn, default_regions, all_regions_at_once))
        return fn

    return deco

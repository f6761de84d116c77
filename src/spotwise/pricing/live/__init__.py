"""Live price fetchers (one module per cloud) and the cache they write.

Each fetcher returns a list of :class:`~spotwise.pricing.offer.Offer` for the regions asked, or
raises :class:`FetchError` with a message a user can act on; :func:`spotwise.pricing.live.cache.
write_cloud_cache` then replaces the cloud's cache atomically. Nothing is written unless the whole
fetch succeeded, so the previous cache always survives a failed refresh.
"""

from spotwise.errors import SpotwiseError


class FetchError(SpotwiseError):
    """A live fetch failed (missing credentials, throttling that outlasted the retries, a bad page)."""

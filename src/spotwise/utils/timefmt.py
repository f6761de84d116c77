"""The one way spotwise writes a timestamp for people and APIs: ISO 8601, UTC, whole seconds, ``Z``.

e.g. ``2025-01-01T12:00:00Z`` — the form the API, the CLI's JSON and the instance-metadata emulators
(which copy the clouds' own notices) all use.
"""

from __future__ import annotations

from datetime import datetime, timezone

ISO_Z = "%Y-%m-%dT%H:%M:%SZ"


def iso_utc(t: float) -> str:
    """Epoch seconds as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime(ISO_Z)


def iso_utc_or_none(t: float | None) -> str | None:
    """Like :func:`iso_utc`, but an unset time (``None`` or ``0``, as the database stores it) is ``None``."""
    return iso_utc(t) if t else None

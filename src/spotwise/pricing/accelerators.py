"""Accelerator names: one canonical spelling per GPU model, and parsing of user requests.

Catalog rows, task files and CLI flags all use the canonical names below (the ones SkyPilot's
catalogs and ``gpu_specs.csv`` use). Matching is case-insensitive; an unknown name is an
:class:`~spotwise.errors.InputError` listing what is allowed, never an empty result that looks
like "no capacity".
"""

from __future__ import annotations

from typing import Any

from spotwise.errors import InputError, Problem

#: Every accelerator the catalog or a task may name. ``cpu`` has no catalog offers (local cloud).
KNOWN_ACCELERATORS: tuple[str, ...] = (
    "A100", "A100-80GB", "H100", "H100-NVL", "H200", "L4", "L40S", "A10G", "A10",
    "V100", "V100-32GB", "cpu",
)
_CANON = {a.lower(): a for a in KNOWN_ACCELERATORS}
_ALIASES = {"a100-40gb": "A100", "h100-80gb": "H100", "h100-sxm": "H100", "v100-16gb": "V100"}


def canonical(name: str, *, field: str = "accelerator") -> str:
    """The canonical spelling of ``name``; InputError naming ``field`` when unknown."""
    key = str(name).strip().lower()
    got = _CANON.get(key) or _ALIASES.get(key)
    if got is None:
        raise InputError(Problem(field, name, ", ".join(KNOWN_ACCELERATORS)))
    return got


def parse_request(value: str | dict, *, count: int | None = None, field: str = "--gpu") -> dict[str, int | None]:
    """``"H100"``, ``"H100:8"``, ``"H100:8,A100-80GB:8"`` or ``{"H100": 8}`` -> ``{name: count}``.

    A name without a count gets ``count`` (``None`` = any count). Counts must be 1..16.
    """
    items: list[tuple[str, Any]]          # counts as given: str from the flag, anything from a file
    if isinstance(value, dict):
        items = list(value.items())
    else:
        items = []
        for part in str(value).split(","):
            if not part.strip():
                continue
            name, sep, given = part.strip().partition(":")
            items.append((name, given if sep else None))
    if not items:
        raise InputError(Problem(field, value, "a GPU name like H100, optionally NAME:COUNT"))
    out: dict[str, int | None] = {}
    for name, raw in items:
        canon = canonical(name, field=field)
        if raw is None or raw == "":
            raw = count
        n: int | None = None
        if raw is not None:
            try:
                n = int(raw)
            except (TypeError, ValueError):
                raise InputError(Problem(f"{field} count", raw, "a whole number 1..16")) from None
            if not 1 <= n <= 16:
                raise InputError(Problem(f"{field} count", n, "a whole number 1..16"))
        out[canon] = n
    return out

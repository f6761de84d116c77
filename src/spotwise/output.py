"""Printing results: ``--format json`` (machine-readable, stdout only) or a Rich table.

Every command that prints takes ``--format`` declared with :func:`format_option`: one typed
choice (:class:`Format`), one help text, and one message for a bad value (an
:class:`~spotwise.errors.InputError` naming ``--format`` and the allowed values, exit 2).
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Any, Iterable, Sequence


class Format(str, Enum):
    """What a command prints: a table for people or JSON for programs."""

    table = "table"
    json = "json"


FORMAT_METAVAR = "[" + "|".join(f.value for f in Format) + "]"


def parse_format(value: str | Format) -> Format:
    """``--format``'s value as a :class:`Format`; anything else is an
    :class:`~spotwise.errors.InputError` naming the flag and the allowed values."""
    if isinstance(value, Format):
        return value
    try:
        return Format(value)
    except ValueError:
        from spotwise.errors import InputError, Problem

        raise InputError(Problem("--format", value, ", ".join(f.value for f in Format))) from None


def format_option(default: Format = Format.table, help: str = "table or json.") -> Any:
    """The ``--format`` option of a command: ``fmt: Format = format_option()``."""
    import typer

    return typer.Option(default, "--format", parser=parse_format, metavar=FORMAT_METAVAR, help=help)


def json_safe(data: Any) -> Any:
    """``data`` with every non-finite float as ``None`` and every lone UTF-16 surrogate in a string
    replaced by U+FFFD, so that it always encodes as valid JSON in UTF-8.

    Why: ``json.dumps`` writes ``NaN``/``Infinity`` (not JSON; strict parsers refuse the whole
    document) and a lone surrogate cannot be encoded as UTF-8 at all. Inputs are refused long
    before this, but a report or an API answer must stay readable whatever an old row holds."""
    if isinstance(data, float):
        return data if data == data and data not in (float("inf"), float("-inf")) else None
    if isinstance(data, str):
        try:
            data.encode("utf-8")
            return data
        except UnicodeEncodeError:
            return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in data)
    if isinstance(data, dict):
        return {json_safe(k) if isinstance(k, str) else k: json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(v) for v in data]
    return data


def dumps(data: Any, **kw: Any) -> str:
    """``json.dumps`` of :func:`json_safe` data, with ``allow_nan=False`` as the backstop."""
    return json.dumps(json_safe(data), allow_nan=False, default=lambda o: json_safe(str(o)), **kw)


def print_json(data: Any) -> None:
    """Machine-readable output: always valid JSON (non-finite numbers become ``null``)."""
    sys.stdout.write(dumps(data, indent=2) + "\n")


def fmt_money(usd: float | None) -> str:
    """``$30,422,478`` (whole dollars from $1,000 up), ``$12.34`` below; ``never`` for infinity."""
    if usd is None:
        return ""
    if usd != usd or usd in (float("inf"), float("-inf")):
        return "never"
    return f"${usd:,.0f}" if abs(usd) >= 1000 else f"${usd:,.2f}"


def fmt_duration(hours: float | None) -> str:
    """Hours for up to two days, then days, then years (a year = 8760 h)."""
    if hours is None:
        return ""
    if hours != hours or hours == float("inf"):
        return "never"
    if hours < 48:
        return f"{hours:,.1f} h"
    days = hours / 24
    if days < 365:
        return f"{days:,.0f} days" if days >= 10 else f"{days:,.1f} days"
    return f"{hours / 8760:,.1f} years"


def print_table(rows: Iterable[dict], columns: Sequence[str], *, title: str | None = None,
                optional: Sequence[str] = (), footnotes: Sequence[str] = (), width: int | None = None) -> None:
    """A Rich table that fits the console (80 columns off a terminal) without wrapping cells:
    ``optional`` columns are dropped, last first, until the table fits; ``footnotes`` are printed
    under it (long per-row notes belong there, not in a cell). Without ``optional`` the table is
    printed as before (cells fold when it is too wide)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    rows = list(rows)
    console = Console(width=width) if width else Console()
    cols = list(columns)
    drop = [c for c in reversed(list(optional)) if c in cols]

    def text(r: dict, c: str) -> str:
        return "" if r.get(c) is None else str(r.get(c))

    def build(cs, fit: bool, no_wrap: bool = True, body=None) -> Table:
        table = Table(title=title, box=box.SIMPLE_HEAD if fit else box.HEAVY_HEAD)
        for c in cs:
            table.add_column(c, overflow="fold", no_wrap=fit and no_wrap)
        for r in (rows if body is None else body):
            table.add_row(*(text(r, c) for c in cs))
        return table

    from rich.cells import cell_len

    widest = {c: max((text(r, c) for r in rows), key=cell_len, default="") for c in cols}

    def width_of(cs) -> int:
        """Rendered width, measured on a one-row table of each column's widest cell (cheap)."""
        import io

        buf = io.StringIO()
        Console(width=10_000, file=buf, color_system=None).print(build(cs, True, body=[widest]))
        return max((cell_len(line) for line in buf.getvalue().splitlines()), default=0)

    fit = bool(optional)
    if fit:
        while drop and width_of(cols) > console.width:
            cols.remove(drop.pop(0))
    table = build(cols, fit, no_wrap=not fit or width_of(cols) <= console.width)
    console.print(table)
    for line in footnotes:
        console.print(line, highlight=False, markup=False)


def print_kv(data: dict, *, title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for k, v in data.items():
        table.add_row(k, json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v))
    Console().print(table)

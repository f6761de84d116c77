"""Printing results: ``--format json`` (machine-readable, stdout only) or a Rich table."""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Any, Iterable, Sequence


class Format(str, Enum):
    table = "table"
    json = "json"


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def print_table(rows: Iterable[dict], columns: Sequence[str], *, title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c, overflow="fold")
    for r in rows:
        table.add_row(*("" if r.get(c) is None else str(r.get(c)) for c in columns))
    Console().print(table)


def print_kv(data: dict, *, title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for k, v in data.items():
        table.add_row(k, json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v))
    Console().print(table)

"""Where spotwise keeps its state: ``$SPOTWISE_HOME`` (or the config file's ``home``), else
``~/.local/share/spotwise``."""

from __future__ import annotations

from pathlib import Path

from spotwise.config import setting


def home() -> Path:
    """The state directory (database, price cache, run logs); created on first use."""
    p = Path(setting("SPOTWISE_HOME") or Path.home() / ".local" / "share" / "spotwise")
    p.mkdir(parents=True, exist_ok=True)
    return p

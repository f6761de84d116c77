"""Where spotwise keeps its state: ``$SPOTWISE_HOME`` or ``~/.local/share/spotwise``."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """The state directory (database, price cache, run logs); created on first use."""
    p = Path(os.environ.get("SPOTWISE_HOME") or Path.home() / ".local" / "share" / "spotwise")
    p.mkdir(parents=True, exist_ok=True)
    return p

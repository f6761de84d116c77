"""No module under ``src/spotwise`` is longer than :data:`MAX_LINES` lines.

A module past that has stopped being one concern (the orchestrator was 1,150 lines and 54 methods
before it became a composition of parts; the AWS and local clouds were past 600): split it along
a seam of its own — a part with its own state and tests, a mixin, a leaf module — rather than
raising the limit.
"""

from __future__ import annotations

from pathlib import Path

import spotwise

SRC = Path(spotwise.__file__).parent
MAX_LINES = 600


def test_no_module_is_longer_than_the_limit():
    long = {str(p.relative_to(SRC.parent)): n for p in sorted(SRC.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them along a seam): {long}"

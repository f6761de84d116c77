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


MAX_MODULES = 15


def test_no_folder_holds_more_than_the_limit_and_no_prefix_does_a_packages_work():
    """A folder is one part (issue 52): at most :data:`MAX_MODULES` modules of its own, and no three
    modules sharing a name prefix (``slurm_cli``, ``slurm_jobs``, ``slurm_script``... is a package
    that was never made)."""
    crowded, prefixed = {}, {}
    for folder in sorted({p.parent for p in SRC.rglob("*.py")}):
        names = [p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
        if len(names) > MAX_MODULES:
            crowded[str(folder.relative_to(SRC.parent))] = len(names)
        heads: dict[str, list[str]] = {}
        for n in names:
            if "_" in n:
                heads.setdefault(n.split("_")[0], []).append(n)
        prefixed.update({f"{folder.relative_to(SRC.parent)}/{h}_*": ns for h, ns in heads.items() if len(ns) >= 3})
    assert not crowded, f"folders over {MAX_MODULES} modules (split them by what they do): {crowded}"
    assert not prefixed, f"modules whose shared prefix is a package's name: {prefixed}"

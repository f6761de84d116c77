"""Every pricing test gets its own empty SPOTWISE_HOME, so a developer's live cache never leaks in."""

import pytest


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    home = tmp_path / "spotwise-home"
    monkeypatch.setenv("SPOTWISE_HOME", str(home))
    yield home

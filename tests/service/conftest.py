"""Fixtures for the service tests.

``database`` is parametrized over SQLite (a fresh file) and PostgreSQL (a fresh database
``sw_test_<random>`` on 127.0.0.1:5432, dropped afterwards). It points ``SPOTWISE_DATABASE_URL``
and ``SPOTWISE_HOME`` at them, so everything under test uses that database. PostgreSQL cases skip
with the reason when no server answers (``pg_database`` in ``tests/conftest.py``).
"""

from __future__ import annotations

import pytest


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("SPOTWISE_HOME", str(h))
    return h


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request, home, monkeypatch):
    """The database URL under test (SQLite file or a fresh PostgreSQL database)."""
    from spotwise.service import db

    if request.param == "sqlite":
        url = f"sqlite:///{home / 'spotwise.db'}"
        monkeypatch.setenv("SPOTWISE_DATABASE_URL", url)
        yield url
        db.engine().dispose()
        db._engine.cache_clear()
        return
    url = request.getfixturevalue("pg_database")
    monkeypatch.setenv("SPOTWISE_DATABASE_URL", url)
    yield url

@pytest.fixture
def sqlite_db(home, monkeypatch):
    from spotwise.service import db

    url = f"sqlite:///{home / 'spotwise.db'}"
    monkeypatch.setenv("SPOTWISE_DATABASE_URL", url)
    yield url
    db._engine(url).dispose()
    db._engine.cache_clear()

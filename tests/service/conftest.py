"""Fixtures for the service tests.

``database`` is parametrized over SQLite (a fresh file) and PostgreSQL (a fresh database
``sw_test_<random>`` on 127.0.0.1:5432, dropped afterwards). It points ``SPOTWISE_DATABASE_URL``
and ``SPOTWISE_HOME`` at them, so everything under test uses that database. PostgreSQL cases skip
with the reason when no server answers.
"""

from __future__ import annotations

import os
import uuid

import pytest

PG_ADMIN = os.environ.get("SPOTWISE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_admin():
    import psycopg

    return psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3)


@pytest.fixture(scope="session")
def pg_available() -> str | None:
    try:
        with _pg_admin():
            return None
    except Exception as e:  # noqa: BLE001 - any failure means "no server here"
        return f"no PostgreSQL at {PG_ADMIN}: {e}"




@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("SPOTWISE_HOME", str(h))
    return h


def _make_pg_db() -> tuple[str, str]:
    name = f"sw_test_{uuid.uuid4().hex[:10]}"
    with _pg_admin() as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return name, f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def _drop_pg_db(name: str) -> None:
    with _pg_admin() as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request, home, monkeypatch, pg_available):
    """The database URL under test (SQLite file or a fresh PostgreSQL database)."""
    from spotwise.service import db

    if request.param == "sqlite":
        url = f"sqlite:///{home / 'spotwise.db'}"
        monkeypatch.setenv("SPOTWISE_DATABASE_URL", url)
        yield url
        db.engine().dispose()
        db._engine.cache_clear()
        return
    if pg_available:
        pytest.skip(pg_available)
    name, url = _make_pg_db()
    monkeypatch.setenv("SPOTWISE_DATABASE_URL", url)
    try:
        yield url
    finally:
        try:
            db._engine(url).dispose()
        finally:
            db._engine.cache_clear()
            _drop_pg_db(name)


@pytest.fixture
def sqlite_db(home, monkeypatch):
    from spotwise.service import db

    url = f"sqlite:///{home / 'spotwise.db'}"
    monkeypatch.setenv("SPOTWISE_DATABASE_URL", url)
    yield url
    db._engine(url).dispose()
    db._engine.cache_clear()

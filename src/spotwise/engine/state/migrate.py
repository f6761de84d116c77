"""Bring a database to the newest schema with Alembic (``upgrade head``), safely.

Called once per engine by :func:`spotwise.engine.state.db._engine`. Two processes may start against a
fresh database at the same moment (``spotwise serve`` and ``spotwise launch``), so the upgrade
runs under a lock: a PostgreSQL advisory lock, or an ``fcntl`` lock file beside a SQLite file.
A database made before migrations existed (tables from ``create_all``, no ``alembic_version``) is
stamped at revision 0001 — the schema it already has — and then upgraded.
"""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path

from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

MIGRATIONS = Path(__file__).with_name("migrations")
ADVISORY_LOCK_KEY = 0x5907_5153   # any fixed 32-bit number; identifies "spotwise schema upgrade"


def alembic_config(connection=None):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@contextlib.contextmanager
def _sqlite_file_lock(eng: Engine):
    db = eng.url.database
    if not db or db == ":memory:":
        yield
        return
    lock_path = Path(db).with_name(Path(db).name + ".migrate.lock")
    with open(lock_path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def current_revision(eng: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with eng.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    """The newest shipped revision (None only if no migration were shipped)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def upgrade(eng: Engine, revision: str = "head") -> None:
    from alembic import command

    pg = eng.dialect.name == "postgresql"
    lock = contextlib.nullcontext() if pg else _sqlite_file_lock(eng)
    with lock, eng.connect() as conn:
        if pg:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": ADVISORY_LOCK_KEY})
            conn.commit()
        try:
            names = set(inspect(conn).get_table_names())
            conn.commit()
            cfg = alembic_config(conn)
            if "jobs" in names and "alembic_version" not in names:
                command.stamp(cfg, "0001")
                conn.commit()
            command.upgrade(cfg, revision)
            conn.commit()
        finally:
            if pg:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_LOCK_KEY})
                conn.commit()

"""Alembic environment: runs on the connection :mod:`spotwise.engine.state.migrate` hands over, or on
``SPOTWISE_DATABASE_URL`` / the default SQLite file when run by the ``alembic`` command."""

from alembic import context
from sqlalchemy import create_engine

from spotwise.engine.state.db import Base

config = context.config
target_metadata = Base.metadata


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    from spotwise.engine.state.db import database_url

    with create_engine(database_url()).connect() as conn:
        _run(conn)
        conn.commit()

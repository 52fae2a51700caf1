"""Alembic environment: runs the migrations on the connection `store.migrate` passes in.

Without one (the `alembic` command line), it connects to `sqlalchemy.url` from the Alembic
configuration, else to `AGENT_RUNNER_DATABASE_URL`; `agent-runner db upgrade` is the usual
way, and knows the embedded default.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy.engine import Connection

from store._engine import make_engine, writer
from store.schema import VERSION_TABLE, metadata


def _url() -> str:
    url = context.config.get_main_option("sqlalchemy.url") or os.environ.get("AGENT_RUNNER_DATABASE_URL")
    if not url:
        raise SystemExit("no database to migrate: set AGENT_RUNNER_DATABASE_URL or run `agent-runner db upgrade`")
    return url


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        # SQLite runs DDL inside transactions as well, once SQLAlchemy emits the BEGIN
        # (see store._engine), so a failed upgrade leaves nothing half-created.
        transactional_ddl=True,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = context.config.attributes.get("connection")
    if isinstance(connection, Connection):
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        with writer(engine).begin() as own_connection:
            _run(own_connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()

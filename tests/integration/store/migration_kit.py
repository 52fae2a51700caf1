"""Migration helpers of the store tests: a database at an older revision, and how it differs from the models."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

import store
from store.schema import VERSION_TABLE, metadata


def migrated_to(engine: sa.Engine, revision: str) -> None:
    """Migrate the database of `engine` up to `revision` only, as an older version left it."""
    from alembic import command

    from store._engine import writer
    from store.migrations import alembic_config

    with writer(engine).begin() as connection:
        command.upgrade(alembic_config(connection), revision)


def schema_differences(url: str) -> list[Any]:
    engine = store.make_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"version_table": VERSION_TABLE, "compare_type": True}
            )
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()

"""The common base of the SQL backends: engine ownership and the embedded schema."""

from __future__ import annotations

import weakref
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from agent_runner.ids import utcnow
from store._closing import ClosesOnExit
from store._engine import DriverConnections, UrlOrEngine, display_url, resolve_engine, translated_errors, writer
from store.migrations import ensure_embedded_schema


class SqlBackend(ClosesOnExit):
    """Holds the engine of one SQL backend.

    An engine made from a URL is disposed of by `close()` (or leaving a `with` block); one
    passed in is left open for its owner. A SQLite database is migrated on first use.
    """

    def __init__(self, url_or_engine: UrlOrEngine) -> None:
        self._engine, self._owns_engine = resolve_engine(url_or_engine)
        self._postgres = self._engine.dialect.name == "postgresql"
        # Connections kept out of the pool for the statements run on the driver (PostgreSQL,
        # see `_direct`), handed back by `close`, or when the backend is garbage-collected.
        self._driver = DriverConnections(self._engine)
        self._driver_finalizer = weakref.finalize(self, self._driver.close)
        self._writer = writer(self._engine)
        # On PostgreSQL, reads and single-statement writes run in autocommit: one statement is
        # atomic by itself, and at READ COMMITTED (the default) each statement of a transaction
        # sees a snapshot of its own anyway, so BEGIN and COMMIT or ROLLBACK would only add two
        # round trips. SQLite keeps its explicit transactions (see `store._engine.WRITE`).
        autocommit = self._engine.dialect.name == "postgresql"
        self._reader = self._engine.execution_options(isolation_level="AUTOCOMMIT") if autocommit else self._engine
        self._statement_writer = self._reader if autocommit else self._writer
        try:
            ensure_embedded_schema(self._engine)
        except BaseException:
            self.close()
            raise

    @property
    def engine(self) -> Engine:
        """The engine this backend uses."""
        return self._engine

    def _direct(self) -> bool:
        """Whether the hot statements run on the driver directly (prepared, on kept connections).

        On PostgreSQL they do, unless something watches the engine's statements (a tracer, a
        statement log: `before_cursor_execute` or `after_cursor_execute` listeners, `echo`):
        then every statement goes through SQLAlchemy, where those see it.
        """
        dispatch = self._engine.dispatch
        return (
            self._postgres
            and not self._engine.echo
            and not dispatch.before_cursor_execute
            and not dispatch.after_cursor_execute
        )

    def _delete_in_batches(self, key: sa.Column[Any], where: sa.ColumnElement[bool], batch_size: int, what: str) -> int:
        """Delete the rows of `key`'s table that match `where`, `batch_size` rows per transaction; return how many.

        Short transactions keep a large backlog from holding locks for long; a failure
        leaves the batches already committed deleted.
        """
        table = key.table
        chosen = sa.select(key).where(where).limit(batch_size).scalar_subquery()
        removed = 0
        while True:
            with translated_errors(self._engine, what), self._writer.begin() as connection:
                count = int(connection.execute(sa.delete(table).where(key.in_(chosen))).rowcount)
            removed += count
            if count < batch_size:
                return removed

    def close(self) -> None:
        """Hand back the connections kept for the driver, and dispose of the engine if this backend made it."""
        self._driver_finalizer()
        if self._owns_engine:
            self._engine.dispose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({display_url(self._engine.url)!r})"


def retention_cutoff(older_than: timedelta, batch_size: int) -> datetime:
    """The time before which rows go, for a prune of what is older than `older_than`.

    Raises:
        ValueError: `older_than` is negative or `batch_size` is below 1.
    """
    if older_than < timedelta(0):
        raise ValueError(f"older_than must not be negative, got {older_than!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")
    return utcnow() - older_than

"""The common base of the SQL backends: engine ownership and the embedded schema."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from sqlalchemy.engine import Engine

from store._engine import UrlOrEngine, display_url, resolve_engine, writer
from store.migrations import ensure_embedded_schema


class SqlBackend:
    """Holds the engine of one SQL backend.

    An engine made from a URL is disposed of by `close()` (or leaving a `with` block); one
    passed in is left open for its owner. A SQLite database is migrated on first use.
    """

    def __init__(self, url_or_engine: UrlOrEngine) -> None:
        self._engine, self._owns_engine = resolve_engine(url_or_engine)
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

    def close(self) -> None:
        """Dispose of the engine if this backend made it."""
        if self._owns_engine:
            self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({display_url(self._engine.url)!r})"

"""Engines for the SQL backends, and the translation of driver errors into store errors.

This module is the one place where SQLAlchemy engines are made, so every backend talks to
PostgreSQL and SQLite with the same connection settings.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine, Row, make_url
from sqlalchemy.pool import StaticPool

from agent_runner.errors import StoreError, StoreUnavailableError

WRITE = "agent_runner_write"
"""Execution option marking a transaction that will write.

On SQLite such a transaction starts with `BEGIN IMMEDIATE`: it takes the write lock
up front and waits for it (busy timeout), instead of starting as a reader and failing with
`SQLITE_BUSY` when it tries to upgrade after another writer committed.
"""

SQLITE_BUSY_TIMEOUT_MS = 10_000
_SECRET_QUERY_KEYS = ("password", "sslpassword")

UrlOrEngine = str | URL | Engine
"""What the SQL backends accept: a database URL, or an engine to share."""

AnyRow: TypeAlias = Row[*tuple[Any, ...]]
"""A result row of any shape."""


def _json_dumps(value: Any) -> str:
    # Compact and UTF-8 as is: a 1 MB emoji message would triple in size as \u escapes.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def make_engine(url: str | URL) -> Engine:
    """Create an engine configured for the agent-runner tables.

    PostgreSQL (`postgresql+psycopg://...`) gets a bounded pool that recycles old
    connections. SQLite gets WAL journaling (readers never block the writer), a busy
    timeout, foreign keys, connections shareable across threads, and transactions that
    SQLAlchemy begins itself so that writers can take the lock up front (see `WRITE`).

    Pass the engine to several backends to share its pool; dispose of it when done.
    """
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed)
    if backend == "postgresql":
        return sa.create_engine(
            parsed,
            pool_size=5,
            max_overflow=10,
            pool_timeout=10,
            # Recycling bounds the life of an idle connection a firewall may have cut; a
            # connection that died anyway fails one operation with StoreUnavailableError
            # (retryable) and is dropped from the pool, which costs less than a ping before
            # every transaction on the hot path.
            pool_recycle=1800,
            json_serializer=_json_dumps,
            connect_args={"connect_timeout": 10},
        )
    return sa.create_engine(parsed, json_serializer=_json_dumps)


def _sqlite_engine(url: URL) -> Engine:
    in_memory = url.database in (None, "", ":memory:")
    engine = sa.create_engine(
        url,
        json_serializer=_json_dumps,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
        # One connection for an in-memory database: each new connection would see a new, empty database.
        **({"poolclass": StaticPool} if in_memory else {}),
    )

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # The sqlite3 module's own transaction handling skips BEGIN for SELECT and DDL;
        # turn it off and let the "begin" hook below emit BEGIN for every transaction.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        immediate = connection.get_execution_options().get(WRITE, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def resolve_engine(url_or_engine: UrlOrEngine) -> tuple[Engine, bool]:
    """Return an engine for `url_or_engine` and whether the caller owns (must dispose of) it."""
    if isinstance(url_or_engine, Engine):
        return url_or_engine, False
    return make_engine(url_or_engine), True


def writer(engine: Engine) -> Engine:
    """Return a view of `engine` whose transactions are marked as writing (see `WRITE`)."""
    return engine.execution_options(**{WRITE: True})


def display_url(url: URL) -> str:
    """Return the URL as it may appear in messages and logs: every password masked."""
    masked = {key: "***" for key in _SECRET_QUERY_KEYS if key in url.query}
    if masked:
        url = url.update_query_dict(masked)
    return url.render_as_string(hide_password=True)


def _secrets(url: URL) -> list[str]:
    found = [url.password] if url.password else []
    for key in _SECRET_QUERY_KEYS:
        value = url.query.get(key)
        if isinstance(value, str):
            found.append(value)
        elif value:
            found.extend(value)
    return [str(secret) for secret in found if secret]


@contextmanager
def driver_connection(engine: Engine) -> Iterator[tuple[Any, Any]]:
    """Check a connection out of the engine's pool and yield it with its driver connection, in autocommit.

    For the few statements that run on the driver directly (see `store._pg_turns`). An
    error of the driver is raised as the `DBAPIError` subclass SQLAlchemy would have raised
    for it, so `translated_errors` handles it the same way, and a connection the error left
    broken is dropped from the pool instead of being handed out again. The connection goes
    back to the pool out of autocommit, as SQLAlchemy expects it.

    Yields:
        (the pooled connection, its driver connection).
    """
    dbapi_error: type[Exception] = engine.dialect.loaded_dbapi.Error
    try:
        pooled = engine.raw_connection()
    except dbapi_error as error:  # could not connect
        raise sa_exc.DBAPIError.instance(None, None, error, dbapi_error, dialect=engine.dialect) from error
    driver: Any = pooled.driver_connection
    try:
        driver.autocommit = True
        yield pooled, driver
    except dbapi_error as error:
        invalidated = engine.dialect.is_disconnect(error, driver, None)  # type: ignore[arg-type]
        if invalidated:
            pooled.invalidate(error)
        raise sa_exc.DBAPIError.instance(
            None, None, error, dbapi_error, connection_invalidated=invalidated, dialect=engine.dialect
        ) from error
    finally:
        if pooled.is_valid:
            try:
                driver.autocommit = False
            except dbapi_error as error:
                # Left mid-statement (an interrupt): a connection in an unknown state is not reused.
                pooled.invalidate(error)
        pooled.close()


def dialect_insert(engine: Engine | Connection, table: sa.Table) -> postgresql.Insert | sqlite.Insert:
    """Return an INSERT of `table` that supports `ON CONFLICT` on this database."""
    name = engine.dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise StoreError(f"the SQL store supports PostgreSQL and SQLite, not {name!r}")


def _is_retryable(error: sa_exc.SQLAlchemyError) -> bool:
    if isinstance(error, sa_exc.DBAPIError):
        if error.connection_invalidated or isinstance(error, sa_exc.InterfaceError):
            return True
        if isinstance(error, sa_exc.OperationalError):
            # SQLite reports a missing table or column as an OperationalError too; those are
            # setup mistakes that repeating cannot fix. Locks, I/O and lost connections can.
            return not str(error.orig).startswith("no such ")
        return False
    return isinstance(error, sa_exc.TimeoutError | sa_exc.DisconnectionError)


@contextmanager
def translated_errors(engine: Engine, action: str) -> Iterator[None]:
    """Raise driver failures inside the block as `StoreUnavailableError` or `StoreError`.

    A lost connection, a serialization failure, a deadlock or a locked SQLite database
    means the transaction was rolled back, so nothing was written and the same operation
    may be repeated: `StoreUnavailableError`. Anything else is a `StoreError`. The message
    names the database without its password; the driver error is chained as the cause.
    """
    try:
        yield
    except sa_exc.SQLAlchemyError as error:
        original = error.orig if isinstance(error, sa_exc.DBAPIError) else None
        cause = original if isinstance(original, BaseException) else error
        detail = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        for secret in _secrets(engine.url):
            detail = detail.replace(secret, "***")
        kind = StoreUnavailableError if _is_retryable(error) else StoreError
        message = f"{action} failed on {display_url(engine.url)}: {type(cause).__name__}"
        raise kind(f"{message}: {detail}" if detail else message) from cause

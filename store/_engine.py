"""Engines for the SQL backends, and the translation of driver errors into store errors.

This module is the one place where SQLAlchemy engines are made, so every backend talks to
PostgreSQL and SQLite with the same connection settings.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, NoReturn, TypeAlias

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine, Row, make_url
from sqlalchemy.pool import StaticPool

from agent_runner.errors import InputLimitError, InvalidTextError, StoreError, StoreUnavailableError
from store.redaction import check_password_encoding

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


def make_engine(url: str | URL, *, pool_size: int = 5, max_overflow: int = 10) -> Engine:
    """Create an engine configured for the agent-runner tables.

    PostgreSQL (`postgresql+psycopg://...`) gets a pool of `pool_size` connections kept
    open plus `max_overflow` opened on demand, which recycles old connections. SQLite gets WAL journaling (readers never block the writer), a busy
    timeout, foreign keys, connections shareable across threads, and transactions that
    SQLAlchemy begins itself so that writers can take the lock up front (see `WRITE`).

    Pass the engine to several backends to share its pool; dispose of it when done.
    """
    if isinstance(url, str):
        try:
            check_password_encoding(url)
        except ValueError as exc:
            raise StoreError(str(exc)) from None
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed)
    if backend == "postgresql":
        return sa.create_engine(
            parsed,
            pool_size=pool_size,
            max_overflow=max_overflow,
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
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            _enable_wal(cursor)
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        immediate = connection.get_execution_options().get(WRITE, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _enable_wal(cursor: Any) -> None:
    """Switch the database to WAL journaling, waiting up to the busy timeout for a writer that holds it.

    Unlike other statements the switch does not wait for locks: while another process
    holds the write lock of a database still in its first (rollback) journal mode, as the
    process creating a new file does for a moment, it fails at once with "database is
    locked". Several processes opening a new file together would then fail at random.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    pause = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


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


_PQTRANS_IDLE = 0
"""libpq's transaction status of a connection that is idle outside a transaction."""


class DriverConnection:
    """A connection of an engine's pool, lent to `DriverConnections`: the pooled wrapper and the driver's own.

    Attributes:
        pooled: SQLAlchemy's pooled connection (what goes back to the pool).
        driver: The driver's connection (psycopg), in autocommit while lent.
        pool: The engine's pool it came from (a disposed engine has a new one).
        lent_at: `time.monotonic()` when it was taken from the pool.
        cursor: A cursor kept for reuse (its adapters stay cached), made on first use.
    """

    __slots__ = ("cursor", "driver", "lent_at", "pool", "pooled")

    def __init__(self, pooled: Any, pool: Any) -> None:
        self.pooled = pooled
        self.driver: Any = pooled.driver_connection
        self.pool = pool
        self.lent_at = time.monotonic()
        self.cursor: Any = None


def driver_cursor(lent: DriverConnection) -> Any:
    """The cursor of a lent connection, made once and reused (its adapters and prepared statements stay cached)."""
    if lent.cursor is None:
        lent.cursor = lent.driver.cursor()
    return lent.cursor


class DriverConnections:
    """A few connections of an engine's pool, kept out of it for the statements run on the driver directly.

    Taking a connection from SQLAlchemy's pool and handing it back (checkout, the reset
    with its rollback, the switch to autocommit and back) costs about as much CPU as running
    a prepared statement on it. The per-step statements of `store.turns.postgres` therefore run on
    connections kept here between uses: at most `keep` idle ones (the rest go straight back),
    in autocommit, each for at most `hold_s` seconds after it was taken from the pool (then it
    goes back, so the pool's recycling applies to it). `close` hands them all back.

    An error of the driver is raised as the `DBAPIError` subclass SQLAlchemy would have
    raised for it, so `translated_errors` handles it the same way, and a connection the error
    left broken is dropped from the pool instead of being used again.

    Args:
        engine: The engine whose pool lends the connections (PostgreSQL with psycopg).
        keep: Most idle connections kept.
        hold_s: Most seconds a connection stays out of the pool.
    """

    def __init__(self, engine: Engine, *, keep: int = 4, hold_s: float = 60.0) -> None:
        self._engine = engine
        self._keep = keep
        self._hold_s = hold_s
        self._idle: list[DriverConnection] = []
        self._closed = False
        self._error: type[Exception] = engine.dialect.loaded_dbapi.Error

    def connection(self) -> _Lending:
        """Lend a connection in autocommit for the block; it is kept for the next block unless it failed."""
        return _Lending(self)

    def _failed(self, lent: DriverConnection, error: Exception) -> sa_exc.StatementError:
        """The SQLAlchemy error for a driver error on `lent`; drops the connection when the error broke it."""
        invalidated = self._engine.dialect.is_disconnect(error, lent.driver, None)  # type: ignore[arg-type]
        if invalidated:
            lent.pooled.invalidate(error)
        return sa_exc.DBAPIError.instance(
            None, None, error, self._error, connection_invalidated=invalidated, dialect=self._engine.dialect
        )

    def close(self) -> None:
        """Hand every idle connection back to the pool; those lent right now go back when returned."""
        self._closed = True
        while self._idle:
            self._release(self._idle.pop())

    def _is_closed(self) -> bool:
        return self._closed

    def _take(self) -> DriverConnection:
        pool = self._engine.pool
        while self._idle:
            try:
                lent = self._idle.pop()
            except IndexError:  # another thread took the last one
                break
            if lent.pool is pool:
                return lent
            self._release(lent)  # the engine was disposed since: the connection belongs to its old pool
        try:
            pooled = self._engine.raw_connection()
        except self._error as error:  # could not connect
            raise sa_exc.DBAPIError.instance(None, None, error, self._error, dialect=self._engine.dialect) from error
        lent = DriverConnection(pooled, pool)
        try:
            lent.driver.autocommit = True
        except BaseException:
            pooled.close()
            raise
        return lent

    def _give_back(self, lent: DriverConnection) -> None:
        # Kept only when idle: a statement interrupted mid-way (KeyboardInterrupt) leaves it busy.
        if (
            lent.pooled.is_valid
            and lent.driver.pgconn.transaction_status == _PQTRANS_IDLE
            and not self._closed
            and len(self._idle) < self._keep
            and time.monotonic() - lent.lent_at < self._hold_s
            and lent.pool is self._engine.pool
        ):
            self._idle.append(lent)
            if self._is_closed():  # closed by another thread meanwhile: this one must not stay
                self.close()
        else:
            self._release(lent)

    def _release(self, lent: DriverConnection) -> None:
        """Hand a connection back to its pool out of autocommit, as SQLAlchemy expects it."""
        pooled = lent.pooled
        if pooled.is_valid:
            if lent.pool is not self._engine.pool:
                # Its pool was disposed of and would never close it: close it here.
                pooled.invalidate()
            else:
                try:
                    lent.driver.autocommit = False
                except self._error as error:
                    # Left mid-statement (an interrupt): a connection in an unknown state is not reused.
                    pooled.invalidate(error)
        pooled.close()


class _Lending:
    """The `with` block of `DriverConnections.connection`.

    A class rather than a generator-based context manager: it is entered once per step, and
    this costs about a sixth of the CPU of a generator-based one.
    """

    __slots__ = ("lent", "owner")

    def __init__(self, owner: DriverConnections) -> None:
        self.owner = owner

    def __enter__(self) -> DriverConnection:
        self.lent = self.owner._take()
        return self.lent

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: object) -> None:
        owner, lent = self.owner, self.lent
        try:
            if isinstance(exc, owner._error):
                raise owner._failed(lent, exc) from exc
        finally:
            owner._give_back(lent)


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


class translated_errors:  # named as the function it replaced: `with translated_errors(engine, action):`
    """Raise driver failures inside the block as `StoreUnavailableError` or `StoreError`.

    A lost connection, a serialization failure, a deadlock or a locked SQLite database
    means the transaction was rolled back, so nothing was written and the same operation
    may be repeated: `StoreUnavailableError`. Anything else is a `StoreError`. The message
    names the database without its password; the driver error is chained as the cause.

    A class rather than a generator-based context manager: every save and load enters it,
    and this costs about a sixth of the CPU of a generator-based one.
    """

    __slots__ = ("action", "engine")

    def __init__(self, engine: Engine, action: str) -> None:
        self.engine = engine
        self.action = action

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: object) -> None:
        if exc is not None and _is_unstorable_text(exc):
            _raise_unstorable(self.action, exc)
        if isinstance(exc, sa_exc.SQLAlchemyError):
            _raise_translated(self.engine, self.action, exc)


_NUL_REFUSED = "cannot contain NUL"
"""What psycopg says when a text parameter holds a NUL character, which PostgreSQL text cannot keep."""


def _is_unstorable_text(error: BaseException) -> bool:
    """Whether a driver refused a parameter for holding a lone surrogate (any driver) or a NUL (PostgreSQL)."""
    if isinstance(error, sa_exc.StatementError) and error.orig is not None:
        error = error.orig
    return isinstance(error, UnicodeEncodeError) or _NUL_REFUSED in str(error)


def _raise_unstorable(action: str, error: BaseException) -> NoReturn:
    """Raise the typed error of a parameter no store can keep (an id or text given by a caller).

    Callers check what they are given first (`agent_runner.limits`); this is the backstop for
    those that did not, so that they get `InvalidTextError` (an `InputLimitError`) instead of
    a driver's error.
    """
    cause = error.orig if isinstance(error, sa_exc.StatementError) and error.orig is not None else error
    field = f"a value given for {action}"
    if isinstance(cause, UnicodeEncodeError) and isinstance(cause.object, str):
        raise InvalidTextError(field, cause.start, cause.object[cause.start]) from None
    # The driver does not say where the NUL is.
    raise InputLimitError(field, "text without NUL characters", "a NUL character") from None


def _raise_translated(engine: Engine, action: str, error: sa_exc.SQLAlchemyError) -> NoReturn:
    """Raise `error` as the `StoreUnavailableError` or `StoreError` that `translated_errors` describes."""
    original = error.orig if isinstance(error, sa_exc.DBAPIError) else None
    cause = original if isinstance(original, BaseException) else error
    detail = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    for secret in _secrets(engine.url):
        detail = detail.replace(secret, "***")
    kind = StoreUnavailableError if _is_retryable(error) else StoreError
    message = f"{action} failed on {display_url(engine.url)}: {type(cause).__name__}"
    raise kind(f"{message}: {detail}" if detail else message) from cause

"""`SqlTurnLease`: the turn lease in a SQL table, so the embedded default needs no Redis."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from agent_runner.persistence import Lease
from store._backend import SqlBackend
from store._engine import UrlOrEngine, dialect_insert, translated_errors
from store.schema import turn_leases


class _NowMs(FunctionElement[int]):
    """The database server's clock in milliseconds since the Unix epoch.

    Expiry is judged by one clock, the server's, so workers whose clocks drift apart
    still agree on when a lease has expired.
    """

    type = sa.BigInteger()
    inherit_cache = True
    name = "now_ms"


@compiles(_NowMs, "postgresql")
def _now_ms_postgresql(element: _NowMs, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"


@compiles(_NowMs, "sqlite")
def _now_ms_sqlite(element: _NowMs, compiler: SQLCompiler, **kw: Any) -> str:
    # julianday('now') has millisecond resolution; 2440587.5 is the Julian day of the Unix epoch.
    return "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"


def _check_ttl(ttl_ms: int) -> None:
    if ttl_ms < 1:
        raise ValueError(f"a lease TTL must be a positive number of milliseconds, got {ttl_ms!r}")


def _held(lease: Lease) -> dict[str, Any]:
    """Parameters matching the row of a lease still held by its owner, with its fence."""
    return {"match_turn_id": lease.turn_id, "match_owner": lease.owner, "match_fence": lease.fence}


class SqlTurnLease(SqlBackend):
    """A `TurnLease` kept in the `agent_turn_leases` table of PostgreSQL or SQLite.

    One row per turn holds the owner, the fence and the expiry time. Acquiring is one
    INSERT ... ON CONFLICT DO UPDATE that takes the row only when it is free, expired, or
    already this owner's, and increments the fence under the row lock, so fences strictly
    increase per turn and two owners can never both hold an unexpired lease. Releasing
    keeps the row (and so the fence counter). Renew and release check owner and fence.
    Each is one autocommitted statement; on PostgreSQL it runs prepared on the driver, as
    the turn store's per-step statements do.

    Args:
        url_or_engine: A database URL or an engine to share. An engine made from a URL is
            disposed of by `close()`; one passed in is left open.
    """

    def __init__(self, url_or_engine: UrlOrEngine) -> None:
        super().__init__(url_or_engine)
        # Built once and executed with new parameters: making the SQLAlchemy construct on
        # every call costs more CPU than executing it from the compiled cache.
        now = _NowMs()
        ttl = sa.bindparam("ttl_ms", type_=sa.BigInteger)
        insert = dialect_insert(self._engine, turn_leases).values(
            turn_id=sa.bindparam("turn_id"), owner=sa.bindparam("owner"), fence=1, expires_at_ms=now + ttl
        )
        self._acquire = insert.on_conflict_do_update(
            index_elements=[turn_leases.c.turn_id],
            set_={
                "owner": insert.excluded.owner,
                "fence": turn_leases.c.fence + 1,
                "expires_at_ms": insert.excluded.expires_at_ms,
            },
            where=sa.or_(turn_leases.c.expires_at_ms <= now, turn_leases.c.owner == insert.excluded.owner),
        ).returning(turn_leases.c.fence)
        held = (
            turn_leases.c.turn_id == sa.bindparam("match_turn_id"),
            turn_leases.c.owner == sa.bindparam("match_owner"),
            turn_leases.c.fence == sa.bindparam("match_fence", type_=sa.BigInteger),
        )
        self._renew = (
            sa.update(turn_leases).where(*held, turn_leases.c.expires_at_ms > now).values(expires_at_ms=now + ttl)
        )
        # The row stays, without owner and expired, so the next acquisition continues the fence.
        self._release = sa.update(turn_leases).where(*held).values(owner=None, expires_at_ms=0)
        # The same statements as text for the driver (see `_direct`): the SQL SQLAlchemy
        # would send, and the values of their constant parameters.
        self._on_driver = {
            name: (str(compiled), dict(compiled.params))
            for name, compiled in (
                (name, statement.compile(dialect=self._engine.dialect))
                for name, statement in (
                    ("acquire", self._acquire),
                    ("renew", self._renew),
                    ("release", self._release),
                )
            )
        }

    def _on_the_driver(self, name: str, parameters: dict[str, Any]) -> Any:
        """Run one of the lease's statements prepared on a kept driver connection; return its cursor."""
        text, constants = self._on_driver[name]
        with self._driver.connection() as lent:
            if lent.cursor is None:
                lent.cursor = lent.driver.cursor()
            return lent.cursor.execute(text, {**constants, **parameters}, prepare=True)

    def acquire(self, turn_id: str, owner: str, ttl_ms: int) -> Lease | None:
        """Take the lease if it is free or expired; None when another owner holds it.

        An owner that already holds the lease gets it again with a new fence, which retires
        its earlier `Lease`.

        Raises:
            ValueError: `ttl_ms` is not positive.
        """
        _check_ttl(ttl_ms)
        parameters = {"turn_id": turn_id, "owner": owner, "ttl_ms": ttl_ms}
        with translated_errors(self._engine, f"acquiring the lease of turn {turn_id!r}"):
            if self._direct():
                row = self._on_the_driver("acquire", parameters).fetchone()
                fence = None if row is None else row[0]
            else:
                with self._statement_writer.begin() as connection:
                    fence = connection.execute(self._acquire, parameters).scalar()
        return None if fence is None else Lease(turn_id, owner, fence)

    def renew(self, lease: Lease, ttl_ms: int) -> bool:
        """Extend the lease; False when it is no longer held by this owner (expired or taken over).

        Raises:
            ValueError: `ttl_ms` is not positive.
        """
        _check_ttl(ttl_ms)
        parameters = {**_held(lease), "ttl_ms": ttl_ms}
        with translated_errors(self._engine, f"renewing the lease of turn {lease.turn_id!r}"):
            if self._direct():
                return bool(self._on_the_driver("renew", parameters).rowcount == 1)
            with self._statement_writer.begin() as connection:
                return connection.execute(self._renew, parameters).rowcount == 1

    def release(self, lease: Lease) -> bool:
        """Give the lease up; False when it was no longer held by this owner."""
        with translated_errors(self._engine, f"releasing the lease of turn {lease.turn_id!r}"):
            if self._direct():
                return bool(self._on_the_driver("release", _held(lease)).rowcount == 1)
            with self._statement_writer.begin() as connection:
                return connection.execute(self._release, _held(lease)).rowcount == 1

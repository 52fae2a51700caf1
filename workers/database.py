"""Opening a deployment's database: one engine, the SQL backends on it, the schema checked.

Every process of the project that works on the database opens it here: the Celery workers
and web apps (`workers.wiring`), the HTTP server in every worker mode, and the command
line. So all of them get the pool settings of `store.make_engine`, migrate a SQLite
database on first use like the embedded default, and refuse at start-up a database at
another schema revision than their code needs, with an error that names the database (its
password masked) and the command that fixes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Engine

import store
from store.migrations import ensure_embedded_schema
from workers.capacity import DEFAULT_POOL, PoolSize


@dataclass
class Database:
    """The SQL backends of a deployment, sharing one engine (and so one connection pool)."""

    engine: Engine = field(repr=False)
    turn_store: store.SqlAgentTurnStore
    memories: store.SqlChatMemoryProvider
    inbox: store.Inbox

    def close(self) -> None:
        """Hand back the connections the turn store keeps, then close the pool."""
        self.turn_store.close()
        self.engine.dispose()


def open_engine(database_url: str, pool: PoolSize = DEFAULT_POOL) -> Engine:
    """Return an engine on the database once its schema is the one this code needs (SQLite is migrated first).

    `pool` sizes the PostgreSQL connection pool (see `workers.capacity.database_pool`).

    Raises:
        SchemaVersionError: The tables are missing or at another revision; the message names
            the command that fixes it, `agent-runner db upgrade`.
        StoreUnavailableError: The database could not be reached.
    """
    engine = store.make_engine(database_url, pool_size=pool.size, max_overflow=pool.overflow)
    try:
        ensure_embedded_schema(engine)
        store.check_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


def open_database(database_url: str, pool: PoolSize = DEFAULT_POOL, *, coalesce_inbox: bool = False) -> Database:
    """Open the database (see `open_engine`) and the turn store, chat memories and inbox on it.

    `coalesce_inbox`: a turn started from the inbox takes all the conversation's waiting messages.

    Raises:
        SchemaVersionError: The tables are missing or at another revision.
        StoreUnavailableError: The database could not be reached.
    """
    engine = open_engine(database_url, pool)
    try:
        return Database(
            engine=engine,
            turn_store=store.SqlAgentTurnStore(engine),
            memories=store.SqlChatMemoryProvider(engine),
            inbox=store.Inbox(engine, coalesce=coalesce_inbox),
        )
    except BaseException:
        engine.dispose()
        raise


def check_database(database_url: str) -> None:
    """Check at start-up that the database's schema is the one this code needs (SQLite is migrated first).

    Raises:
        SchemaVersionError: The tables are missing or at another revision.
        StoreUnavailableError: The database could not be reached.
    """
    open_engine(database_url).dispose()

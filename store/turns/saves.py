"""How `SqlAgentTurnStore` writes a save (`TurnSaves`), and the save in a transaction through SQLAlchemy.

A store picks its `TurnSaves` once, by dialect, when it is built
(`SqlAgentTurnStore._create_saves`): `TransactionSaves` on SQLite, and on PostgreSQL the
one-statement save (`store.turns.fast_path.OneStatementSaves`), which hands the saves one
statement cannot do to a `TransactionSaves` it holds.

A save in a transaction is a compare-and-swap UPDATE of the header
(`store.turns.queries.GUARDED_UPDATE`) guarded by `version`, the message count and the
lease fence, plus INSERTs of the new messages and events only, by the rules of
`agent_runner.store_rules`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from agent_runner.errors import AgentConversationBusyException, VersionConflictError
from agent_runner.events import AgentEvent
from agent_runner.snapshot import AgentTurn, AgentTurnStatus
from agent_runner.store_rules import check_fence, kept_events, stored_snapshot
from store._engine import dialect_insert, writer
from store._event_log import SqlEventLog, needs_root_conversation
from store.schema import NON_TERMINAL_STATUSES, tenant_key, turn_messages, turns
from store.turns.cache import TurnCache
from store.turns.queries import GUARDED_UPDATE
from store.turns.rows import header, message_rows, new_row

logger = logging.getLogger("store.turns")


class SaveCounts(Protocol):
    """Where the saves that could not take the path they were meant for are counted (each is also logged): the store."""

    projection_fallbacks: int
    """Saves asked to project into ChatMemory that could not, and left it to the caller."""
    fast_path_fallbacks: int
    """One-statement saves refused for a wrong remembered count and saved in a transaction instead."""


class TurnSaves(Protocol):
    """How a turn store writes a save; each returns the stored snapshot, or None when it raced and may be tried again.

    Both raise what `SqlAgentTurnStore.save` documents, inside its `translated_errors`.
    """

    def create(self, turn: AgentTurn, events: Sequence[AgentEvent], project: bool) -> AgentTurn | None:
        """Store a new turn; None when a conflicting active turn ended meanwhile."""

    def update(
        self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent], project: bool
    ) -> AgentTurn | None:
        """Compare-and-swap a stored turn at `expected_version`; None when a remembered count was stale."""


class TransactionSaves:
    """The saves in a transaction through SQLAlchemy: every save on SQLite, and on PostgreSQL those one statement cannot do.

    Args:
        engine: The store's engine.
        cache: What the store remembers of the turns it saw (the message counts are used and kept).
        event_log: Where a save's events are placed.
        counts: Where fallbacks are counted.
    """

    def __init__(self, engine: Engine, cache: TurnCache, event_log: SqlEventLog, counts: SaveCounts) -> None:
        self.engine = engine
        self._writer = writer(engine)
        self._cache = cache
        self._event_log = event_log
        self._counts = counts

    def _write_events(self, connection: Connection, turn: AgentTurn, events: Sequence[AgentEvent]) -> None:
        """Insert the event rows of a save inside its transaction."""
        root_conversation = None
        if needs_root_conversation(turn, events):
            root_conversation = connection.execute(
                sa.select(turns.c.conversation_id).where(turns.c.id == turn.root_turn_id)
            ).scalar()
        self._event_log.write(connection, turn, kept_events(turn, events, root_conversation))

    def create(self, turn: AgentTurn, events: Sequence[AgentEvent], project: bool) -> AgentTurn | None:
        """Insert a new turn in a transaction; None when a conflicting active turn ended meanwhile (try again)."""
        stored = stored_snapshot(turn, None, -1)
        if project:
            self._projection_fallback(turn)
        # ON CONFLICT DO NOTHING covers the primary key and the active-conversation index
        # alike and, unlike a failed INSERT, leaves the PostgreSQL transaction usable for
        # finding out which of the two it was.
        insert = (
            dialect_insert(self.engine, turns).values(new_row(stored)).on_conflict_do_nothing().returning(turns.c.id)
        )
        with self._writer.begin() as connection:
            if connection.execute(insert).first() is not None:
                rows = message_rows(turn.id, turn.messages, 0)
                if rows:
                    connection.execute(sa.insert(turn_messages), rows)
                if events:
                    self._write_events(connection, stored, events)
                return stored
            existing = connection.execute(sa.select(turns.c.version).where(turns.c.id == turn.id)).scalar()
            if existing is not None:
                raise VersionConflictError(turn.id, -1, existing)
            self.raise_if_busy(connection, turn)
        return None

    def _projection_fallback(self, turn: AgentTurn) -> None:
        self._counts.projection_fallbacks += 1
        logger.info("turn %s saved without its ChatMemory projection, which follows separately", turn.id)

    def update(
        self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent], project: bool
    ) -> AgentTurn | None:
        """Compare-and-swap an existing turn in a transaction; None when a remembered count was stale (try again)."""
        known = self._cache.count(turn.id, expected_version)
        if project:
            self._projection_fallback(turn)
        # The cancel flag only ever goes from False to True and the fence only up: the UPDATE
        # merges them with the stored values, and RETURNING reads them back.
        parameters = {f"new_{name}": value for name, value in header(turn).items()}
        parameters["new_version"] = expected_version + 1
        parameters["match_id"] = turn.id
        parameters["match_version"] = expected_version
        try:
            with self._writer.begin() as connection:
                if known is None:
                    known = connection.execute(
                        sa.select(turns.c.message_count).where(
                            turns.c.id == turn.id, turns.c.version == expected_version
                        )
                    ).scalar()
                    if known is None:
                        self.raise_conflict(connection, turn, expected_version)
                        return None
                parameters["match_count"] = known
                row = connection.execute(GUARDED_UPDATE, parameters).first()
                if row is None:
                    self.raise_conflict(connection, turn, expected_version)
                    self._cache.forget_count(turn.id)
                    return None
                count = len(turn.messages)
                if count > known:
                    connection.execute(sa.insert(turn_messages), message_rows(turn.id, turn.messages, known))
                elif count < known:
                    connection.execute(
                        sa.delete(turn_messages).where(turn_messages.c.turn_id == turn.id, turn_messages.c.seq >= count)
                    )
                if events:
                    self._write_events(connection, turn, events)
        except sa_exc.IntegrityError:
            # Only the active-conversation index can refuse this UPDATE. PostgreSQL has
            # aborted the transaction, so look for the other turn on a fresh one.
            with self.engine.connect() as connection:
                self.raise_if_busy(connection, turn)
            return None
        return stored_snapshot(turn, row, expected_version)

    def raise_conflict(self, connection: Connection, turn: AgentTurn, expected_version: int) -> None:
        """Raise why a guarded UPDATE matched no row; return when only the remembered count was wrong."""
        current = connection.execute(
            sa.select(turns.c.version, turns.c.lease_fence).where(turns.c.id == turn.id)
        ).first()
        if current is None or current.version != expected_version:
            raise VersionConflictError(turn.id, expected_version, None if current is None else current.version)
        check_fence(turn, current.lease_fence)

    def raise_if_busy(self, connection: Connection, turn: AgentTurn) -> None:
        """Raise `AgentConversationBusyException` if another turn is active in the conversation of a non-terminal `turn`."""
        if turn.conversation_id is None or turn.status.is_terminal:
            return
        active = connection.execute(
            sa.select(turns.c.id, turns.c.status)
            .where(
                turns.c.conversation_id == turn.conversation_id,
                turns.c.tenant_id == tenant_key(turn.tenant_id),
                turns.c.status.in_(NON_TERMINAL_STATUSES),
                turns.c.id != turn.id,
            )
            .limit(1)
        ).first()
        if active is not None:
            raise AgentConversationBusyException(turn.conversation_id, active.id, AgentTurnStatus(active.status))

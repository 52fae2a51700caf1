"""The saves of `SqlAgentTurnStore` in a transaction through SQLAlchemy: the path on SQLite, and on PostgreSQL when one statement cannot do.

A save is a compare-and-swap UPDATE of the header (`store.turns.queries.GUARDED_UPDATE`)
guarded by `version`, the message count and the lease fence, plus INSERTs of the new
messages and events only, by the rules of `agent_runner.store_rules`. The PostgreSQL
one-statement save (`store.turns.fast_path`) builds on this class.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

from agent_runner.errors import AgentConversationBusyException, StoreUnavailableError, VersionConflictError
from agent_runner.events import AgentEvent
from agent_runner.snapshot import AgentTurn, AgentTurnStatus
from agent_runner.store_rules import check_fence, kept_events, stored_snapshot
from store._backend import SqlBackend
from store._engine import UrlOrEngine, dialect_insert, translated_errors
from store._event_log import SqlEventLog, needs_root_conversation
from store.chat_memory import SqlChatMemoryProvider
from store.schema import NON_TERMINAL_STATUSES, tenant_key, turn_messages, turns
from store.turns.cache import TurnCache
from store.turns.queries import GUARDED_UPDATE
from store.turns.rows import header, message_rows, new_row

logger = logging.getLogger("store.turns")

_SAVE_ATTEMPTS = 5


class TurnSaves(SqlBackend):
    """The save of a turn store, with what it remembers of the turns it saw (`TurnCache`)."""

    def __init__(self, url_or_engine: UrlOrEngine) -> None:
        super().__init__(url_or_engine)
        self._cache = TurnCache()
        self._event_log = SqlEventLog(self._engine)
        self.projection_fallbacks = 0
        """Saves asked to project into ChatMemory that could not, and left it to the caller."""

    def save(self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent] = ()) -> AgentTurn:
        """Store `turn` if the stored version equals `expected_version` (-1: create it).

        Returns the stored snapshot: `version` is `expected_version + 1`, `cancel_requested`
        is the stored flag or'ed with the new one, and the lease fence never goes down.

        Messages are append-only: the stored snapshot's messages must be a prefix of
        `turn.messages` (the runner only ever adds messages).

        The durable ones among `events` are written in the same transaction, so they exist
        exactly when the snapshot was saved; an event id already stored is skipped.
        Ephemeral events (MODEL_DELTA, TOOL_PROGRESS) are not stored.

        Raises:
            VersionConflictError: The stored version differs, or the turn exists when creating.
            AgentConversationBusyException: The save would give the conversation a second
                non-terminal turn.
            LeaseLostError: `turn.lease_fence` is lower than the stored fence.
            StoreError: `turn` is a child turn with events whose root turn is not stored
                (a tree's event positions are counted on its root's row); nothing was written.
            StoreUnavailableError: The database failed mid-save; nothing was written.
        """
        return self._save(turn, expected_version, events, project=False)

    def projects_into(self, provider: object) -> bool:
        """Whether `save_projected` writes the ChatMemory projection in the save: a `SqlChatMemoryProvider` here.

        True when `provider` is a `SqlChatMemoryProvider` of this store's PostgreSQL database.
        """
        return (
            self._postgres
            and isinstance(provider, SqlChatMemoryProvider)
            and (provider.engine is self._engine or provider.engine.url == self._engine.url)
        )

    def save_projected(self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent] = ()) -> AgentTurn:
        """`save`, which also appends the turn's unprojected messages to its conversation's ChatMemory.

        When the save is the one-statement save, the messages go in with it and the stored
        snapshot's `projected_count` covers them; so do the page messages of its unsynced
        page actions (read first, then inserted or changed by compare-and-swap in the same
        statement), and the returned snapshot marks those that now show their state
        synced. Otherwise the snapshot is saved alone (counted in `projection_fallbacks`
        and logged) and the caller projects it.
        """
        return self._save(turn, expected_version, events, project=turn.conversation_id is not None)

    def _save(
        self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent], *, project: bool
    ) -> AgentTurn:
        with translated_errors(self._engine, f"saving turn {turn.id!r}"):
            for _ in range(_SAVE_ATTEMPTS):
                stored = (
                    self._create(turn, events, project)
                    if expected_version == -1
                    else self._update(turn, expected_version, events, project)
                )
                if stored is not None:
                    self._cache.remember(stored)
                    return stored
        raise StoreUnavailableError(f"saving turn {turn.id!r} kept racing with concurrent writers; try again")

    def _write_events(self, connection: Connection, turn: AgentTurn, events: Sequence[AgentEvent]) -> None:
        """Insert the event rows of a save inside its transaction."""
        root_conversation = None
        if needs_root_conversation(turn, events):
            root_conversation = connection.execute(
                sa.select(turns.c.conversation_id).where(turns.c.id == turn.root_turn_id)
            ).scalar()
        self._event_log.write(connection, turn, kept_events(turn, events, root_conversation))

    def _create(self, turn: AgentTurn, events: Sequence[AgentEvent], project: bool) -> AgentTurn | None:
        """Insert a new turn in a transaction; None when a conflicting active turn ended meanwhile (try again)."""
        stored = stored_snapshot(turn, None, -1)
        if project:
            self._projection_fallback(turn)
        # ON CONFLICT DO NOTHING covers the primary key and the active-conversation index
        # alike and, unlike a failed INSERT, leaves the PostgreSQL transaction usable for
        # finding out which of the two it was.
        insert = (
            dialect_insert(self._engine, turns).values(new_row(stored)).on_conflict_do_nothing().returning(turns.c.id)
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
            self._raise_if_busy(connection, turn)
        return None

    def _projection_fallback(self, turn: AgentTurn) -> None:
        self.projection_fallbacks += 1
        logger.info("turn %s saved without its ChatMemory projection, which follows separately", turn.id)

    def _update(
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
                        self._raise_conflict(connection, turn, expected_version)
                        return None
                parameters["match_count"] = known
                row = connection.execute(GUARDED_UPDATE, parameters).first()
                if row is None:
                    self._raise_conflict(connection, turn, expected_version)
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
            with self._engine.connect() as connection:
                self._raise_if_busy(connection, turn)
            return None
        return stored_snapshot(turn, row, expected_version)

    def _raise_conflict(self, connection: Connection, turn: AgentTurn, expected_version: int) -> None:
        """Raise why a guarded UPDATE matched no row; return when only the remembered count was wrong."""
        current = connection.execute(
            sa.select(turns.c.version, turns.c.lease_fence).where(turns.c.id == turn.id)
        ).first()
        if current is None or current.version != expected_version:
            raise VersionConflictError(turn.id, expected_version, None if current is None else current.version)
        check_fence(turn, current.lease_fence)

    def _raise_if_busy(self, connection: Connection, turn: AgentTurn) -> None:
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

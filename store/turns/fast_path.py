"""The PostgreSQL fast path of `SqlAgentTurnStore`: a save as one autocommitted statement.

A statement is atomic on its own, so no BEGIN and COMMIT round trips are needed: a save of
a turn this store last saw at the expected version (it knows the stored message count)
costs one round trip, and runs prepared on the driver (`store.turns.postgres`). The other
saves (a turn this store has not seen, a snapshot that cuts its history, a child's events
whose conversation is its root's) go to the `TransactionSaves` it holds. A store on
SQLite has no `OneStatementSaves`: the saves are chosen when the store is built, by dialect
(`SqlAgentTurnStore._create_saves`).

When the one statement is refused although the stored version and fence allow the save
(its guard found another message count than the remembered one), the save falls back to
the transaction; each such fallback is counted in the store's `fast_path_fallbacks` and logged at
WARNING, so a broken fast path cannot hide behind the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from agent_runner.errors import VersionConflictError
from agent_runner.events import AgentEvent
from agent_runner.snapshot import AgentTurn
from agent_runner.store_rules import kept_events, saved_snapshot, stored_snapshot
from store._engine import DriverConnections
from store._event_log import needs_root_conversation, raise_if_no_tree
from store.schema import tenant_key, turns
from store.turns import postgres
from store.turns.cache import TurnCache
from store.turns.columns import STATE_EXCLUDED
from store.turns.saves import SaveCounts, TransactionSaves, logger


class OneStatementSaves:
    """The saves of a store on PostgreSQL: one statement where it can, else the `transaction`'s.

    Args:
        transaction: The saves one statement cannot do.
        driver: The connections kept for statements run on the driver.
        reader: The store's autocommitting engine.
        direct: Whether statements may run on the driver now (nothing watches the engine's statements).
        cache: What the store remembers of the turns it saw (the message counts decide the path).
        counts: Where fallbacks are counted.
    """

    def __init__(
        self,
        transaction: TransactionSaves,
        driver: DriverConnections,
        reader: Engine,
        direct: Callable[[], bool],
        cache: TurnCache,
        counts: SaveCounts,
    ) -> None:
        self._transaction = transaction
        self._driver = driver
        self._reader = reader
        self._direct = direct
        self._cache = cache
        self._counts = counts

    def create(self, turn: AgentTurn, events: Sequence[AgentEvent], project: bool) -> AgentTurn | None:
        """Insert a new turn in one statement, or in a transaction when its statements are watched or its events need its root's conversation."""
        # Watched statements (`_direct`) go through SQLAlchemy's transaction, where listeners see each.
        if self._direct() and not (events and needs_root_conversation(turn, events)):
            return self._create_in_one_statement(stored_snapshot(turn, None, -1), events, project)
        return self._transaction.create(turn, events, project)

    def update(
        self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent], project: bool
    ) -> AgentTurn | None:
        """Compare-and-swap a turn in one statement when the stored message count is known, else in a transaction."""
        known = self._cache.count(turn.id, expected_version)
        if known is not None and known <= len(turn.messages) and not (events and needs_root_conversation(turn, events)):
            return self._update_in_one_statement(turn, expected_version, known, events, project)
        return self._transaction.update(turn, expected_version, events, project)

    def _create_in_one_statement(
        self, stored: AgentTurn, events: Sequence[AgentEvent], project: bool
    ) -> AgentTurn | None:
        """The PostgreSQL fast path of a creation: the header, message and event INSERTs as one statement.

        One autocommitted statement on the driver (`store.turns.postgres.create_statement`) instead of a
        transaction of four; when the turn was refused (its id or its conversation taken),
        nothing was written, and reads on a fresh connection find out which. With `project`,
        as `_update_in_one_statement`.
        """
        unprojected = stored
        if project and stored.projected_count != len(stored.messages):
            stored = stored.model_copy(update={"projected_count": len(stored.messages)})
        parameters = postgres.save_parameters(
            stored,
            -1,
            0,
            stored.model_dump_json(exclude=STATE_EXCLUDED),
            stored.messages,
            kept_events(stored, events, None) if events else (),
        )
        chat = postgres.chat_parameters(unprojected, parameters) if project else None
        if chat is not None:
            parameters.update(chat)
        try:
            with self._driver.connection() as lent:
                cursor = postgres.cursor(lent)
                statement = postgres.create_statement(parameters)
                if cursor.execute(statement, parameters, prepare=True).fetchone() is not None:
                    return stored
        except sa_exc.IntegrityError as exc:
            raise_if_no_tree(exc, stored)
            raise
        with self._reader.connect() as connection:
            existing = connection.execute(sa.select(turns.c.version).where(turns.c.id == stored.id)).scalar()
            if existing is not None:
                raise VersionConflictError(stored.id, -1, existing)
            self._transaction.raise_if_busy(connection, stored)
        return None

    def _update_in_one_statement(
        self, turn: AgentTurn, expected_version: int, known: int, events: Sequence[AgentEvent], project: bool
    ) -> AgentTurn | None:
        """The PostgreSQL fast path: header UPDATE, message and event INSERTs as one autocommitted statement.

        A statement is atomic on its own, so no BEGIN and COMMIT round trips are needed: the
        save costs one round trip, and runs prepared on the driver (`store.turns.postgres.save_statement`;
        through SQLAlchemy when its statements are watched). The INSERTs read the UPDATE's
        RETURNING, so when the guard matches no row nothing at all is written. With `project`,
        the same statement appends the unprojected messages to the conversation's ChatMemory,
        and the stored snapshot says so (`projected_count`).
        """
        unprojected = turn
        if project and turn.projected_count != len(turn.messages):
            turn = turn.model_copy(update={"projected_count": len(turn.messages)})
        parameters = postgres.save_parameters(
            turn,
            expected_version,
            known,
            turn.model_dump_json(exclude=STATE_EXCLUDED),
            turn.messages[known:],
            kept_events(turn, events, None) if events else (),
        )
        pages = self._page_writes(unprojected) if project and unprojected.page_actions else None
        chat = postgres.chat_parameters(unprojected, parameters, pages.inserts if pages else None) if project else None
        if chat is not None:
            parameters.update(chat)
        if pages is not None:
            parameters.update(postgres.page_parameters(pages, chat))
        try:
            if self._direct():
                with self._driver.connection() as lent:
                    cursor = postgres.cursor(lent)
                    stored = cursor.execute(postgres.save_statement(parameters), parameters, prepare=True).fetchone()
            else:
                with self._reader.connect() as connection:
                    stored = connection.exec_driver_sql(postgres.save_statement(parameters), parameters).first()
        except sa_exc.IntegrityError as exc:
            raise_if_no_tree(exc, turn)
            with self._transaction.engine.connect() as connection:
                self._transaction.raise_if_busy(connection, turn)
            return None
        if stored is None:
            with self._reader.connect() as connection:
                self._transaction.raise_conflict(connection, turn, expected_version)
            # The stored version and fence allow this save, so the remembered count was wrong.
            self._cache.forget_count(turn.id)
            self._counts.fast_path_fallbacks += 1
            logger.warning(
                "the one-statement save of turn %s at version %d matched no row though its version and fence "
                "are current; saving it in a transaction instead",
                turn.id,
                expected_version,
            )
            return self._transaction.update(unprojected, expected_version, events, project)
        saved = saved_snapshot(
            turn, expected_version, cancel_requested=stored[0], cancel_reason=stored[1], lease_fence=stored[2]
        )
        return saved if pages is None else postgres.with_pages_synced(saved, pages, stored[3], stored[4])

    def _page_writes(self, turn: AgentTurn) -> postgres.PageWrites | None:
        """What the save of `turn` writes into its page messages: read them, and apply the actions' states.

        None when every page action is synced. One read of the unsynced actions' messages;
        the writes then go into the save's statement (`store.turns.postgres.page_parameters`).
        """
        unsynced = [action for action in turn.page_actions if not action.synced]
        if not unsynced:
            return None
        parameters = {
            "tenant": tenant_key(turn.tenant_id),
            "conversation_id": turn.conversation_id,
            "ids": [action.message_id for action in unsynced],
        }
        if self._direct():
            with self._driver.connection() as lent:
                rows = postgres.cursor(lent).execute(postgres.PAGE_MESSAGES, parameters, prepare=True).fetchall()
        else:
            with self._reader.connect() as connection:
                rows = list(connection.exec_driver_sql(postgres.PAGE_MESSAGES, parameters))
        return postgres.page_writes(unsynced, {row[0]: row[1] for row in rows})

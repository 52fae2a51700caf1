"""`SqlAgentTurnStore`: turn snapshots in PostgreSQL or SQLite.

A turn is one header row in `agent_turns` plus its messages in `agent_turn_messages`.
Messages are only ever appended, so a save writes the header and the messages added since
the stored snapshot, and costs the same at message 10 as at message 5,000. For the same
reason a store keeps the messages of the turns it recently saved or loaded, and a load
reads the header and only the messages added since (usually none), in one statement on
PostgreSQL.

The durable events of a save go to `agent_turn_events` in the same transaction (on
PostgreSQL, usually in the same single statement), each numbered in its turn tree and in
its conversation in commit order; readers page through them by those positions, and see
an event as soon as its save has committed (see `store._event_log`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from agent_runner.errors import StoreUnavailableError, TurnNotFound
from agent_runner.events import AgentEvent
from agent_runner.messages import ModelMessage, ModelMessagesAdapter
from agent_runner.persistence import DEFAULT_EVENT_PAGE, EventScope, TurnRef
from agent_runner.snapshot import AgentTurn, AgentTurnStatus
from store._backend import retention_cutoff
from store._engine import AnyRow, UrlOrEngine, translated_errors
from store._event_log import SqlEventLog
from store.chat_memory import SqlChatMemoryProvider
from store.schema import (
    NON_TERMINAL_STATUSES,
    tenant_key,
    turn_events,
    turn_leases,
    turn_messages,
    turn_steering,
    turns,
)
from store.turns import postgres
from store.turns.cache import TurnCache
from store.turns.fast_path import OneStatementSaves
from store.turns.queries import (
    CANCELLED_AMONG,
    GET_REF,
    LIST_DUE_RETRIES,
    LIST_DUE_TIMERS,
    LIST_RUNNABLE,
    LOAD_HEADER,
    MESSAGES_BETWEEN,
    PRUNABLE_ROOTS,
    REF_COLUMNS,
    turns_matching,
)
from store.turns.rows import ref, snapshot, snapshot_of
from store.turns.saves import TransactionSaves, TurnSaves
from store.turns.steering_messages import SqlSteering

_SAVE_ATTEMPTS = 5


class SqlAgentTurnStore(SqlSteering):
    """An `AgentTurnStore` and `EventLog` in PostgreSQL (psycopg 3) or SQLite, with the same behaviour as the in-memory store.

    Every save is one transaction: a compare-and-swap UPDATE of the header guarded by
    `version` and by the lease fence, plus an INSERT of the new messages and events only. On
    PostgreSQL, saving a turn this store last saw at the expected version is a single
    autocommitted statement, one round trip to the server, and so is a load; both run as
    prepared statements on the driver (`store.turns.postgres`). A partial unique index over the
    non-terminal turns of a conversation makes the one-active-turn rule hold across
    processes; a violation is reported as `AgentConversationBusyException`. It keeps the
    turns' steering messages too (`SteeringQueue`, see `store.turns.steering_messages`).

    A SQLite database is created and migrated on first use (the embedded default);
    PostgreSQL is migrated with `store.migrate` at deploy time.

    Args:
        url_or_engine: A database URL such as `postgresql+psycopg://user@host/db` or
            `sqlite:///./agent_runner.db`, or an engine to share with other backends. An
            engine made from a URL is disposed of by `close()`; one passed in is left open.

    Raises:
        StoreUnavailableError: From any method, when the database could not complete the
            operation (connection lost, serialization failure, locked); nothing was written.
    """

    def __init__(self, url_or_engine: UrlOrEngine) -> None:
        super().__init__(url_or_engine)
        self._cache = TurnCache()
        self._event_log = SqlEventLog(self._engine)
        self.projection_fallbacks = 0
        """Saves asked to project into ChatMemory that could not, and left it to the caller (each logged)."""
        self.fast_path_fallbacks = 0
        """One-statement saves refused for a wrong remembered count and saved in a transaction instead (each logged)."""
        self._saves = self._create_saves()

    def _create_saves(self) -> TurnSaves:
        """The saves of this store, chosen once by its dialect: one statement where it can on PostgreSQL, else a transaction."""
        transaction = TransactionSaves(self._engine, self._cache, self._event_log, self)
        if not self._postgres:
            return transaction
        return OneStatementSaves(transaction, self._driver, self._reader, self._direct, self._cache, self)

    # --- Saves -------------------------------------------------------------------------------

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
                    self._saves.create(turn, events, project)
                    if expected_version == -1
                    else self._saves.update(turn, expected_version, events, project)
                )
                if stored is not None:
                    self._cache.remember(stored)
                    return stored
        raise StoreUnavailableError(f"saving turn {turn.id!r} kept racing with concurrent writers; try again")

    # --- Reads -------------------------------------------------------------------------------

    def load(self, turn_id: str) -> AgentTurn:
        """Return the stored snapshot.

        A turn this store saved or loaded recently costs one query for the header, plus one
        for the messages other processes added since, if any.

        Raises:
            TurnNotFound: No turn has this id.
        """
        remembered = self._cache.history(turn_id)
        known = 0 if remembered is None else remembered[1]
        if self._direct():
            with translated_errors(self._engine, f"loading turn {turn_id!r}"):
                direct = self._load_directly(turn_id, remembered)
            self._cache.remember(direct)
            return direct
        with translated_errors(self._engine, f"loading turn {turn_id!r}"), self._reader.connect() as connection:
            header = connection.execute(LOAD_HEADER, {"turn_id": turn_id, "probe_seq": known - 1}).first()
            if header is None:
                raise TurnNotFound(turn_id)
            count = header.message_count
            if remembered is None or known > count or (known > 0 and header.probe_id != remembered[0][known - 1].id):
                # Nothing remembered, or not a prefix of what is stored now: read it all.
                known = 0
                messages: list[ModelMessage] = []
            else:
                messages = remembered[0][:known]  # a new list: extending it leaves the remembered one alone
            if known < count:
                payloads = connection.execute(
                    MESSAGES_BETWEEN, {"turn_id": turn_id, "start": known, "stop": count}
                ).scalars()
                messages.extend(ModelMessagesAdapter.validate_python(list(payloads)))
        loaded = snapshot(header, messages)
        self._cache.remember(loaded)
        return loaded

    def _load_directly(self, turn_id: str, remembered: tuple[list[ModelMessage], int] | None) -> AgentTurn:
        """`load` on PostgreSQL: the header and the messages not remembered in one prepared statement.

        When the remembered history is no longer a prefix of the stored one (another process
        cut and rewrote it), a second read takes the whole history.
        """
        known = 0 if remembered is None else remembered[1]
        with self._driver.connection() as lent:
            cursor = postgres.cursor(lent)
            row = cursor.execute(postgres.LOAD, {"id": turn_id, "known": known}, prepare=True).fetchone()
            if row is None:
                raise TurnNotFound(turn_id)
            header = postgres.header_values(row)
            probe, added = row[postgres.PROBE_INDEX], row[postgres.PROBE_INDEX + 1]
            if (
                remembered is None
                or known > header["message_count"]
                or (known > 0 and probe != remembered[0][known - 1].id)
            ):
                if known > 0:
                    # Not a prefix of what is stored now: read it all.
                    row = cursor.execute(postgres.LOAD, {"id": turn_id, "known": 0}, prepare=True).fetchone()
                    if row is None:
                        raise TurnNotFound(turn_id)
                    header, added = postgres.header_values(row), row[postgres.PROBE_INDEX + 1]
                messages: list[ModelMessage] = []
            else:
                messages = remembered[0][:known]  # a new list: extending it leaves the remembered one alone
        if added is not None:
            messages.extend(ModelMessagesAdapter.validate_json(added))
        return snapshot_of(header, messages)

    def cached_snapshot(self, turn_id: str) -> AgentTurn | None:
        """The newest snapshot of a non-terminal turn this store recently saved or read, without a query; else None.

        See `agent_runner.persistence.CachedSnapshots`: another process may have saved the turn since.
        """
        return self._cache.snapshot(turn_id)

    def get_ref(self, turn_id: str) -> TurnRef:
        """Return the stored turn's id, version, status and times: one header read, no messages.

        Raises:
            TurnNotFound: No turn has this id.
        """
        with translated_errors(self._engine, f"reading turn {turn_id!r}"):
            if self._direct():
                with self._driver.connection() as lent:
                    cursor = postgres.cursor(lent)
                    found = cursor.execute(postgres.REF, {"id": turn_id}, prepare=True).fetchone()
                if found is None:
                    raise TurnNotFound(turn_id)
                turn, version, status, updated_at, next_retry_at, cancel = found
                return TurnRef(
                    turn,
                    version,
                    AgentTurnStatus(status),
                    postgres.utc(updated_at),  # type: ignore[arg-type]
                    postgres.utc(next_retry_at),
                    cancel,
                )
            with self._reader.connect() as connection:
                row = connection.execute(GET_REF, {"turn_id": turn_id}).first()
        if row is None:
            raise TurnNotFound(turn_id)
        return ref(row)

    def cancel_requested_among(self, turn_ids: Collection[str]) -> set[str]:
        """Return the ids among `turn_ids` whose stored turn has its cancel requested: one query for all."""
        if not turn_ids:
            return set()
        with translated_errors(self._engine, f"reading the cancel flags of {len(turn_ids)} turns"):
            if self._direct():
                with self._driver.connection() as lent:
                    cursor = postgres.cursor(lent)
                    found = cursor.execute(postgres.CANCELLED_AMONG, {"ids": list(turn_ids)}, prepare=True).fetchall()
                return {row[0] for row in found}
            # An expanding IN, compiled per call: fine for the few turns SQLite serves.
            with self._reader.connect() as connection:
                rows = connection.execute(CANCELLED_AMONG, {"turn_ids": list(turn_ids)}).all()
        return {row[0] for row in rows}

    def find_active_turn(self, conversation_id: str, tenant_id: str | None = None) -> AgentTurn | None:
        """Return the non-terminal turn of the conversation `conversation_id` of `tenant_id`, or None."""
        query = (
            sa.select(turns)
            .where(
                turns.c.tenant_id == tenant_key(tenant_id),
                turns.c.conversation_id == conversation_id,
                turns.c.status.in_(NON_TERMINAL_STATUSES),
            )
            .limit(1)
        )
        with translated_errors(self._engine, f"finding the active turn of {conversation_id!r}"):
            with self._reader.connect() as connection:
                header = connection.execute(query).first()
                return None if header is None else self._assemble(connection, [header])[0]

    def list_turns(
        self,
        *,
        statuses: Sequence[AgentTurnStatus] | None = None,
        conversation_id: str | None = None,
        parent_turn_id: str | None = None,
        tenant_id: str | None = None,
        limit: int = 100,
    ) -> list[AgentTurn]:
        """Return turns matching every given filter, most recently updated first (`tenant_id`: that tenant's only)."""
        if limit <= 0:
            return []
        if self._direct():
            given = {"tenant_id": tenant_id, "conversation_id": conversation_id, "parent_turn_id": parent_turn_id}
            return self._list_directly(
                statuses, {name: value for name, value in given.items() if value is not None}, limit
            )
        query = turns_matching(
            statuses, tenant_id=tenant_id, conversation_id=conversation_id, parent_turn_id=parent_turn_id
        )
        query = query.order_by(turns.c.updated_at.desc(), turns.c.id).limit(limit)
        with translated_errors(self._engine, "listing turns"), self._reader.connect() as connection:
            headers = list(connection.execute(query))
            return self._assemble(connection, headers) if headers else []

    def _list_directly(
        self, statuses: Sequence[AgentTurnStatus] | None, columns: dict[str, str], limit: int
    ) -> list[AgentTurn]:
        """`list_turns` on PostgreSQL: the headers and their messages in one prepared statement.

        The common caller is the start of a conversation's turn, which looks at the
        conversation's last turn: one round trip instead of a query for the headers and one
        for their messages.
        """
        parameters: dict[str, Any] = {**columns, "limit": limit}
        if statuses is not None:
            parameters["statuses"] = [AgentTurnStatus(s).value for s in statuses]
        statement = postgres.list_statement(tuple(columns), statuses is not None)
        with translated_errors(self._engine, "listing turns"), self._driver.connection() as lent:
            rows = postgres.cursor(lent).execute(statement, parameters, prepare=True).fetchall()
        listed = []
        for row in rows:
            added = row[postgres.PROBE_INDEX + 1]
            messages = [] if added is None else ModelMessagesAdapter.validate_json(added)
            listed.append(snapshot_of(postgres.header_values(row), messages))
            self._cache.remember(listed[-1])
        return listed

    def list_page(
        self,
        *,
        tenant_id: str | None = None,
        statuses: Sequence[AgentTurnStatus] | None = None,
        conversation_id: str | None = None,
        agent_id: str | None = None,
        before: tuple[datetime, str] | None = None,
        limit: int = 50,
    ) -> list[AgentTurn]:
        """Return a page of turns for a listing: newest created first, without their messages.

        Every given filter must match. `before` is the `(created_at, id)` of the last turn
        of the previous page; the order is stable while turns change, so paging never skips
        or repeats a turn. The snapshots have empty `messages` (load a turn for its history).

        Args:
            tenant_id: Only turns of this tenant (None: every tenant).
            statuses: Only turns in one of these statuses.
            conversation_id: Only turns of this conversation.
            agent_id: Only turns of this agent.
            before: Only turns created before this position.
            limit: Most turns returned.
        """
        if limit <= 0:
            return []
        query = turns_matching(statuses, tenant_id=tenant_id, conversation_id=conversation_id, agent_id=agent_id)
        if before is not None:
            created, turn_id = before
            query = query.where(
                sa.or_(turns.c.created_at < created, sa.and_(turns.c.created_at == created, turns.c.id < turn_id))
            )
        query = query.order_by(turns.c.created_at.desc(), turns.c.id.desc()).limit(limit)
        with translated_errors(self._engine, "listing turns"), self._reader.connect() as connection:
            return [snapshot(header, []) for header in connection.execute(query)]

    def list_runnable(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Return RUNNING turns, and READY and RETRY_SCHEDULED turns whose `next_retry_at` (if any) has come, oldest first."""
        return self._due_refs(LIST_RUNNABLE, now, limit, "listing runnable turns")

    def list_idle(
        self, statuses: Sequence[AgentTurnStatus], updated_before: datetime, limit: int = 100
    ) -> list[TurnRef]:
        """Return turns in one of `statuses` idle since `updated_before`, oldest first (for sweeps); see `AgentTurnStore`."""
        if limit <= 0 or not statuses:
            return []
        query = (
            sa.select(*REF_COLUMNS)
            .where(
                turns.c.status.in_([s.value for s in statuses]),
                turns.c.updated_at < updated_before,
                # Implied by the line above (a status never changed after the last save), and indexed.
                turns.c.status_changed_at < updated_before,
                # A READY turn waiting for its delayed start is idle only from that start on.
                sa.or_(
                    turns.c.status != AgentTurnStatus.READY.value,
                    turns.c.next_retry_at.is_(None),
                    turns.c.next_retry_at < updated_before,
                ),
            )
            .order_by(turns.c.updated_at, turns.c.id)
            .limit(limit)
        )
        with translated_errors(self._engine, "listing idle turns"), self._reader.connect() as connection:
            return [ref(row) for row in connection.execute(query)]

    def list_due_retries(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Return RETRY_SCHEDULED turns due at `now` and READY turns whose delayed start has come, earliest due first."""
        return self._due_refs(LIST_DUE_RETRIES, now, limit, "listing due retries")

    def list_due_timers(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Return waiting turns whose deadline reminder or deadline is due at `now`, earliest first (the deadline sweep)."""
        return self._due_refs(LIST_DUE_TIMERS, now, limit, "listing due deadlines")

    def _due_refs(self, query: sa.Select[Any], now: datetime, limit: int, doing: str) -> list[TurnRef]:
        """Run one of the due-at-`now` listings of turn refs (parameters `now` and `limit`)."""
        if limit <= 0:
            return []
        with translated_errors(self._engine, doing), self._reader.connect() as connection:
            return [ref(row) for row in connection.execute(query, {"now": now, "limit": limit})]

    def read_events(
        self, scope: EventScope, *, after: str | None = None, limit: int = DEFAULT_EVENT_PAGE
    ) -> list[AgentEvent]:
        """Return up to `limit` durable events of a turn tree or a conversation after the cursor `after`.

        Events come in the order of their positions in the scope read: the order in which
        their saves committed. An event is readable as soon as its save has returned.

        Raises:
            InvalidCursorError: `after` is not a cursor of this log.
        """
        if limit <= 0:
            if after is not None:
                self._event_log.check_cursor(after)
            return []
        with translated_errors(self._engine, f"reading the events of {scope}"):
            with self._reader.connect() as connection:
                return self._event_log.read(connection, scope, after, limit)

    def _assemble(self, connection: Connection, headers: Sequence[AnyRow]) -> list[AgentTurn]:
        """Build snapshots from header rows, reading their messages in one query."""
        query = sa.select(turn_messages.c.turn_id, turn_messages.c.seq, turn_messages.c.payload)
        if len(headers) == 1:
            # Messages past the header's count belong to a save that committed after the
            # header was read; the header decides what this snapshot is.
            query = query.where(
                turn_messages.c.turn_id == headers[0].id, turn_messages.c.seq < headers[0].message_count
            )
        else:
            query = query.where(turn_messages.c.turn_id.in_([h.id for h in headers]))
        payloads: dict[str, list[Any]] = {h.id: [] for h in headers}
        counts = {h.id: h.message_count for h in headers}
        for row in connection.execute(query.order_by(turn_messages.c.turn_id, turn_messages.c.seq)):
            if row.seq < counts[row.turn_id]:
                payloads[row.turn_id].append(row.payload)
        snapshots = [snapshot(h, ModelMessagesAdapter.validate_python(payloads[h.id])) for h in headers]
        for assembled in snapshots:
            self._cache.remember(assembled)
        return snapshots

    def request_cancel(self, turn_id: str, reason: str | None = None) -> AgentTurn:
        """Set the turn's cancel flag without changing its version; return the stored snapshot.

        `reason` becomes the turn's `cancel_reason` unless an earlier request gave one.

        Raises:
            TurnNotFound: No turn has this id.
        """
        flag = {"cancel_requested": True, "cancel_reason": sa.func.coalesce(turns.c.cancel_reason, reason or None)}
        with translated_errors(self._engine, f"cancelling turn {turn_id!r}"), self._writer.begin() as connection:
            flagged = connection.execute(
                sa.update(turns).where(turns.c.id == turn_id).values(flag).returning(turns)
            ).first()
            if flagged is None:
                raise TurnNotFound(turn_id)
            return self._assemble(connection, [flagged])[0]

    # --- Retention ---------------------------------------------------------------------------

    def prune(self, older_than: timedelta, *, batch_size: int = 500) -> int:
        """Delete the turn trees that ended more than `older_than` ago; return how many turns went.

        A tree (a root turn and its descendants) goes with its messages, events and lease
        rows when every turn in it is terminal and none was saved since the limit; a tree
        with an active turn stays whole. Each batch of up to `batch_size` trees is one short
        transaction, so pruning a large backlog never holds locks for long. Conversations'
        ChatMemory is not touched; `Inbox.prune` and `WebhookDeliveryLog.prune` clear the
        inbox messages and webhook deliveries of pruned turns.

        Raises:
            ValueError: `older_than` is negative or `batch_size` is below 1.
            StoreUnavailableError: The database failed; the batches already committed stay deleted.
        """
        parameters = {"cutoff": retention_cutoff(older_than, batch_size), "limit": batch_size}
        removed = 0
        while True:
            with translated_errors(self._engine, "pruning ended turns"), self._writer.begin() as connection:
                roots = list(connection.execute(PRUNABLE_ROOTS, parameters).scalars())
                if roots:
                    tree = sa.select(turns.c.id).where(turns.c.root_turn_id.in_(roots)).scalar_subquery()
                    connection.execute(sa.delete(turn_events).where(turn_events.c.root_turn_id.in_(roots)))
                    connection.execute(sa.delete(turn_messages).where(turn_messages.c.turn_id.in_(tree)))
                    connection.execute(sa.delete(turn_leases).where(turn_leases.c.turn_id.in_(tree)))
                    connection.execute(sa.delete(turn_steering).where(turn_steering.c.turn_id.in_(tree)))
                    removed += connection.execute(sa.delete(turns).where(turns.c.root_turn_id.in_(roots))).rowcount
            if len(roots) < batch_size:
                return removed

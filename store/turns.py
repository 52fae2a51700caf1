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

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

from agent_runner.errors import (
    AgentConversationBusyException,
    LeaseLostError,
    StoreUnavailableError,
    TurnNotFound,
    VersionConflictError,
)
from agent_runner.events import AgentEvent
from agent_runner.ids import utcnow
from agent_runner.messages import ModelMessage, ModelMessagesAdapter
from agent_runner.persistence import DEFAULT_EVENT_PAGE, TurnRef, event_scope
from agent_runner.snapshot import DEADLINE_STATUSES, TERMINAL_STATUSES, AgentTurn, AgentTurnStatus
from agent_runner.store_rules import kept_events, stored_snapshot
from store import _pg_turns
from store._backend import SqlBackend
from store._engine import AnyRow, UrlOrEngine, dialect_insert, translated_errors
from store._event_log import SqlEventLog, needs_root_conversation, raise_if_no_tree
from store._histories import MessageHistories
from store.chat_memory import SqlChatMemoryProvider
from store.schema import NON_TERMINAL_STATUSES, turn_events, turn_leases, turn_messages, turns

_COLUMN_FIELDS = frozenset(
    {
        "id",
        "agent_id",
        "agent_version",
        "conversation_id",
        "parent_turn_id",
        "root_turn_id",
        "status",
        "phase",
        "version",
        "cancel_requested",
        "cancel_reason",
        "lease_fence",
        "next_retry_at",
        "created_at",
        "updated_at",
        "tenant_id",
    }
)
logger = logging.getLogger("store.turns")

_STATE_EXCLUDED = set(_COLUMN_FIELDS | {"messages"})
"""Snapshot fields kept outside the `state` JSON: the header columns, and the message table."""

_SAVE_ATTEMPTS = 5
_REMEMBERED_TURNS = 10_000

_RUNNABLE = (AgentTurnStatus.READY.value, AgentTurnStatus.RUNNING.value)


def _header(turn: AgentTurn) -> dict[str, Any]:
    return {
        "agent_id": turn.agent_id,
        "agent_version": turn.agent_version,
        "conversation_id": turn.conversation_id,
        "parent_turn_id": turn.parent_turn_id,
        "root_turn_id": turn.root_turn_id,
        "status": turn.status.value,
        "phase": turn.phase.value,
        "version": turn.version,
        "message_count": len(turn.messages),
        "cancel_requested": turn.cancel_requested,
        "lease_fence": turn.lease_fence,
        "next_retry_at": turn.next_retry_at,
        "created_at": turn.created_at,
        "updated_at": turn.updated_at,
        "tenant_id": turn.tenant_id,
        "wake_at": turn.wake_at,
        "state": turn.model_dump(mode="json", exclude=_STATE_EXCLUDED),
    }


def _new_row(turn: AgentTurn) -> dict[str, Any]:
    """The column values of a new turn's header row."""
    return {"id": turn.id, **_header(turn), "status_changed_at": turn.updated_at}


def _message_rows(turn_id: str, messages: Sequence[ModelMessage], start: int) -> list[dict[str, Any]]:
    return [
        {
            "turn_id": turn_id,
            "seq": seq,
            "message_id": message.id,
            "role": message.role,
            "payload": message.model_dump(mode="json"),
        }
        for seq, message in enumerate(messages[start:], start)
    ]


def _snapshot(header: AnyRow, messages: list[ModelMessage]) -> AgentTurn:
    """Build a snapshot from its header row and its messages, already validated (see `_snapshot_of`)."""
    return _snapshot_of(header._mapping, messages)  # type: ignore[arg-type]  # a RowMapping is a Mapping


def _snapshot_of(header: Mapping[str, Any], messages: list[ModelMessage]) -> AgentTurn:
    """Build a snapshot from its header columns by name and its messages, already validated.

    Only the header goes through validation here: validating a message costs far more than
    the header, and the messages are either just validated or taken from an earlier snapshot.
    """
    data = dict(header["state"])
    for name in _COLUMN_FIELDS:
        data[name] = header[name]
    data["messages"] = []
    return AgentTurn.model_validate(data).model_copy(update={"messages": messages})


def _status_changed_at() -> sa.ColumnElement[datetime]:
    """The new `status_changed_at` of a guarded UPDATE: kept while the status stays, else `updated_at`.

    Kept only while it is not later than the new `updated_at`, so that it never is (a
    clock that went back would otherwise leave it in the future).
    """
    updated = sa.bindparam("new_updated_at", type_=turns.c.updated_at.type)
    unchanged = sa.and_(
        turns.c.status == sa.bindparam("new_status", type_=turns.c.status.type),
        turns.c.status_changed_at <= updated,
    )
    return sa.case((unchanged, turns.c.status_changed_at), else_=updated)


@lru_cache(maxsize=4)
def _guarded_update(sets_cancel: bool, sets_fence: bool) -> sa.Update:
    """The compare-and-swap UPDATE of a header, built once per shape and reused with new parameters.

    It matches only the expected version and message count, and a fence no lower than the
    stored one; parameters are `new_<column>` and `match_id/version/count/fence`.
    """
    # The tree's event counter is bumped by the writing of events, and the cancel reason is
    # written by `request_cancel` alone: no save sets either from a snapshot.
    skipped = {"event_position", "cancel_reason"}
    if not sets_cancel:
        skipped.add("cancel_requested")
    if not sets_fence:
        skipped.add("lease_fence")
    values: dict[Any, Any] = {
        column: sa.bindparam(f"new_{column.name}", type_=column.type)
        for column in turns.columns
        if column.name not in ("id", "status_changed_at") and column.name not in skipped
    }
    values[turns.c.status_changed_at] = _status_changed_at()
    conditions = [
        turns.c.id == sa.bindparam("match_id"),
        turns.c.version == sa.bindparam("match_version"),
        turns.c.message_count == sa.bindparam("match_count"),
    ]
    if sets_fence:
        fence = sa.bindparam("match_fence", type_=turns.c.lease_fence.type)
        conditions.append(sa.or_(turns.c.lease_fence.is_(None), turns.c.lease_fence <= fence))
    return sa.update(turns).where(*conditions).values(values).returning(turns.c.cancel_requested, turns.c.lease_fence)


def _ref(row: AnyRow) -> TurnRef:
    return TurnRef(
        row.id, row.version, AgentTurnStatus(row.status), row.updated_at, row.next_retry_at, row.cancel_requested
    )


_REF_COLUMNS = (
    turns.c.id,
    turns.c.version,
    turns.c.status,
    turns.c.updated_at,
    turns.c.next_retry_at,
    turns.c.cancel_requested,
)

_GET_REF = sa.select(*_REF_COLUMNS).where(turns.c.id == sa.bindparam("turn_id"))
"""The header fields of a `TurnRef`; parameter `turn_id`."""

_DUE_RETRY = sa.and_(
    turns.c.status == AgentTurnStatus.RETRY_SCHEDULED.value,
    sa.or_(
        turns.c.next_retry_at.is_(None), turns.c.next_retry_at <= sa.bindparam("now", type_=turns.c.next_retry_at.type)
    ),
)

_LIST_RUNNABLE = (
    sa.select(*_REF_COLUMNS)
    .where(sa.or_(turns.c.status.in_(_RUNNABLE), _DUE_RETRY))
    .order_by(turns.c.updated_at, turns.c.id)
    .limit(sa.bindparam("limit", type_=sa.Integer))
)
"""The poll of the embedded workers; parameters `now` and `limit`."""

_LIST_DUE_RETRIES = (
    sa.select(*_REF_COLUMNS)
    .where(_DUE_RETRY)
    .order_by(turns.c.next_retry_at, turns.c.id)
    .limit(sa.bindparam("limit", type_=sa.Integer))
)
"""The due-retry sweep; parameters `now` and `limit`."""

_LIST_DUE_TIMERS = (
    sa.select(*_REF_COLUMNS)
    .where(
        turns.c.wake_at <= sa.bindparam("now", type_=turns.c.wake_at.type),
        turns.c.status.in_([s.value for s in DEADLINE_STATUSES]),
    )
    .order_by(turns.c.wake_at, turns.c.id)
    .limit(sa.bindparam("limit", type_=sa.Integer))
)
"""The deadline sweep: waiting turns whose reminder or deadline has come; parameters `now` and `limit`."""

_LOAD_HEADER = (
    sa.select(turns, turn_messages.c.message_id.label("probe_id"))
    .select_from(
        turns.outerjoin(
            turn_messages,
            sa.and_(turn_messages.c.turn_id == turns.c.id, turn_messages.c.seq == sa.bindparam("probe_seq")),
        )
    )
    .where(turns.c.id == sa.bindparam("turn_id"))
)
"""A turn's header, plus the id of its message at `probe_seq` (NULL when there is none).

The probe checks in the same round trip that the last message of a remembered history is
still the one stored at its position; parameters `turn_id` and `probe_seq`.
"""

_MESSAGES_BETWEEN = (
    sa.select(turn_messages.c.payload)
    .where(
        turn_messages.c.turn_id == sa.bindparam("turn_id"),
        turn_messages.c.seq >= sa.bindparam("start"),
        turn_messages.c.seq < sa.bindparam("stop"),
    )
    .order_by(turn_messages.c.seq)
)
"""Payloads of a turn's messages `start <= seq < stop`, in order."""


_descendant = turns.alias("descendant")
_PRUNABLE_ROOTS = (
    sa.select(turns.c.id)
    .where(
        turns.c.id == turns.c.root_turn_id,
        turns.c.status.in_([s.value for s in TERMINAL_STATUSES]),
        turns.c.updated_at < sa.bindparam("cutoff", type_=turns.c.updated_at.type),
        # Implied by the line above (a status never changed after the last save), and indexed.
        turns.c.status_changed_at < sa.bindparam("cutoff", type_=turns.c.updated_at.type),
        ~sa.exists().where(
            _descendant.c.root_turn_id == turns.c.id,
            sa.or_(
                _descendant.c.status.in_(NON_TERMINAL_STATUSES),
                _descendant.c.updated_at >= sa.bindparam("cutoff", type_=turns.c.updated_at.type),
            ),
        ),
    )
    .order_by(turns.c.updated_at, turns.c.id)
    .limit(sa.bindparam("limit", type_=sa.Integer))
    .with_for_update(skip_locked=True)
)
"""Root turns whose whole tree ended before `cutoff`, oldest first; parameters `cutoff` and `limit`.

Rows another pruner has locked are skipped (PostgreSQL), so two pruners share the work.
"""


class SqlAgentTurnStore(SqlBackend):
    """An `AgentTurnStore` and `EventLog` in PostgreSQL (psycopg 3) or SQLite, with the same behaviour as the in-memory store.

    Every save is one transaction: a compare-and-swap UPDATE of the header guarded by
    `version` and by the lease fence, plus an INSERT of the new messages and events only. On
    PostgreSQL, saving a turn this store last saw at the expected version is a single
    autocommitted statement, one round trip to the server, and so is a load; both run as
    prepared statements on the driver (`store._pg_turns`). A partial unique index over the
    non-terminal turns of a conversation makes the one-active-turn rule hold across
    processes; a violation is reported as `AgentConversationBusyException`.

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
        # (version, message_count) of recently seen snapshots. A save whose expected
        # version is remembered knows which messages are new without reading the header
        # first; the UPDATE still checks the count, so a wrong entry costs a retry, never data.
        self._counts: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._counts_lock = threading.Lock()
        self._histories = MessageHistories()
        self._event_log = SqlEventLog(self._engine)
        self.projection_fallbacks = 0
        """Saves asked to project into ChatMemory that could not, and left it to the caller."""

    # --- Reads -------------------------------------------------------------------------------

    def load(self, turn_id: str) -> AgentTurn:
        """Return the stored snapshot.

        A turn this store saved or loaded recently costs one query for the header, plus one
        for the messages other processes added since, if any.

        Raises:
            TurnNotFound: No turn has this id.
        """
        remembered = self._histories.get(turn_id)
        known = 0 if remembered is None else remembered[1]
        if self._direct():
            with translated_errors(self._engine, f"loading turn {turn_id!r}"):
                snapshot = self._load_directly(turn_id, remembered)
            self._remember(snapshot)
            return snapshot
        with translated_errors(self._engine, f"loading turn {turn_id!r}"), self._reader.connect() as connection:
            header = connection.execute(_LOAD_HEADER, {"turn_id": turn_id, "probe_seq": known - 1}).first()
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
                    _MESSAGES_BETWEEN, {"turn_id": turn_id, "start": known, "stop": count}
                ).scalars()
                messages.extend(ModelMessagesAdapter.validate_python(list(payloads)))
        snapshot = _snapshot(header, messages)
        self._remember(snapshot)
        return snapshot

    def _load_directly(self, turn_id: str, remembered: tuple[list[ModelMessage], int] | None) -> AgentTurn:
        """`load` on PostgreSQL: the header and the messages not remembered in one prepared statement.

        When the remembered history is no longer a prefix of the stored one (another process
        cut and rewrote it), a second read takes the whole history.
        """
        known = 0 if remembered is None else remembered[1]
        with self._driver.connection() as lent:
            cursor = _pg_turns.cursor(lent)
            row = cursor.execute(_pg_turns.LOAD, {"id": turn_id, "known": known}, prepare=True).fetchone()
            if row is None:
                raise TurnNotFound(turn_id)
            header = _pg_turns.header_values(row)
            probe, added = row[_pg_turns.PROBE_INDEX], row[_pg_turns.PROBE_INDEX + 1]
            if (
                remembered is None
                or known > header["message_count"]
                or (known > 0 and probe != remembered[0][known - 1].id)
            ):
                if known > 0:
                    # Not a prefix of what is stored now: read it all.
                    row = cursor.execute(_pg_turns.LOAD, {"id": turn_id, "known": 0}, prepare=True).fetchone()
                    if row is None:
                        raise TurnNotFound(turn_id)
                    header, added = _pg_turns.header_values(row), row[_pg_turns.PROBE_INDEX + 1]
                messages: list[ModelMessage] = []
            else:
                messages = remembered[0][:known]  # a new list: extending it leaves the remembered one alone
        if added is not None:
            messages.extend(ModelMessagesAdapter.validate_json(added))
        return _snapshot_of(header, messages)

    def get_ref(self, turn_id: str) -> TurnRef:
        """Return the stored turn's id, version, status and times: one header read, no messages.

        Raises:
            TurnNotFound: No turn has this id.
        """
        with translated_errors(self._engine, f"reading turn {turn_id!r}"):
            if self._direct():
                with self._driver.connection() as lent:
                    cursor = _pg_turns.cursor(lent)
                    found = cursor.execute(_pg_turns.REF, {"id": turn_id}, prepare=True).fetchone()
                if found is None:
                    raise TurnNotFound(turn_id)
                turn, version, status, updated_at, next_retry_at, cancel = found
                return TurnRef(
                    turn,
                    version,
                    AgentTurnStatus(status),
                    _pg_turns.utc(updated_at),  # type: ignore[arg-type]
                    _pg_turns.utc(next_retry_at),
                    cancel,
                )
            with self._reader.connect() as connection:
                row = connection.execute(_GET_REF, {"turn_id": turn_id}).first()
        if row is None:
            raise TurnNotFound(turn_id)
        return _ref(row)

    def find_active_turn(self, conversation_id: str) -> AgentTurn | None:
        """Return the conversation's non-terminal turn, or None."""
        query = (
            sa.select(turns)
            .where(turns.c.conversation_id == conversation_id, turns.c.status.in_(NON_TERMINAL_STATUSES))
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
        query = sa.select(turns)
        if tenant_id is not None:
            query = query.where(turns.c.tenant_id == tenant_id)
        if statuses is not None:
            query = query.where(turns.c.status.in_([AgentTurnStatus(s).value for s in statuses]))
        if conversation_id is not None:
            query = query.where(turns.c.conversation_id == conversation_id)
        if parent_turn_id is not None:
            query = query.where(turns.c.parent_turn_id == parent_turn_id)
        query = query.order_by(turns.c.updated_at.desc(), turns.c.id).limit(limit)
        with translated_errors(self._engine, "listing turns"), self._reader.connect() as connection:
            headers = list(connection.execute(query))
            return self._assemble(connection, headers) if headers else []

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
        query = sa.select(turns)
        if tenant_id is not None:
            query = query.where(turns.c.tenant_id == tenant_id)
        if statuses is not None:
            query = query.where(turns.c.status.in_([AgentTurnStatus(s).value for s in statuses]))
        if conversation_id is not None:
            query = query.where(turns.c.conversation_id == conversation_id)
        if agent_id is not None:
            query = query.where(turns.c.agent_id == agent_id)
        if before is not None:
            created, turn_id = before
            query = query.where(
                sa.or_(turns.c.created_at < created, sa.and_(turns.c.created_at == created, turns.c.id < turn_id))
            )
        query = query.order_by(turns.c.created_at.desc(), turns.c.id.desc()).limit(limit)
        with translated_errors(self._engine, "listing turns"), self._reader.connect() as connection:
            return [_snapshot(header, []) for header in connection.execute(query)]

    def list_runnable(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Return READY and RUNNING turns and RETRY_SCHEDULED turns due at `now`, oldest first."""
        if limit <= 0:
            return []
        with translated_errors(self._engine, "listing runnable turns"), self._reader.connect() as connection:
            return [_ref(row) for row in connection.execute(_LIST_RUNNABLE, {"now": now, "limit": limit})]

    def list_stale_running(self, updated_before: datetime, limit: int = 100) -> list[TurnRef]:
        """Return RUNNING turns whose last save is older than `updated_before`, oldest first."""
        return self.list_idle([AgentTurnStatus.RUNNING], updated_before, limit)

    def list_idle(
        self, statuses: Sequence[AgentTurnStatus], updated_before: datetime, limit: int = 100
    ) -> list[TurnRef]:
        """Return turns in one of `statuses` not saved since `updated_before`, oldest first (for sweeps)."""
        if limit <= 0 or not statuses:
            return []
        query = (
            sa.select(*_REF_COLUMNS)
            .where(
                turns.c.status.in_([s.value for s in statuses]),
                turns.c.updated_at < updated_before,
                # Implied by the line above (a status never changed after the last save), and indexed.
                turns.c.status_changed_at < updated_before,
            )
            .order_by(turns.c.updated_at, turns.c.id)
            .limit(limit)
        )
        with translated_errors(self._engine, "listing idle turns"), self._reader.connect() as connection:
            return [_ref(row) for row in connection.execute(query)]

    def list_due_retries(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Return RETRY_SCHEDULED turns due at `now`, earliest due first."""
        if limit <= 0:
            return []
        with translated_errors(self._engine, "listing due retries"), self._reader.connect() as connection:
            return [_ref(row) for row in connection.execute(_LIST_DUE_RETRIES, {"now": now, "limit": limit})]

    def list_due_timers(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Return waiting turns whose deadline reminder or deadline is due at `now`, earliest first (the deadline sweep)."""
        if limit <= 0:
            return []
        with translated_errors(self._engine, "listing due deadlines"), self._reader.connect() as connection:
            return [_ref(row) for row in connection.execute(_LIST_DUE_TIMERS, {"now": now, "limit": limit})]

    def read_events(
        self,
        *,
        root_turn_id: str | None = None,
        conversation_id: str | None = None,
        after: str | None = None,
        limit: int = DEFAULT_EVENT_PAGE,
    ) -> list[AgentEvent]:
        """Return up to `limit` durable events of a turn tree or a conversation after the cursor `after`.

        Events come in the order of their positions in the scope read: the order in which
        their saves committed. An event is readable as soon as its save has returned.

        Raises:
            InvalidEventQuery: Neither or both of `root_turn_id` and `conversation_id` were given.
            InvalidCursor: `after` is not a cursor of this log.
        """
        scope, value = event_scope(root_turn_id, conversation_id)
        if limit <= 0:
            if after is not None:
                self._event_log.check_cursor(after)
            return []
        with translated_errors(self._engine, f"reading the events of {scope} {value!r}"):
            with self._reader.connect() as connection:
                return self._event_log.read(connection, scope, value, after, limit)

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
        snapshots = [_snapshot(h, ModelMessagesAdapter.validate_python(payloads[h.id])) for h in headers]
        for snapshot in snapshots:
            self._remember(snapshot)
        return snapshots

    # --- Writes ------------------------------------------------------------------------------

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
        snapshot's `projected_count` covers them; otherwise the snapshot is saved alone
        (counted in `projection_fallbacks` and logged) and the caller projects it.
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
                    self._remember(stored)
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

    def _create(self, turn: AgentTurn, events: Sequence[AgentEvent], project: bool = False) -> AgentTurn | None:
        """Insert a new turn; None when a conflicting active turn ended meanwhile (try again)."""
        stored = stored_snapshot(turn, None, -1)
        if self._direct() and not (events and needs_root_conversation(stored, events)):
            return self._create_in_one_statement(stored, events, project)
        if project:
            self._projection_fallback(turn)
        # ON CONFLICT DO NOTHING covers the primary key and the active-conversation index
        # alike and, unlike a failed INSERT, leaves the PostgreSQL transaction usable for
        # finding out which of the two it was.
        insert = (
            dialect_insert(self._engine, turns).values(_new_row(stored)).on_conflict_do_nothing().returning(turns.c.id)
        )
        with self._writer.begin() as connection:
            if connection.execute(insert).first() is not None:
                rows = _message_rows(turn.id, turn.messages, 0)
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

    def _create_in_one_statement(
        self, stored: AgentTurn, events: Sequence[AgentEvent], project: bool
    ) -> AgentTurn | None:
        """The PostgreSQL fast path of a creation: the header, message and event INSERTs as one statement.

        One autocommitted statement on the driver (`store._pg_turns.create_statement`) instead of a
        transaction of four; when the turn was refused (its id or its conversation taken),
        nothing was written, and reads on a fresh connection find out which. With `project`,
        as `_update_in_one_statement`.
        """
        unprojected = stored
        if project and stored.projected_count != len(stored.messages):
            stored = stored.model_copy(update={"projected_count": len(stored.messages)})
        parameters = _pg_turns.save_parameters(
            stored,
            -1,
            0,
            stored.model_dump_json(exclude=_STATE_EXCLUDED),
            stored.messages,
            kept_events(stored, events, None) if events else (),
        )
        chat = _pg_turns.chat_parameters(unprojected, parameters) if project else None
        if chat is not None:
            parameters.update(chat)
        try:
            with self._driver.connection() as lent:
                cursor = _pg_turns.cursor(lent)
                statement = _pg_turns.create_statement(parameters)
                if cursor.execute(statement, parameters, prepare=True).fetchone() is not None:
                    return stored
        except sa_exc.IntegrityError as exc:
            raise_if_no_tree(exc, stored)
            raise
        with self._reader.connect() as connection:
            existing = connection.execute(sa.select(turns.c.version).where(turns.c.id == stored.id)).scalar()
            if existing is not None:
                raise VersionConflictError(stored.id, -1, existing)
            self._raise_if_busy(connection, stored)
        return None

    def _update(
        self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent], project: bool = False
    ) -> AgentTurn | None:
        """Compare-and-swap an existing turn; None when a remembered count was stale (try again)."""
        known = self._remembered_count(turn.id, expected_version)
        if (
            known is not None
            and self._postgres
            and known <= len(turn.messages)
            and not (events and needs_root_conversation(turn, events))
        ):
            return self._update_in_one_statement(turn, expected_version, known, events, project)
        if project:
            self._projection_fallback(turn)
        # The cancel flag only ever goes from False to True and the fence only up, so a
        # snapshot without them leaves the stored values alone; RETURNING reads them back.
        sets_cancel = turn.cancel_requested
        sets_fence = turn.lease_fence is not None
        parameters = {f"new_{name}": value for name, value in _header(turn).items()}
        parameters["new_version"] = expected_version + 1
        parameters["match_id"] = turn.id
        parameters["match_version"] = expected_version
        parameters["match_fence"] = turn.lease_fence
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
                row = connection.execute(_guarded_update(sets_cancel, sets_fence), parameters).first()
                if row is None:
                    self._raise_conflict(connection, turn, expected_version)
                    self._forget(turn.id)
                    return None
                count = len(turn.messages)
                if count > known:
                    connection.execute(sa.insert(turn_messages), _message_rows(turn.id, turn.messages, known))
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
        stored = turn.model_copy(update={"cancel_requested": row.cancel_requested, "lease_fence": row.lease_fence})
        return stored_snapshot(turn, stored, expected_version)

    def _update_in_one_statement(
        self, turn: AgentTurn, expected_version: int, known: int, events: Sequence[AgentEvent], project: bool
    ) -> AgentTurn | None:
        """The PostgreSQL fast path: header UPDATE, message and event INSERTs as one autocommitted statement.

        A statement is atomic on its own, so no BEGIN and COMMIT round trips are needed: the
        save costs one round trip, and runs prepared on the driver (`store._pg_turns.save_statement`;
        through SQLAlchemy when its statements are watched). The INSERTs read the UPDATE's
        RETURNING, so when the guard matches no row nothing at all is written. With `project`,
        the same statement appends the unprojected messages to the conversation's ChatMemory,
        and the stored snapshot says so (`projected_count`).
        """
        unprojected = turn
        if project and turn.projected_count != len(turn.messages):
            turn = turn.model_copy(update={"projected_count": len(turn.messages)})
        parameters = _pg_turns.save_parameters(
            turn,
            expected_version,
            known,
            turn.model_dump_json(exclude=_STATE_EXCLUDED),
            turn.messages[known:],
            kept_events(turn, events, None) if events else (),
        )
        chat = _pg_turns.chat_parameters(unprojected, parameters) if project else None
        if chat is not None:
            parameters.update(chat)
        try:
            if self._direct():
                with self._driver.connection() as lent:
                    cursor = _pg_turns.cursor(lent)
                    stored = cursor.execute(_pg_turns.save_statement(parameters), parameters, prepare=True).fetchone()
            else:
                with self._reader.connect() as connection:
                    stored = connection.exec_driver_sql(_pg_turns.save_statement(parameters), parameters).first()
        except sa_exc.IntegrityError as exc:
            raise_if_no_tree(exc, turn)
            with self._engine.connect() as connection:
                self._raise_if_busy(connection, turn)
            return None
        if stored is None:
            with self._reader.connect() as connection:
                self._raise_conflict(connection, turn, expected_version)
            self._forget(turn.id)
            return None
        # What `stored_snapshot` gives for the stored flag and fence, in one copy.
        update: dict[str, object] = {"version": expected_version + 1}
        cancel, fence = stored
        if cancel != turn.cancel_requested:
            update["cancel_requested"] = cancel
        if fence != turn.lease_fence:
            update["lease_fence"] = fence
        return turn.model_copy(update=update)

    def _raise_conflict(self, connection: Connection, turn: AgentTurn, expected_version: int) -> None:
        """Raise why a guarded UPDATE matched no row; return when only the remembered count was wrong."""
        current = connection.execute(
            sa.select(turns.c.version, turns.c.lease_fence).where(turns.c.id == turn.id)
        ).first()
        if current is None or current.version != expected_version:
            raise VersionConflictError(turn.id, expected_version, None if current is None else current.version)
        if turn.lease_fence is not None and current.lease_fence is not None and turn.lease_fence < current.lease_fence:
            raise LeaseLostError(turn.id, turn.lease_fence)

    def _raise_if_busy(self, connection: Connection, turn: AgentTurn) -> None:
        if turn.conversation_id is None or turn.status.is_terminal:
            return
        active = connection.execute(
            sa.select(turns.c.id, turns.c.status)
            .where(
                turns.c.conversation_id == turn.conversation_id,
                turns.c.status.in_(NON_TERMINAL_STATUSES),
                turns.c.id != turn.id,
            )
            .limit(1)
        ).first()
        if active is not None:
            raise AgentConversationBusyException(turn.conversation_id, active.id, AgentTurnStatus(active.status))

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
        ChatMemory and inbox rows are not touched.

        Raises:
            ValueError: `older_than` is negative or `batch_size` is below 1.
            StoreUnavailableError: The database failed; the batches already committed stay deleted.
        """
        if older_than < timedelta(0):
            raise ValueError(f"older_than must not be negative, got {older_than!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")
        parameters = {"cutoff": utcnow() - older_than, "limit": batch_size}
        removed = 0
        while True:
            with translated_errors(self._engine, "pruning ended turns"), self._writer.begin() as connection:
                roots = list(connection.execute(_PRUNABLE_ROOTS, parameters).scalars())
                if roots:
                    tree = sa.select(turns.c.id).where(turns.c.root_turn_id.in_(roots)).scalar_subquery()
                    connection.execute(sa.delete(turn_events).where(turn_events.c.root_turn_id.in_(roots)))
                    connection.execute(sa.delete(turn_messages).where(turn_messages.c.turn_id.in_(tree)))
                    connection.execute(sa.delete(turn_leases).where(turn_leases.c.turn_id.in_(tree)))
                    removed += connection.execute(sa.delete(turns).where(turns.c.root_turn_id.in_(roots))).rowcount
            if len(roots) < batch_size:
                return removed

    # --- Remembered message counts and histories ---------------------------------------------

    def _remember(self, turn: AgentTurn) -> None:
        with self._counts_lock:
            self._counts[turn.id] = (turn.version, len(turn.messages))
            self._counts.move_to_end(turn.id)
            if len(self._counts) > _REMEMBERED_TURNS:
                self._counts.popitem(last=False)
        self._histories.put(turn)

    def _remembered_count(self, turn_id: str, version: int) -> int | None:
        with self._counts_lock:
            entry = self._counts.get(turn_id)
        return entry[1] if entry is not None and entry[0] == version else None

    def _forget(self, turn_id: str) -> None:
        with self._counts_lock:
            self._counts.pop(turn_id, None)

"""`ThreadRecords`: what a conversation managed as a thread has beyond its messages and turns.

A LangGraph client creates a thread before it runs anything on it, gives it metadata and
searches threads by it. The thread *is* the conversation: its messages stay in the chat
memory and its runs are the conversation's turns. This table only holds the thread's own
facts: its owner, metadata, creation time, and its deletion (a deleted thread is kept as
a tombstone, so its id is never handed out again while the turns and messages stay).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from agent_runner.ids import utcnow
from agent_runner.persistence import ConversationKey
from agent_runner.snapshot import WAITING_FOR_A_PERSON, AgentTurnStatus
from store._backend import SqlBackend
from store._engine import AnyRow, dialect_insert, translated_errors
from store.schema import NON_TERMINAL_STATUSES, tenant_key, tenant_of, threads, turns

ThreadStatus = Literal["idle", "busy", "interrupted", "error"]
"""A thread's status, from its conversation's turns (see `ThreadQuery`)."""

ThreadSort = Literal["created_at", "updated_at", "thread_id", "status"]

FAILED_STATUSES = frozenset(
    s for s in AgentTurnStatus if s.is_terminal and s not in (AgentTurnStatus.COMPLETED, AgentTurnStatus.CANCELLED)
)
"""Statuses of a newest turn that make its thread `error`: ended without its answer, and not by a cancel."""


@dataclass(frozen=True)
class ThreadRecord:
    """A stored thread.

    Attributes:
        conversation_id: The conversation, with `tenant_id` (a thread is its conversation).
        thread_id: The id the client knows.
        tenant_id: The owning tenant (None on a single-tenant server).
        metadata: The client's metadata.
        created_at: When the thread was created.
        updated_at: When its metadata last changed.
        deleted_at: When it was deleted (None while it exists).
    """

    conversation_id: str
    thread_id: str
    tenant_id: str | None
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None

    @property
    def conversation(self) -> ConversationKey:
        """The thread's conversation: its id and its tenant."""
        return ConversationKey(self.conversation_id, self.tenant_id)


def _record(row: AnyRow) -> ThreadRecord:
    return ThreadRecord(
        conversation_id=row.conversation_id,
        thread_id=row.thread_id,
        tenant_id=tenant_of(row.tenant_id),
        metadata=dict(row.metadata or {}),
        created_at=row.created_at,
        updated_at=row.updated_at,
        deleted_at=row.deleted_at,
    )


@dataclass(frozen=True)
class ThreadQuery:
    """Which of a tenant's live threads a search finds, and in what order.

    A thread's status follows from its conversation's turns: `busy` while a turn is active,
    `interrupted` while the active turn waits for a person, `error` when the newest turn
    ended failed, else `idle`. Metadata matches as JSON containment on PostgreSQL
    (`metadata @> filter`); on SQLite each key's value must equal the filter's (the same for
    scalar values, stricter for nested objects and lists).

    Attributes:
        tenant_id: The owning tenant (None on a single-tenant server).
        conversation_id: Only this conversation's thread (a token limited to one conversation).
        thread_ids: Only threads with one of these ids.
        metadata: Only threads whose metadata holds these keys and values.
        status: Only threads in this status.
        sort_by: The order: by creation or update time, id or status (ties broken by the stored id).
        descending: Largest first.
    """

    tenant_id: str | None
    conversation_id: str | None = None
    thread_ids: Sequence[str] | None = None
    metadata: dict[str, Any] | None = None
    status: ThreadStatus | None = None
    sort_by: ThreadSort = "created_at"
    descending: bool = True


def _thread_turns() -> tuple[sa.ColumnElement[bool], ...]:
    """The conditions that select the turns of each thread's conversation (its tenant's, with its id)."""
    return (
        turns.c.conversation_id == threads.c.conversation_id,
        turns.c.tenant_id == threads.c.tenant_id,
    )


def _newest_turn() -> Any:
    """The newest turn of each thread's conversation (a correlated subquery), as `status` and `updated_at`."""
    return (
        sa.select(turns.c.status, turns.c.updated_at)
        .where(*_thread_turns())
        .order_by(turns.c.created_at.desc(), turns.c.id.desc())
        .limit(1)
        .correlate(threads)
    )


def status_column() -> sa.ColumnElement[str]:
    """The thread's status (`ThreadStatus`) as an SQL expression over `agent_threads`."""
    active = (
        sa.select(turns.c.status)
        .where(*_thread_turns(), turns.c.status.in_(NON_TERMINAL_STATUSES))
        .limit(1)
        .correlate(threads)
        .scalar_subquery()
    )
    newest = _newest_turn().with_only_columns(turns.c.status).scalar_subquery()
    return sa.case(
        (active.in_([s.value for s in WAITING_FOR_A_PERSON]), sa.literal("interrupted")),
        (active.is_not(None), sa.literal("busy")),
        (newest.in_([s.value for s in FAILED_STATUSES]), sa.literal("error")),
        else_=sa.literal("idle"),
    )


def _updated_column() -> sa.ColumnElement[Any]:
    """When the thread last changed: its record or its newest turn, whichever is later."""
    newest = _newest_turn().with_only_columns(turns.c.updated_at).scalar_subquery()
    return sa.case((newest > threads.c.updated_at, newest), else_=threads.c.updated_at)


def _metadata_matches(dialect: str, wanted: dict[str, Any]) -> sa.ColumnElement[bool]:
    if dialect == "postgresql":
        filter_ = sa.cast(sa.bindparam(None, json.dumps(wanted), type_=sa.Text), JSONB)
        return sa.cast(threads.c.metadata, JSONB).op("@>")(filter_)
    return sa.and_(sa.true(), *(_sqlite_key_equals(key, value) for key, value in wanted.items()))


def _sqlite_key_equals(key: str, value: Any) -> sa.ColumnElement[bool]:
    entries = sa.func.json_each(threads.c.metadata).table_valued("key", "value", "type")
    match: list[sa.ColumnElement[bool]] = [entries.c.key == key]
    if value is None:
        match.append(entries.c.type == "null")
    elif isinstance(value, bool):
        match.append(entries.c.type == ("true" if value else "false"))
    elif isinstance(value, int | float):
        match += [entries.c.type.in_(["integer", "real"]), entries.c.value == value]
    elif isinstance(value, str):
        match += [entries.c.type == "text", entries.c.value == value]
    else:
        match += [
            entries.c.type == ("object" if isinstance(value, dict) else "array"),
            entries.c.value == sa.func.json(json.dumps(value)),
        ]
    return sa.exists(sa.select(1).select_from(entries).where(*match))


class ThreadRecords(SqlBackend):
    """Thread records in PostgreSQL or SQLite.

    Args:
        url_or_engine: A database URL or an engine to share.

    Raises:
        StoreUnavailableError: From any method, when the database could not complete the operation.
    """

    def create(
        self, conversation: ConversationKey, thread_id: str, metadata: dict[str, Any]
    ) -> tuple[ThreadRecord, bool]:
        """Create the thread unless a record exists; return the stored record and whether this call created it.

        An existing record is returned as it is, deleted or not: the caller decides what a
        second create means.
        """
        now = utcnow()
        insert = (
            dialect_insert(self._engine, threads)
            .values(
                conversation_id=conversation.conversation_id,
                thread_id=thread_id,
                tenant_id=tenant_key(conversation.tenant_id),
                metadata=metadata,
                created_at=now,
                updated_at=now,
                deleted_at=None,
            )
            .on_conflict_do_nothing()
            .returning(threads.c.conversation_id)
        )
        with translated_errors(self._engine, f"creating thread {thread_id!r}"):
            with self._writer.begin() as connection:
                created = connection.execute(insert).first() is not None
                row = connection.execute(sa.select(threads).where(*_names(conversation))).one()
        return _record(row), created

    def get(self, conversation: ConversationKey) -> ThreadRecord | None:
        """The thread's record, deleted or not; None when there is none."""
        with translated_errors(self._engine, "reading a thread"), self._engine.connect() as connection:
            row = connection.execute(sa.select(threads).where(*_names(conversation))).first()
        return None if row is None else _record(row)

    def _matching(self, query: ThreadQuery) -> sa.Select[Any]:
        owner = threads.c.tenant_id == tenant_key(query.tenant_id)
        where: list[sa.ColumnElement[bool]] = [owner, threads.c.deleted_at.is_(None)]
        if query.conversation_id is not None:
            where.append(threads.c.conversation_id == query.conversation_id)
        if query.thread_ids is not None:
            where.append(threads.c.thread_id.in_(list(query.thread_ids)))
        if query.metadata:
            where.append(_metadata_matches(self._engine.dialect.name, query.metadata))
        if query.status is not None:
            where.append(status_column() == query.status)
        return sa.select(threads).where(*where)

    def search(self, query: ThreadQuery, *, limit: int, offset: int = 0) -> list[ThreadRecord]:
        """One page of the threads `query` finds, in its order (one statement; ties broken by the stored id).

        The order is total, so pages taken while nothing changes neither repeat nor miss a thread.
        """
        key: sa.ColumnElement[Any] = {
            "created_at": threads.c.created_at,
            "updated_at": _updated_column(),
            "thread_id": threads.c.thread_id,
            "status": status_column(),
        }[query.sort_by]
        direction = sa.desc if query.descending else sa.asc
        statement = (
            self._matching(query)
            .order_by(direction(key), direction(threads.c.conversation_id))
            .limit(limit)
            .offset(offset)
        )
        with translated_errors(self._engine, "searching threads"), self._engine.connect() as connection:
            return [_record(row) for row in connection.execute(statement)]

    def count(self, query: ThreadQuery) -> int:
        """How many threads `query` finds."""
        statement = sa.select(sa.func.count()).select_from(self._matching(query).subquery())
        with translated_errors(self._engine, "counting threads"), self._engine.connect() as connection:
            return int(connection.execute(statement).scalar_one())

    def update_metadata(self, conversation: ConversationKey, metadata: dict[str, Any]) -> ThreadRecord | None:
        """Merge `metadata` into the thread's metadata; None when the thread does not exist (or was deleted)."""
        with translated_errors(self._engine, "updating a thread"), self._writer.begin() as connection:
            where = sa.and_(*_names(conversation), threads.c.deleted_at.is_(None))
            row = connection.execute(sa.select(threads).where(where)).first()
            if row is None:
                return None
            merged = {**dict(row.metadata or {}), **metadata}
            connection.execute(sa.update(threads).where(where).values(metadata=merged, updated_at=utcnow()))
            updated = connection.execute(sa.select(threads).where(where)).one()
        return _record(updated)

    def delete(self, conversation: ConversationKey) -> bool:
        """Mark the thread deleted; False when it did not exist or was deleted already."""
        now = utcnow()
        statement = (
            sa.update(threads)
            .where(*_names(conversation), threads.c.deleted_at.is_(None))
            .values(deleted_at=now, updated_at=now)
        )
        with translated_errors(self._engine, "deleting a thread"), self._writer.begin() as connection:
            return int(connection.execute(statement).rowcount) == 1


def _names(conversation: ConversationKey) -> tuple[sa.ColumnElement[bool], ...]:
    """The conditions that select a conversation's thread."""
    return (
        threads.c.tenant_id == tenant_key(conversation.tenant_id),
        threads.c.conversation_id == conversation.conversation_id,
    )

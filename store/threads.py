"""`ThreadRecords`: what a conversation managed as a thread has beyond its messages and turns.

A LangGraph client creates a thread before it runs anything on it, gives it metadata and
searches threads by it. The thread *is* the conversation: its messages stay in the chat
memory and its runs are the conversation's turns. This table only holds the thread's own
facts: its owner, metadata, creation time, and its deletion (a deleted thread is kept as
a tombstone, so its id is never handed out again while the turns and messages stay).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from agent_runner.ids import utcnow
from store._backend import SqlBackend
from store._engine import AnyRow, dialect_insert, translated_errors
from store.schema import threads


@dataclass(frozen=True)
class ThreadRecord:
    """A stored thread.

    Attributes:
        conversation_id: The conversation as stored (with the tenant's prefix).
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


def _record(row: AnyRow) -> ThreadRecord:
    return ThreadRecord(
        conversation_id=row.conversation_id,
        thread_id=row.thread_id,
        tenant_id=row.tenant_id,
        metadata=dict(row.metadata or {}),
        created_at=row.created_at,
        updated_at=row.updated_at,
        deleted_at=row.deleted_at,
    )


class ThreadRecords(SqlBackend):
    """Thread records in PostgreSQL or SQLite.

    Args:
        url_or_engine: A database URL or an engine to share.

    Raises:
        StoreUnavailableError: From any method, when the database could not complete the operation.
    """

    def create(
        self, conversation_id: str, thread_id: str, tenant_id: str | None, metadata: dict[str, Any]
    ) -> tuple[ThreadRecord, bool]:
        """Create the thread unless a record exists; return the stored record and whether this call created it.

        An existing record is returned as it is, deleted or not: the caller decides what a
        second create means.
        """
        now = utcnow()
        insert = (
            dialect_insert(self._engine, threads)
            .values(
                conversation_id=conversation_id,
                thread_id=thread_id,
                tenant_id=tenant_id,
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
                row = connection.execute(sa.select(threads).where(threads.c.conversation_id == conversation_id)).one()
        return _record(row), created

    def get(self, conversation_id: str) -> ThreadRecord | None:
        """The thread's record, deleted or not; None when there is none."""
        with translated_errors(self._engine, "reading a thread"), self._engine.connect() as connection:
            row = connection.execute(sa.select(threads).where(threads.c.conversation_id == conversation_id)).first()
        return None if row is None else _record(row)

    def list(self, tenant_id: str | None) -> list[ThreadRecord]:
        """The tenant's threads that were not deleted, newest first."""
        owner = threads.c.tenant_id.is_(None) if tenant_id is None else threads.c.tenant_id == tenant_id
        statement = (
            sa.select(threads)
            .where(owner, threads.c.deleted_at.is_(None))
            .order_by(threads.c.created_at.desc(), threads.c.conversation_id)
        )
        with translated_errors(self._engine, "listing threads"), self._engine.connect() as connection:
            return [_record(row) for row in connection.execute(statement)]

    def update_metadata(self, conversation_id: str, metadata: dict[str, Any]) -> ThreadRecord | None:
        """Merge `metadata` into the thread's metadata; None when the thread does not exist (or was deleted)."""
        with translated_errors(self._engine, "updating a thread"), self._writer.begin() as connection:
            where = sa.and_(threads.c.conversation_id == conversation_id, threads.c.deleted_at.is_(None))
            row = connection.execute(sa.select(threads).where(where)).first()
            if row is None:
                return None
            merged = {**dict(row.metadata or {}), **metadata}
            connection.execute(sa.update(threads).where(where).values(metadata=merged, updated_at=utcnow()))
            updated = connection.execute(sa.select(threads).where(where)).one()
        return _record(updated)

    def delete(self, conversation_id: str) -> bool:
        """Mark the thread deleted; False when it did not exist or was deleted already."""
        now = utcnow()
        statement = (
            sa.update(threads)
            .where(threads.c.conversation_id == conversation_id, threads.c.deleted_at.is_(None))
            .values(deleted_at=now, updated_at=now)
        )
        with translated_errors(self._engine, "deleting a thread"), self._writer.begin() as connection:
            return int(connection.execute(statement).rowcount) == 1

"""`IdempotencyKeys`: the first answer to each request sent with an idempotency key.

A client that retries a request (a timeout, a dropped connection, a restarted server)
sends the same key again and must get the first answer instead of a second action. The
first request claims the key (IN_PROGRESS), acts, and records its answer (COMPLETED);
later requests with the key read that answer. Keys are scoped per tenant, and a request
fingerprint (a hash of what was asked) lets the caller refuse a key reused for a
different request.

Recording the answer is a write of its own, after the action: a key can stay IN_PROGRESS
although its action happened (the connection dropped while recording, the process died).
The caller then tells what happened from what the action saved (see
`workers.api.idempotency_header`); this store only keeps the first answer recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from agent_runner import AgentEventType, AgentTurn
from agent_runner.ids import utcnow
from store._backend import SqlBackend
from store._engine import AnyRow, UrlOrEngine, dialect_insert, translated_errors
from store.schema import idempotency_keys, tenant_key, tenant_of, turn_events

RESUME_MARK = "idempotency_id"
"""Key of a resume command's metadata naming the keyed request that sent it; its TURN_RESUMED event keeps it."""


class IdempotencyStatus(StrEnum):
    """Where the request that claimed a key is. Values are stored: add, never rename."""

    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"


@dataclass(frozen=True)
class IdempotencyRecord:
    """A claimed idempotency key and, once the request finished, its answer.

    Attributes:
        tenant_id: The tenant the key belongs to (None on a single-tenant server).
        key: The client's idempotency key.
        fingerprint: What the first request asked for (a hash chosen by the caller).
        status: IN_PROGRESS while the first request runs, then COMPLETED.
        response_status: The HTTP status of the first answer, once COMPLETED.
        response_body: The JSON body of the first answer, once COMPLETED.
        created_at: When the key was first claimed.
        updated_at: When it was last claimed or completed.
    """

    tenant_id: str | None
    key: str
    fingerprint: str
    status: IdempotencyStatus
    response_status: int | None
    response_body: Any
    created_at: datetime
    updated_at: datetime


def _record(row: AnyRow) -> IdempotencyRecord:
    return IdempotencyRecord(
        tenant_id=tenant_of(row.tenant_id),
        key=row.idempotency_key,
        fingerprint=row.fingerprint,
        status=IdempotencyStatus(row.status),
        response_status=row.response_status,
        response_body=row.response_body,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _where(tenant_id: str | None, key: str) -> sa.ColumnElement[bool]:
    return sa.and_(idempotency_keys.c.tenant_id == (tenant_key(tenant_id)), idempotency_keys.c.idempotency_key == key)


class IdempotencyKeys(SqlBackend):
    """Idempotency keys and the answers recorded for them, in PostgreSQL or SQLite.

    Use it in two moves: `claim` before acting, then `complete` with the answer.

    Args:
        url_or_engine: A database URL or an engine to share. An engine made from a URL is
            disposed of by `close()`; one passed in is left open.

    Raises:
        StoreUnavailableError: From any method, when the database could not complete the
            operation; nothing was written.
    """

    def __init__(self, url_or_engine: UrlOrEngine) -> None:
        super().__init__(url_or_engine)

    def claim(self, tenant_id: str | None, key: str, fingerprint: str) -> IdempotencyRecord | None:
        """Claim `key` for a request about to act; None when the key is new and this request holds it.

        Otherwise returns the stored record: COMPLETED (answer with its response, after
        checking its fingerprint) or IN_PROGRESS (an earlier request with the key has not
        recorded an answer: it is still running, or it died or lost its connection before
        recording, possibly after acting).
        """
        now = utcnow()
        insert = (
            dialect_insert(self._engine, idempotency_keys)
            .values(
                tenant_id=tenant_key(tenant_id),
                idempotency_key=key,
                fingerprint=fingerprint,
                status=IdempotencyStatus.IN_PROGRESS.value,
                created_at=now,
                updated_at=now,
            )
            .on_conflict_do_nothing()
            .returning(idempotency_keys.c.idempotency_key)
        )
        with translated_errors(self._engine, f"claiming idempotency key {key!r}"):
            with self._writer.begin() as connection:
                if connection.execute(insert).first() is not None:
                    return None
                row = connection.execute(sa.select(idempotency_keys).where(_where(tenant_id, key))).first()
                if row is None:  # purged between the two statements: claim it again
                    connection.execute(insert)
                    return None
                return _record(row)

    def complete(self, tenant_id: str | None, key: str, status: int, body: Any) -> IdempotencyRecord | None:
        """Record the answer of a request with `key` unless one is recorded already; return the recorded one.

        The first answer recorded stays: a retry that ran while the first request was still
        running, and the first request itself, end up giving the same answer. None when the
        key is no longer stored (purged a day after its claim).
        """
        statement = (
            sa.update(idempotency_keys)
            .where(_where(tenant_id, key), idempotency_keys.c.status == IdempotencyStatus.IN_PROGRESS.value)
            .values(
                status=IdempotencyStatus.COMPLETED.value,
                response_status=status,
                response_body=body,
                updated_at=utcnow(),
            )
            .returning(*idempotency_keys.c)
        )
        with translated_errors(self._engine, f"recording the answer for idempotency key {key!r}"):
            with self._writer.begin() as connection:
                row = connection.execute(statement).first()
                if row is None:
                    row = connection.execute(sa.select(idempotency_keys).where(_where(tenant_id, key))).first()
        return None if row is None else _record(row)

    def is_resume_applied(self, turn: AgentTurn, request_id: str) -> bool:
        """Whether a resume command whose metadata has `RESUME_MARK` = `request_id` was applied to `turn`.

        Reads the turn's committed TURN_RESUMED events directly: unlike the event feed, this
        does not wait for the other transactions open on the server to end.
        """
        query = sa.select(turn_events.c.payload).where(
            turn_events.c.root_turn_id == turn.root_turn_id,
            turn_events.c.turn_id == turn.id,
            turn_events.c.type == AgentEventType.TURN_RESUMED.value,
        )
        with translated_errors(self._engine, f"reading the resumes of turn {turn.id!r}"):
            with self._engine.connect() as connection:
                payloads = connection.execute(query).scalars().all()
        for payload in payloads:
            metadata = (payload.get("data") or {}).get("metadata")
            if isinstance(metadata, dict) and metadata.get(RESUME_MARK) == request_id:
                return True
        return False

    def get(self, tenant_id: str | None, key: str) -> IdempotencyRecord | None:
        """Return the stored record of `key`, or None."""
        with translated_errors(self._engine, f"reading idempotency key {key!r}"), self._engine.connect() as connection:
            row = connection.execute(sa.select(idempotency_keys).where(_where(tenant_id, key))).first()
        return None if row is None else _record(row)

    def purge(self, created_before: datetime) -> int:
        """Delete the keys claimed before `created_before`; return how many.

        A client retries within minutes; keeping a day of keys is plenty.
        """
        statement = sa.delete(idempotency_keys).where(idempotency_keys.c.created_at < created_before)
        with translated_errors(self._engine, "purging idempotency keys"), self._writer.begin() as connection:
            return int(connection.execute(statement).rowcount)

"""The webhook delivery log: which durable events are owed to a webhook, and what became of each.

Webhooks are fed from the durable event log (`agent_turn_events`), never from the process
that saved a turn: an event exists exactly when its save committed, so a worker that stops
right after a save loses no webhook, and a re-run step (which writes no event twice) sends
none twice. The delivery log holds one row per event owed to a webhook, keyed by the
event id, which is also the delivery id receivers see:

1. `discover` finds the events of the configured kinds that have no row yet and inserts
   one (PENDING). Inserting is idempotent, so any number of processes may discover at once.
2. `claim_due` takes the PENDING rows whose attempt is due, one compare-and-swap on
   `attempts` each, and holds them for the length of an attempt, so two processes never send
   the same attempt. A process that stops mid-attempt leaves the row to be retried once the
   hold passes: delivery is at least once.
3. `record` settles an attempt: DELIVERED, PENDING again with the time of the next attempt,
   or DEAD (the dead-letter record) after the last attempt or a refusal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from agent_runner.events import AgentEventType
from agent_runner.suspensions import SuspensionType
from store._backend import SqlBackend, retention_cutoff
from store._engine import UrlOrEngine, dialect_insert, translated_errors
from store.schema import tenant_of, turn_events, turns, webhook_deliveries


class WebhookKind(StrEnum):
    """What a webhook reports; each kind has a URL of its own."""

    WAITING = "waiting"
    """A turn waits for a person: an approval, user input or a form, or a call whose outcome is unknown."""
    ENDED = "ended"
    """A root turn completed or was cancelled."""
    FAILED = "failed"
    """A root turn failed or stopped at a limit (iterations, steps, budget)."""


KIND_EVENT_TYPES: Mapping[WebhookKind, tuple[AgentEventType, ...]] = {
    WebhookKind.WAITING: (AgentEventType.TURN_SUSPENDED,),
    WebhookKind.ENDED: (AgentEventType.TURN_COMPLETED, AgentEventType.TURN_CANCELLED),
    WebhookKind.FAILED: (
        AgentEventType.TURN_FAILED,
        AgentEventType.MAX_ITERATIONS_REACHED,
        AgentEventType.MAX_STEPS_REACHED,
        AgentEventType.BUDGET_EXCEEDED,
    ),
}
"""The durable event types behind each webhook kind."""

PERSON_SUSPENSIONS = tuple(t.value for t in SuspensionType if t.waits_for_a_person)
"""Suspension types that wait for a person (a child turn or a retry wait for nobody)."""


class DeliveryStatus(StrEnum):
    """Where one webhook delivery stands."""

    PENDING = "PENDING"
    DELIVERED = "DELIVERED"
    DEAD = "DEAD"
    """Given up after the last attempt, or refused by the receiver: the dead-letter record."""


@dataclass(frozen=True)
class WebhookDelivery:
    """One row of the delivery log."""

    event_id: str
    """The event's id, sent as the delivery id: receivers deduplicate on it."""
    kind: WebhookKind
    url: str
    body: dict[str, Any]
    """The JSON body sent (the same on every attempt)."""
    status: DeliveryStatus
    attempts: int
    next_attempt_at: datetime
    last_error: str | None
    last_status_code: int | None
    event_created_at: datetime
    created_at: datetime
    updated_at: datetime


class WebhookDeliveryLog(SqlBackend):
    """The delivery log of the webhooks, in the SQL store (PostgreSQL or SQLite)."""

    def __init__(self, url_or_engine: UrlOrEngine) -> None:
        super().__init__(url_or_engine)
        # When this process last looked through every event stamped before it: the next look
        # starts there (less `lag`) instead of at the newest delivery, which may be old.
        self._looked_at: datetime | None = None

    def discover(
        self, urls: Mapping[WebhookKind, str], now: datetime, *, lookback: timedelta, lag: timedelta, limit: int = 500
    ) -> int:
        """Add a PENDING delivery for each event of a configured kind that has none yet; return how many.

        Events are looked for from `lag` before the newest event already in the log (events
        commit moments after they are stamped, so one stamped earlier may appear later), or
        from `lookback` before `now` while the log is empty, which is how far back the first
        webhooks reach.
        """
        if not urls:
            return 0
        with translated_errors(self._engine, "finding the events owed to webhooks"):
            with self._writer.begin() as connection:
                newest = connection.execute(sa.select(sa.func.max(webhook_deliveries.c.event_created_at))).scalar()
                since = now - lookback if newest is None else newest - lag
                if self._looked_at is not None:
                    since = max(since, self._looked_at - lag)
                rows = connection.execute(_discovery_query(urls, since, limit)).all()
                if len(rows) < limit:
                    self._looked_at = now
                if not rows:
                    return 0
                values = [_delivery_row(row, urls, now) for row in rows]
                insert = dialect_insert(connection, webhook_deliveries)
                result = connection.execute(insert.on_conflict_do_nothing(index_elements=["event_id"]), values)
        return max(result.rowcount, 0)

    def claim_due(self, now: datetime, hold: timedelta, limit: int = 20) -> list[WebhookDelivery]:
        """Claim the PENDING deliveries whose next attempt is due, counting the attempt, and hold them for `hold`."""
        table = webhook_deliveries
        query = (
            sa.select(table)
            .where(table.c.status == DeliveryStatus.PENDING.value, table.c.next_attempt_at <= now)
            .order_by(table.c.next_attempt_at)
            .limit(limit)
        )
        claimed: list[WebhookDelivery] = []
        with translated_errors(self._engine, "claiming due webhook deliveries"):
            with self._reader.connect() as connection:
                rows = connection.execute(query).all()
            for row in rows:
                update = (
                    sa.update(table)
                    .where(
                        table.c.event_id == row.event_id,
                        table.c.attempts == row.attempts,
                        table.c.status == DeliveryStatus.PENDING.value,
                    )
                    .values(attempts=row.attempts + 1, next_attempt_at=now + hold, updated_at=now)
                )
                with self._writer.begin() as connection:
                    if connection.execute(update).rowcount != 1:
                        continue  # another process claimed it first
                claimed.append(_delivery({**row._mapping, "attempts": row.attempts + 1, "next_attempt_at": now + hold}))
        return claimed

    def record(
        self,
        delivery: WebhookDelivery,
        status: DeliveryStatus,
        now: datetime,
        *,
        next_attempt_at: datetime | None = None,
        error: str | None = None,
        status_code: int | None = None,
    ) -> bool:
        """Settle the attempt `delivery` was claimed for; False when a later claim took the row over."""
        table = webhook_deliveries
        update = (
            sa.update(table)
            .where(table.c.event_id == delivery.event_id, table.c.attempts == delivery.attempts)
            .values(
                status=status.value,
                next_attempt_at=next_attempt_at or now,
                last_error=error,
                last_status_code=status_code,
                updated_at=now,
            )
        )
        with translated_errors(self._engine, f"recording webhook delivery {delivery.event_id!r}"):
            with self._writer.begin() as connection:
                return bool(connection.execute(update).rowcount == 1)

    def prune(self, older_than: timedelta, *, batch_size: int = 500) -> int:
        """Delete the settled deliveries whose event is gone from the event log; return how many.

        A DELIVERED or DEAD delivery last attempted more than `older_than` ago goes once its
        event has been pruned with its turn (`SqlAgentTurnStore.prune`): only then can
        `discover` never find the event again and owe it a second delivery. PENDING
        deliveries stay until they settle.

        Raises:
            ValueError: `older_than` is negative or `batch_size` is below 1.
            StoreUnavailableError: The database failed; the batches already committed stay deleted.
        """
        cutoff = retention_cutoff(older_than, batch_size)
        delivery = webhook_deliveries.c
        event_gone = ~sa.select(sa.literal(1)).where(turn_events.c.event_id == delivery.event_id).exists()
        where = sa.and_(
            delivery.status != DeliveryStatus.PENDING.value,
            delivery.updated_at < cutoff,
            event_gone,
        )
        return self._delete_in_batches(delivery.event_id, where, batch_size, "pruning webhook deliveries")

    def list_deliveries(self, status: DeliveryStatus | None = None, limit: int = 100) -> list[WebhookDelivery]:
        """The newest deliveries first, optionally only those in `status` (DEAD: the dead letters)."""
        query = sa.select(webhook_deliveries).order_by(webhook_deliveries.c.created_at.desc()).limit(limit)
        if status is not None:
            query = query.where(webhook_deliveries.c.status == status.value)
        with translated_errors(self._engine, "listing webhook deliveries"):
            with self._reader.connect() as connection:
                return [_delivery(row._mapping) for row in connection.execute(query)]

    def get(self, event_id: str) -> WebhookDelivery | None:
        """The delivery of one event, or None."""
        query = sa.select(webhook_deliveries).where(webhook_deliveries.c.event_id == event_id)
        with translated_errors(self._engine, f"reading webhook delivery {event_id!r}"):
            with self._reader.connect() as connection:
                row = connection.execute(query).first()
        return None if row is None else _delivery(row._mapping)


def _discovery_query(urls: Mapping[WebhookKind, str], since: datetime, limit: int) -> sa.Select[Any]:
    events = turn_events
    suspension_type = events.c.payload["data"]["suspension_type"].as_string()
    root_only = events.c.turn_id == events.c.root_turn_id
    wanted: list[sa.ColumnElement[bool]] = []
    for kind in urls:
        types = [t.value for t in KIND_EVENT_TYPES[kind]]
        if kind is WebhookKind.WAITING:
            wanted.append(sa.and_(events.c.type.in_(types), suspension_type.in_(PERSON_SUSPENSIONS)))
        else:
            wanted.append(sa.and_(events.c.type.in_(types), root_only))
    known = sa.select(webhook_deliveries.c.event_id).where(webhook_deliveries.c.event_id == events.c.event_id)
    return (
        sa.select(
            events.c.event_id,
            events.c.turn_id,
            events.c.root_turn_id,
            events.c.conversation_id,
            events.c.type,
            events.c.created_at,
            events.c.payload,
            turns.c.tenant_id,
            turns.c.agent_id,
        )
        .select_from(events.outerjoin(turns, turns.c.id == events.c.turn_id))
        .where(events.c.created_at >= since, sa.or_(*wanted), ~sa.exists(known))
        .order_by(events.c.created_at)
        .limit(limit)
    )


def _kind_of(event_type: str) -> WebhookKind:
    return next(kind for kind, types in KIND_EVENT_TYPES.items() if event_type in types)


def _delivery_row(row: Any, urls: Mapping[WebhookKind, str], now: datetime) -> dict[str, Any]:
    kind = _kind_of(row.type)
    payload = row.payload
    body = {
        "delivery_id": row.event_id,
        "kind": kind.value,
        "event": {
            "event_id": row.event_id,
            "type": row.type,
            "turn_id": row.turn_id,
            "root_turn_id": row.root_turn_id,
            "agent_id": row.agent_id,
            "tenant_id": tenant_of(row.tenant_id),
            "conversation_id": row.conversation_id,
            "timestamp": payload.get("timestamp"),
            "data": payload.get("data", {}),
        },
    }
    return {
        "event_id": row.event_id,
        "kind": kind.value,
        "url": urls[kind],
        "body": body,
        "status": DeliveryStatus.PENDING.value,
        "attempts": 0,
        "next_attempt_at": now,
        "last_error": None,
        "last_status_code": None,
        "event_created_at": row.created_at,
        "created_at": now,
        "updated_at": now,
    }


def _delivery(row: Mapping[Any, Any]) -> WebhookDelivery:
    return WebhookDelivery(
        event_id=row["event_id"],
        kind=WebhookKind(row["kind"]),
        url=row["url"],
        body=row["body"],
        status=DeliveryStatus(row["status"]),
        attempts=row["attempts"],
        next_attempt_at=row["next_attempt_at"],
        last_error=row["last_error"],
        last_status_code=row["last_status_code"],
        event_created_at=row["event_created_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


__all__: Sequence[str] = ("DeliveryStatus", "KIND_EVENT_TYPES", "WebhookDelivery", "WebhookDeliveryLog", "WebhookKind")

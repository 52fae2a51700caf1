"""The per-step statements of `SqlAgentTurnStore` on PostgreSQL, run on psycopg directly.

A step of a turn costs one statement: the compare-and-swap save (or, for a worker that
picks a turn up, the load). Through SQLAlchemy Core, the Python work around that one
statement (execution context, bound-parameter processing, result set-up) costs more CPU
than the driver's own, and on a fast server more than the server's work too. These two
statements therefore go to the psycopg connection of a pooled SQLAlchemy connection, as
server-side prepared statements whose text never changes: however many messages and
events a save carries, they travel as JSON and array parameters of the same statement,
so each pooled connection prepares it once and afterwards only binds and executes it.
Everything else (schema, migrations, listings, the rare paths) stays on SQLAlchemy.

`store.turns` decides when these apply; this module only builds parameters, runs the
statements and reads their rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic_core import to_json

from agent_runner.events import AgentEvent
from agent_runner.messages import ModelMessage
from agent_runner.snapshot import AgentTurn
from store._engine import DriverConnection

if TYPE_CHECKING:
    from psycopg import Cursor

_ADDED_ROWS = """\
added AS (
    INSERT INTO agent_turn_messages (turn_id, seq, message_id, role, payload)
    SELECT %(id)s::text, %(known)s::integer + m.ordinality::integer - 1, k.value ->> 0, k.value ->> 1, m.value
    FROM header,
        json_array_elements(%(message_keys)s::json) WITH ORDINALITY AS k
        JOIN json_array_elements(%(messages)s::json) WITH ORDINALITY AS m ON m.ordinality = k.ordinality
), events AS (
    INSERT INTO agent_turn_events (event_id, turn_id, root_turn_id, conversation_id, type, created_at, payload, xid)
    SELECT k.value ->> 0, k.value ->> 1, k.value ->> 2, k.value ->> 3, k.value ->> 4, (k.value ->> 5)::timestamptz,
        ('{"event_id":' || (k.value -> 0)::text || ',"type":' || (k.value -> 4)::text
            || ',"turn_id":' || (k.value -> 1)::text || ',"root_turn_id":' || (k.value -> 2)::text
            || ',"conversation_id":' || (k.value -> 3)::text || ',"timestamp":' || (k.value -> 6)::text
            || ',"data":' || (k.value -> 7)::text || '}')::json,
        pg_current_xact_id()::text::bigint
    FROM header, json_array_elements(%(events)s::json) WITH ORDINALITY AS k
    ORDER BY k.ordinality
    ON CONFLICT (event_id) DO NOTHING
)"""
"""The INSERTs of a save's new messages (from seq `known` on) and events, fed by the `header` CTE.

They are selected FROM the header's RETURNING: when the header was not written, nothing
is. Each message comes as its payload (in one JSON array of them) and its key columns (in
a small JSON array of arrays beside it, so the server never digs them out of a large
payload). Each event comes as one array of its fields (see `event_fields`); its payload is
the text of those fields put together in the order of `AgentEvent`'s fields, the JSON
`model_dump_json` would give (a `json` value keeps the text it was given, so `->` and
`::text` return each field exactly as the client wrote it). Events go in in their order,
so their ids follow it, and an event id already stored is skipped.
"""

SAVE = f"""\
WITH header AS (
    UPDATE agent_turns AS t SET
        agent_id = %(agent_id)s::text,
        agent_version = %(agent_version)s::text,
        conversation_id = %(conversation_id)s::text,
        parent_turn_id = %(parent_turn_id)s::text,
        root_turn_id = %(root_turn_id)s::text,
        status = %(status)s::text,
        phase = %(phase)s::text,
        version = %(version)s::integer,
        message_count = %(message_count)s::integer,
        cancel_requested = t.cancel_requested OR %(cancel_requested)s::boolean,
        lease_fence = coalesce(%(fence)s::bigint, t.lease_fence),
        next_retry_at = %(next_retry_at)s::timestamptz,
        created_at = %(created_at)s::timestamptz,
        updated_at = %(updated_at)s::timestamptz,
        tenant_id = %(tenant_id)s::text,
        wake_at = %(wake_at)s::timestamptz,
        state = %(state)s::json,
        status_changed_at = CASE
            WHEN t.status = %(status)s::text AND t.status_changed_at <= %(updated_at)s::timestamptz
            THEN t.status_changed_at ELSE %(updated_at)s::timestamptz END
    WHERE t.id = %(id)s::text
        AND t.version = %(expected_version)s::integer
        AND t.message_count = %(known)s::integer
        AND (%(fence)s::bigint IS NULL OR t.lease_fence IS NULL OR t.lease_fence <= %(fence)s::bigint)
    RETURNING t.cancel_requested, t.lease_fence
), {_ADDED_ROWS}
SELECT cancel_requested, lease_fence FROM header"""
"""The compare-and-swap save of a header with its new messages and events, as one autocommitted statement.

The UPDATE matches only the expected version and message count, and a fence no lower than
the stored one. The cancel flag only goes from False to True and the fence only up, so
they are or'ed and coalesced with the stored values, and RETURNING reads them back; when
it matches no row, nothing at all is written (see `_ADDED_ROWS`). `status_changed_at`
moves only with the status, and never past `updated_at`. The text starts with
`WITH header`, as `pg_stat_activity` shows it.
"""

CREATE = f"""\
WITH header AS (
    INSERT INTO agent_turns (
        id, agent_id, agent_version, conversation_id, parent_turn_id, root_turn_id, status, phase, version,
        message_count, cancel_requested, lease_fence, next_retry_at, created_at, updated_at, tenant_id, state,
        status_changed_at, wake_at
    ) VALUES (
        %(id)s::text, %(agent_id)s::text, %(agent_version)s::text, %(conversation_id)s::text,
        %(parent_turn_id)s::text, %(root_turn_id)s::text, %(status)s::text, %(phase)s::text, %(version)s::integer,
        %(message_count)s::integer, %(cancel_requested)s::boolean, %(fence)s::bigint,
        %(next_retry_at)s::timestamptz, %(created_at)s::timestamptz, %(updated_at)s::timestamptz,
        %(tenant_id)s::text, %(state)s::json, %(updated_at)s::timestamptz, %(wake_at)s::timestamptz
    )
    ON CONFLICT DO NOTHING
    RETURNING id
), {_ADDED_ROWS}
SELECT id FROM header"""
"""The INSERT of a new turn with its messages and events, as one autocommitted statement.

ON CONFLICT DO NOTHING covers the primary key and the active-conversation index alike:
no row comes back when either refused the turn, and then nothing at all was written.
Parameters are those of `SAVE` (`expected_version` unused, `known` 0).
"""

_HEADER_COLUMNS = (
    "id",
    "agent_id",
    "agent_version",
    "conversation_id",
    "parent_turn_id",
    "root_turn_id",
    "status",
    "phase",
    "version",
    "message_count",
    "cancel_requested",
    "cancel_reason",
    "lease_fence",
    "next_retry_at",
    "created_at",
    "updated_at",
    "state",
    "tenant_id",
)
_TIMES = ("next_retry_at", "created_at", "updated_at")

LOAD = f"""\
SELECT {", ".join(f"t.{name}" for name in _HEADER_COLUMNS)}, probe.message_id,
    (SELECT json_agg(m.payload ORDER BY m.seq) FROM agent_turn_messages AS m
        WHERE m.turn_id = t.id AND m.seq >= %(known)s::integer AND m.seq < t.message_count)::text
FROM agent_turns AS t
    LEFT JOIN agent_turn_messages AS probe ON probe.turn_id = t.id AND probe.seq = %(known)s::integer - 1
WHERE t.id = %(id)s::text"""
"""A turn's header, the id of its message at `known - 1` (NULL when none) and its messages from `known` on.

The probe lets a store that remembers the first `known` messages check, in the same round
trip, that the last of them is still the one stored at its position. Messages come as
one JSON array (NULL when there are none); one statement sees one snapshot, so they
are exactly those of the header read.
"""

REF = "SELECT id, version, status, updated_at, next_retry_at, cancel_requested FROM agent_turns WHERE id = %(id)s::text"
"""The header fields of a `TurnRef`."""


def cursor(lent: DriverConnection) -> Cursor[Any]:
    """The cursor of a lent connection, made once and reused (its adapters stay cached)."""
    if lent.cursor is None:
        lent.cursor = lent.driver.cursor()
    return lent.cursor  # type: ignore[no-any-return]


def save_parameters(
    turn: AgentTurn,
    expected_version: int,
    known: int,
    state: str,
    messages: Sequence[ModelMessage],
    events: Sequence[AgentEvent],
) -> dict[str, Any]:
    """The parameters of `SAVE` for a save of `turn` over the stored version and message count.

    `state` is the snapshot's `state` column as JSON text; `messages` are those added
    since the stored snapshot; `events` are the event log's copies of the durable events.
    """
    return {
        "id": turn.id,
        "agent_id": turn.agent_id,
        "agent_version": turn.agent_version,
        "conversation_id": turn.conversation_id,
        "parent_turn_id": turn.parent_turn_id,
        "root_turn_id": turn.root_turn_id,
        "status": turn.status.value,
        "phase": turn.phase.value,
        "version": expected_version + 1,
        "message_count": len(turn.messages),
        "cancel_requested": turn.cancel_requested,
        "fence": turn.lease_fence,
        "next_retry_at": None if turn.next_retry_at is None else _aware(turn.next_retry_at),
        "created_at": _aware(turn.created_at),
        "updated_at": _aware(turn.updated_at),
        "tenant_id": turn.tenant_id,
        "wake_at": None if turn.wake_at is None else _aware(turn.wake_at),
        "state": state,
        "expected_version": expected_version,
        "known": known,
        "message_keys": to_json([[m.id, m.role] for m in messages]).decode(),
        # One message at a time: the same JSON as through the union's adapter, with less CPU.
        "messages": "[" + ",".join([message.model_dump_json() for message in messages]) + "]",
        "events": to_json([event_fields(e) for e in events]).decode(),
    }


def event_fields(event: AgentEvent) -> list[Any]:
    """An event of a save as `_ADDED_ROWS` takes it: its key columns, then its timestamp and data as given.

    The key columns are the event id, turn id, root turn id, conversation id, type and the
    time in UTC (the `created_at` column); the payload is made of the same fields, as JSON,
    so each is encoded once. An event log keeps events without the cursor they were read at.
    """
    return [
        event.event_id,
        event.turn_id,
        event.root_turn_id,
        event.conversation_id,
        event.type.value,  # the text: to_json takes longer to find out what to make of an enum member
        _aware(event.timestamp),
        event.timestamp,
        event.data,
    ]


def _aware(value: datetime) -> datetime:
    """A timestamp to store: naive ones are UTC, as `store.schema.UtcDateTime` takes them."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def header_values(row: Sequence[Any]) -> dict[str, Any]:
    """The header columns of a `LOAD` row by name, timestamps in UTC as the SQLAlchemy path gives them."""
    values = dict(zip(_HEADER_COLUMNS, row, strict=False))
    for name in _TIMES:
        value: datetime | None = values[name]
        if value is not None:
            values[name] = value.astimezone(UTC)
    return values


PROBE_INDEX = len(_HEADER_COLUMNS)
"""Position of the probed message id in a `LOAD` row; the messages' JSON follows it."""


def utc(value: datetime | None) -> datetime | None:
    """A timestamp read from the driver, in UTC."""
    return None if value is None else value.astimezone(UTC)

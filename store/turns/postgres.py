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

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic_core import to_json

from agent_runner.events import AgentEvent
from agent_runner.messages import AnyMessage, AnyMessageAdapter, ModelMessage, SystemMessage
from agent_runner.snapshot import AgentTurn, PageAction
from agent_runner.store_rules import page_message, page_message_update
from store._engine import DriverConnection, driver_cursor
from store._event_log import claim_positions
from store.schema import tenant_key
from store.turns.columns import READ, TIMES, WRITTEN, Column, SaveRule

if TYPE_CHECKING:
    from psycopg import Cursor

_MESSAGES = """\
added AS (
    INSERT INTO agent_turn_messages (turn_id, seq, message_id, role, payload)
    SELECT %(id)s::text, %(known)s::integer + m.ordinality::integer - 1, k.value ->> 0, k.value ->> 1, m.value
    FROM header,
        json_array_elements(%(message_keys)s::json) WITH ORDINALITY AS k
        JOIN json_array_elements(%(messages)s::json) WITH ORDINALITY AS m ON m.ordinality = k.ordinality
)"""

_ROOT_COUNTER = """\
root AS (
    UPDATE agent_turns AS r SET event_position = r.event_position + %(root_events)s::bigint
    FROM header
    WHERE r.id = %(root_turn_id)s::text
    RETURNING r.event_position
)"""

_CONVERSATION_COUNTERS = """\
conversations AS (
    INSERT INTO agent_event_conversations AS c (tenant_id, conversation_id, last_position)
    SELECT %(tenant)s::text, v.value ->> 0, (v.value ->> 1)::bigint
    FROM {tree}, json_array_elements(%(conversations)s::json) WITH ORDINALITY AS v
    ORDER BY v.ordinality
    ON CONFLICT (tenant_id, conversation_id) DO UPDATE SET last_position = c.last_position + excluded.last_position
    RETURNING conversation_id, last_position
)"""

_EVENTS = """\
events AS (
    INSERT INTO agent_turn_events (
        event_id, turn_id, root_turn_id, conversation_id, tenant_id, type, created_at, payload, root_position,
        conversation_position
    )
    SELECT k.value ->> 0, k.value ->> 1, k.value ->> 2, k.value ->> 3, %(tenant)s::text, k.value ->> 4,
        (k.value ->> 5)::timestamptz,
        ('{{"event_id":' || (k.value -> 0)::text || ',"type":' || (k.value -> 4)::text
            || ',"turn_id":' || (k.value -> 1)::text || ',"root_turn_id":' || (k.value -> 2)::text
            || ',"conversation_id":' || (k.value -> 3)::text || ',"timestamp":' || (k.value -> 6)::text
            || ',"data":' || (k.value -> 7)::text || '}}')::json,
        {tree_position} + (k.value ->> 8)::bigint, {conversation_position}
    FROM header, json_array_elements(%(events)s::json) WITH ORDINALITY AS k{tree_join}{conversation_join}
    ORDER BY k.ordinality
    ON CONFLICT (event_id) DO NOTHING
)"""


_CHAT = """\
chat_block AS (
    INSERT INTO agent_chat_conversations AS c (tenant_id, conversation_id, last_seq)
    SELECT %(tenant)s::text, %(conversation_id)s::text, %(chat_count)s::integer FROM header
    ON CONFLICT (tenant_id, conversation_id) DO UPDATE SET last_seq = c.last_seq + excluded.last_seq
    RETURNING last_seq
), chat AS (
    INSERT INTO agent_chat_messages (
        tenant_id, conversation_id, seq, message_id, role, model_visible, version, payload, created_at
    )
    SELECT %(tenant)s::text, %(conversation_id)s::text, chat_block.last_seq - %(chat_count)s::integer + m.ordinality::integer,
        k.value ->> 0, k.value ->> 1, {visible_version}, m.value, %(updated_at)s::timestamptz
    FROM chat_block,
        json_array_elements(%(chat_keys)s::json) WITH ORDINALITY AS k
        JOIN json_array_elements(%(chat_messages)s::json) WITH ORDINALITY AS m ON m.ordinality = k.ordinality
    ORDER BY k.ordinality
    ON CONFLICT (tenant_id, conversation_id, message_id) DO NOTHING{returning}
)"""
"""The projection of a conversation turn's new messages into its ChatMemory, fed by the `header` CTE.

The same rows as `store.chat_memory.SqlChatMemory.append` writes for them: the block of
sequence numbers is reserved on the conversation's counter row, and a message whose id
the conversation already holds is skipped (its number is never used), so a save re-run
after a crash writes nothing twice. Each message's keys are its id and role: the common
save projects model messages only, hence `model_visible` true and `version` 0. A save that
also writes page messages (approval cards and forms, `_PAGES`) gives every message its
`model_visible` and version among its keys, and reads back the ids it inserted. Selected
FROM the header's RETURNING: nothing is projected when the compare-and-swap refused the save.
"""

_CHAT_MODEL = _CHAT.format(visible_version="true, 0", returning="")
_CHAT_PAGES = _CHAT.format(
    visible_version="(k.value ->> 2)::boolean, (k.value ->> 3)::integer", returning=" RETURNING message_id"
)

_PAGES = """\
pages AS (
    UPDATE agent_chat_messages AS p SET version = p.version + 1, payload = u.value -> 3
    FROM header, json_array_elements(%(page_updates)s::json) AS u
    WHERE p.tenant_id = %(tenant)s::text AND p.conversation_id = %(conversation_id)s::text
        AND p.message_id = u.value ->> 0
        AND p.role = u.value ->> 1 AND p.version = (u.value ->> 2)::integer AND NOT p.model_visible
    RETURNING p.message_id
)"""
"""The compare-and-swap of page messages that show a page action's new state, in the save that changes it.

Each update is the message's id, role, the version it was read at and its new payload
(with the next version), as `SqlChatMemory.update` writes it: a message changed since it
was read (another version) is left alone, and the caller reconciles it afresh. Selected
FROM the header's RETURNING, as `_CHAT`. Only the saves that change a page action's state
carry it (a card shown, a decision), so a statement with it may be longer than psycopg's
cache of converted texts (`_statement`): the rare page step pays the conversion.
"""

_PAGE_RESULTS = """, (SELECT json_agg(message_id) FROM pages)::text, (SELECT json_agg(message_id) FROM chat)::text"""
"""What a save with `_PAGES` returns besides the header's flags: the ids of the page messages it updated, and of the messages it inserted."""


def _added_rows(child: bool, conversations: bool, chat: bool = False, pages: bool = False) -> str:
    """The CTEs after `header` that write a save's new messages and events, for one kind of save.

    `child`: the events are a child turn's, whose tree counter is on its root's row;
    `conversations`: some events go to a conversation, whose counter is bumped too;
    `chat`: the save also projects messages into its conversation's ChatMemory (`_CHAT`);
    `pages`: and updates page messages (`_PAGES`).
    """
    tree = "root" if child else "header"
    parts = [_MESSAGES]
    if pages:
        parts += [_CHAT_PAGES, _PAGES]
    elif chat:
        parts.append(_CHAT_MODEL)
    if child:
        parts.append(_ROOT_COUNTER)
    if conversations:
        parts.append(_CONVERSATION_COUNTERS.format(tree=tree))
        position = "conversation.last_position + (k.value ->> 9)::bigint"
        join = "\n        LEFT JOIN conversations AS conversation ON conversation.conversation_id = k.value ->> 3"
    else:
        position, join = "NULL::bigint", ""
    # A child's tree position comes from `root`; when its root is not stored, there is none
    # (LEFT JOIN: NULL, which the NOT NULL column refuses, rather than no event rows).
    tree_join = "\n        LEFT JOIN root ON true" if child else ""
    parts.append(
        _EVENTS.format(
            tree_position=f"{tree}.event_position",
            tree_join=tree_join,
            conversation_position=position,
            conversation_join=join,
        )
    )
    return ", ".join(parts)


_ADDED_ROWS_DOC = """The INSERTs of a save's new messages (from seq `known` on) and events, fed by the `header` CTE.

They are selected FROM the header's RETURNING: when the header was not written, nothing
is. Each message comes as its payload (in one JSON array of them) and its key columns (in
a small JSON array of arrays beside it, so the server never digs them out of a large
payload). Each event comes as one array of its fields (see `event_fields`); its payload is
the text of those fields put together in the order of `AgentEvent`'s fields, the JSON
`model_dump_json` would give (a `json` value keeps the text it was given, so `->` and
`::text` return each field exactly as the client wrote it). Events go in in their order,
and an event id already stored is skipped.

Before the events, the save bumps the counters of the scopes they go to (see
`store._event_log`): its tree's, on the root's row (`event_position`), in the header's
own UPDATE or INSERT for a root turn (`own_events`), in `root` for a child
(`root_events`); then its conversations' (`conversations`, in id order), which read the
tree's new position, so that they run after it and take their locks in that order. Each
event goes at its scopes' new last positions plus its offsets. A child whose root is not
stored gets no tree position, and the NOT NULL column refuses the whole statement. The
row locks last until the statement commits, so the next save of the same tree or
conversation takes the positions after these. Each kind of save has a statement of its
own (`save_statement`), so a root turn's save outside a conversation, the common step,
carries no counter work beyond a column of its header.
"""


def _set(column: Column) -> str:
    """A column's assignment in the save's UPDATE, by its save rule."""
    new = f"%({column.name})s::{column.pg_type}"
    if column.save is SaveRule.OR:
        return f"{column.name} = t.{column.name} OR {new}"
    if column.save is SaveRule.NEVER_DOWN:
        return f"{column.name} = coalesce({new}, t.{column.name})"
    return f"{column.name} = {new}"


_SAVE = f"""\
WITH header AS (
    UPDATE agent_turns AS t SET
        {", ".join(_set(column) for column in WRITTEN if column.name != "id")},
        event_position = t.event_position + %(own_events)s::bigint,
        status_changed_at = CASE
            WHEN t.status = %(status)s::text AND t.status_changed_at <= %(updated_at)s::timestamptz
            THEN t.status_changed_at ELSE %(updated_at)s::timestamptz END
    WHERE t.id = %(id)s::text
        AND t.version = %(expected_version)s::integer
        AND t.message_count = %(known)s::integer
        AND (%(lease_fence)s::bigint IS NULL OR t.lease_fence IS NULL OR t.lease_fence <= %(lease_fence)s::bigint)
    RETURNING t.cancel_requested, t.cancel_reason, t.lease_fence, t.event_position
), {{added}}
SELECT cancel_requested, cancel_reason, lease_fence{{pages}} FROM header"""
"""The compare-and-swap save of a header with its new messages and events (see `save_statement`).

Generated from the column table (`store.turns.columns`). The UPDATE matches only the
expected version and message count, and a fence no lower than the stored one. The cancel
flag only goes from False to True and the fence only up, so they are or'ed and coalesced
with the stored values, and RETURNING reads them back with the cancel reason; when
it matches no row, nothing at all is written (see `_ADDED_ROWS_DOC`). `status_changed_at`
moves only with the status, and never past `updated_at`. The text starts with
`WITH header`, as `pg_stat_activity` shows it.
"""

_CREATE = f"""\
WITH header AS (
    INSERT INTO agent_turns ({", ".join(column.name for column in WRITTEN)}, status_changed_at, event_position)
    VALUES (
        {", ".join(f"%({column.name})s::{column.pg_type}" for column in WRITTEN)},
        %(updated_at)s::timestamptz, %(own_events)s::bigint
    )
    ON CONFLICT DO NOTHING
    RETURNING id, event_position
), {{added}}
SELECT id FROM header"""
"""The INSERT of a new turn with its messages and events (see `create_statement`).

ON CONFLICT DO NOTHING covers the primary key and the active-conversation index alike:
no row comes back when either refused the turn, and then nothing at all was written.
Parameters are those of `_SAVE` (`expected_version` unused, `known` 0).
"""


@cache
def _statement(template: str, child: bool, conversations: bool, chat: bool, pages: bool = False) -> str:
    # On one line, each run of white space one space: psycopg caches the conversion of a
    # statement's placeholders only for texts of up to 4,096 characters, and parsing the
    # largest kinds again at every save cost a quarter of a millisecond of CPU. The text
    # holds no comments and no string literal with white space in it.
    added = template.replace("{added}", _added_rows(child, conversations, chat, pages))
    return " ".join(added.replace("{pages}", _PAGE_RESULTS if pages else "").split())


def save_statement(parameters: Mapping[str, Any]) -> str:
    """The one autocommitted statement of a save with these parameters (`save_parameters`): `_SAVE` with its INSERTs.

    Its text is one of eight, by whether the events are a child turn's, whether any goes
    to a conversation (see `_ADDED_ROWS_DOC`) and whether it projects messages into
    ChatMemory (`chat_parameters`); each is prepared once per connection.
    """
    return _statement(
        _SAVE,
        parameters["root_events"] > 0,
        parameters["conversations"] != "[]",
        "chat_count" in parameters,
        "page_updates" in parameters,
    )


def create_statement(parameters: Mapping[str, Any]) -> str:
    """The one autocommitted statement of a creation with these parameters: `_CREATE` with its INSERTs."""
    return _statement(
        _CREATE, parameters["root_events"] > 0, parameters["conversations"] != "[]", "chat_count" in parameters
    )


def chat_parameters(
    turn: AgentTurn, parameters: Mapping[str, Any], pages: Sequence[AnyMessage] | None = None
) -> dict[str, Any] | None:
    """The parameters that make a save of `turn` (`parameters`) project its unprojected messages (`_CHAT`).

    `pages`, for a save that writes page messages (`_PAGES`, whose statement takes each
    message's keys in full), are page messages to append after them. None when there is nothing to project.
    System messages are never projected. The messages' JSON is the save's own when they
    are exactly the save's new messages (the common step), so each is encoded once.
    """
    start = turn.projected_count
    projected = [m for m in turn.messages[start:] if not isinstance(m, SystemMessage)]
    if not projected and not pages:
        return None
    if pages is None and start == parameters["known"] and len(projected) == len(turn.messages) - start:
        keys, payloads = parameters["message_keys"], parameters["messages"]
    elif pages is None:
        keys = to_json([[m.id, m.role] for m in projected]).decode()
        payloads = "[" + ",".join([message.model_dump_json() for message in projected]) + "]"
    else:  # the keys `_CHAT_PAGES` reads
        keyed = [[m.id, m.role, m.model_visible, getattr(m, "version", 0)] for m in [*projected, *pages]]
        keys = to_json(keyed).decode()
        payloads = "[" + ",".join([message.model_dump_json() for message in [*projected, *pages]]) + "]"
    return {"chat_count": len(projected) + len(pages or ()), "chat_keys": keys, "chat_messages": payloads}


PAGE_MESSAGES = (
    "SELECT message_id, payload::text FROM agent_chat_messages"
    " WHERE tenant_id = %(tenant)s::text AND conversation_id = %(conversation_id)s::text"
    " AND message_id = ANY(%(ids)s::text[])"
)
"""The stored page messages of a save's unsynced page actions (`ids`), as JSON text."""


@dataclass(frozen=True)
class PageWrites:
    """What a save writes into the page messages of its unsynced page actions.

    Attributes:
        inserts: Page messages missing from ChatMemory, in the actions' states.
        updates: (message, version read) of the stored page messages to change.
        shown: Ids of the messages that already show their action's state.
    """

    inserts: list[AnyMessage]
    updates: list[tuple[AnyMessage, int]]
    shown: set[str]


def page_writes(unsynced: Sequence[PageAction], stored: Mapping[str, str]) -> PageWrites:
    """The writes that bring the page messages (`stored`: id to JSON) to the state of the `unsynced` actions."""
    writes = PageWrites([], [], set())
    for action in unsynced:
        found = stored.get(action.message_id)
        if found is None:
            writes.inserts.append(page_message(action.payload, action.status, action.decision))
            continue
        message = AnyMessageAdapter.validate_json(found)
        updated = page_message_update(message, action)
        if updated is None:
            writes.shown.add(action.message_id)
        else:
            writes.updates.append((updated, updated.version))
    return writes


def page_parameters(writes: PageWrites, chat: Mapping[str, Any] | None) -> dict[str, Any]:
    """The parameters of `_PAGES`; the inserts go with the chat messages (`chat_parameters`)."""
    updates = [
        [message.id, message.role, version, message.model_copy(update={"version": version + 1}).model_dump(mode="json")]
        for message, version in writes.updates
    ]
    parameters: dict[str, Any] = {"page_updates": to_json(updates).decode()}
    if chat is None:  # no message to insert: `_CHAT` still runs, with nothing
        parameters.update({"chat_count": 0, "chat_keys": "[]", "chat_messages": "[]"})
    return parameters


def with_pages_synced(saved: AgentTurn, writes: PageWrites, updated: str | None, inserted: str | None) -> AgentTurn:
    """`saved` with the page actions whose messages now show their state marked synced.

    Those the save updated (`updated`) or inserted (`inserted`, JSON arrays of ids) and
    those already shown. The others (changed since they were read, or inserted meanwhile)
    stay unsynced, for the runner to reconcile afresh.
    """
    synced = set(writes.shown)
    for ids in (updated, inserted):
        if ids is not None:
            synced.update(json.loads(ids))
    if not synced:
        return saved
    actions = [
        action.model_copy(update={"synced": True}) if action.message_id in synced else action
        for action in saved.page_actions
    ]
    return saved.model_copy(update={"page_actions": actions})


LOAD = f"""\
SELECT {", ".join(f"t.{name}" for name in READ)}, probe.message_id,
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


@cache
def list_statement(columns: tuple[str, ...], statuses: bool) -> str:
    """`SqlAgentTurnStore.list_turns` as one statement: the matching headers, newest saved first, with their messages.

    Rows are laid out as `LOAD`'s (no probe): the header columns, NULL, then the turn's
    messages as one JSON array (NULL when none). Messages past the header's count belong to
    a save that committed after the header was read, and the header decides the snapshot.
    Parameters: `limit`, `statuses` (a list of status texts) when `statuses`, and one per
    column of `columns` (the header columns that must equal it). One text per kind of
    filter, each prepared once per connection.
    """
    conditions = [f"t.{name} = %({name})s::text" for name in columns]
    if statuses:
        conditions.append("t.status = ANY(%(statuses)s::text[])")
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    return (
        f"SELECT {', '.join(f't.{name}' for name in READ)}, NULL::text,"
        " (SELECT json_agg(m.payload ORDER BY m.seq) FROM agent_turn_messages AS m"
        " WHERE m.turn_id = t.id AND m.seq < t.message_count)::text"
        f" FROM agent_turns AS t{where} ORDER BY t.updated_at DESC, t.id LIMIT %(limit)s::integer"
    )


REF = "SELECT id, version, status, updated_at, next_retry_at, cancel_requested FROM agent_turns WHERE id = %(id)s::text"
"""The header fields of a `TurnRef`."""


CANCELLED_AMONG = "SELECT id FROM agent_turns WHERE id = ANY(%(ids)s::text[]) AND cancel_requested"
"""The ids among `ids` whose cancel is requested: one prepared statement whatever their number."""


def cursor(lent: DriverConnection) -> Cursor[Any]:
    """The cursor of a lent connection, made once and reused (its adapters stay cached)."""
    return driver_cursor(lent)  # type: ignore[no-any-return]


def save_parameters(
    turn: AgentTurn,
    expected_version: int,
    known: int,
    state: str,
    messages: Sequence[ModelMessage],
    events: Sequence[AgentEvent],
) -> dict[str, Any]:
    """The parameters of `save_statement` for a save of `turn` over the stored version and message count.

    `state` is the snapshot's `state` column as JSON text; `messages` are those added
    since the stored snapshot; `events` are the event log's copies of the durable events.
    """
    parameters = {column.name: _parameter(column, turn) for column in WRITTEN if column.name != "state"}
    parameters["version"] = expected_version + 1
    parameters["state"] = state
    # The tenant of the turn's conversation, where its events and ChatMemory rows are keyed.
    parameters["tenant"] = tenant_key(turn.tenant_id)
    return {
        **parameters,
        "expected_version": expected_version,
        "known": known,
        "message_keys": to_json([[m.id, m.role] for m in messages]).decode(),
        # One message at a time: the same JSON as through the union's adapter, with less CPU.
        "messages": "[" + ",".join([message.model_dump_json() for message in messages]) + "]",
        **event_parameters(turn, events),
    }


def event_parameters(turn: AgentTurn, events: Sequence[AgentEvent]) -> dict[str, Any]:
    """The parameters of `save_statement` and `create_statement` that place the event log's copies of a save's events."""
    if not events:
        return {"own_events": 0, "root_events": 0, "conversations": "[]", "events": "[]"}
    claim = claim_positions(events)
    fields = [event_fields(event, *offsets) for event, offsets in zip(events, claim.offsets, strict=True)]
    own = turn.id == turn.root_turn_id
    return {
        "own_events": len(events) if own else 0,
        "root_events": 0 if own else len(events),
        "conversations": to_json(claim.conversations).decode(),
        "events": to_json(fields).decode(),
    }


def event_fields(event: AgentEvent, tree_offset: int, conversation_offset: int | None) -> list[Any]:
    """An event of a save as `_ADDED_ROWS` takes it: its key columns, its timestamp and data as given, its offsets.

    The key columns are the event id, turn id, root turn id, conversation id, type and the
    time in UTC (the `created_at` column); the payload is made of the same fields, as JSON,
    so each is encoded once. An event log keeps events without the cursor they were read at.
    The offsets place the event from the last positions of its tree and conversation (see
    `store._event_log.PositionClaim`).
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
        tree_offset,
        conversation_offset,
    ]


def _parameter(column: Column, turn: AgentTurn) -> Any:
    """A column's parameter for a snapshot: its value, timestamps aware."""
    value = column.value(turn)
    return _aware(value) if column.name in TIMES and value is not None else value


def _aware(value: datetime) -> datetime:
    """A timestamp to store: naive ones are UTC, as `store.schema.UtcDateTime` takes them."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def header_values(row: Sequence[Any]) -> dict[str, Any]:
    """The header columns of a `LOAD` row by name, timestamps in UTC as the SQLAlchemy path gives them."""
    values = dict(zip(READ, row, strict=False))
    for name in TIMES & values.keys():
        value: datetime | None = values[name]
        if value is not None:
            values[name] = value.astimezone(UTC)
    return values


PROBE_INDEX = len(READ)
"""Position of the probed message id in a `LOAD` row; the messages' JSON follows it."""


def utc(value: datetime | None) -> datetime | None:
    """A timestamp read from the driver, in UTC."""
    return None if value is None else value.astimezone(UTC)

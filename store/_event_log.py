"""The event log of `SqlAgentTurnStore`: where the events of a save are placed, and how readers page through them.

Every turn tree (`root_turn_id`) and every conversation numbers its events 1, 2, 3, ...
An event gets its place in both scopes from a counter per scope: the tree's is
`event_position` on its root turn's row (a root's own saves rewrite that row anyway), a
conversation's is its row in `agent_event_conversations`. The save bumps them by the
number of its events, in the same statement or transaction as the snapshot and the event
rows, and holds their row locks until it commits, so the next save of the same scope
waits for it and takes the positions after it: within a scope, positions follow commit
order. A reader that sees position `p` therefore sees every committed position below `p`
too (a save becomes visible before its locks are let go), and paging by position never
skips an event, whatever else runs on the database server. Positions of a save that
rolled back, or of an event id that was already stored, are simply never used; a gap
means nothing.

Every save takes its locks in one order: its own turn's row, then its tree's root row (a
child's save), then its conversations' counters by id. Two saves can wait on each other,
never in a cycle.

A queued message's events (MESSAGE_QUEUED, MESSAGE_FAILED) come before its turn exists:
they are filed under the id the turn will have, at tree positions the tree's own events
never take (MESSAGE_QUEUED_POSITION, MESSAGE_FAILED_POSITION: the counter hands out 1, 2,
...), so a tree read never shows them, and at the next position of their conversation.
They take only the conversation's counter lock; the inbox writes them in the transaction
that queues or fails the message.

Cursors are the position in the scope read (`"17"`). Cursors of the earlier read order,
`<xid>.<id>` (transaction id, then row id; `0.<id>` on SQLite), still work: the events
written then kept their transaction id, and positions were given to them in that order
(migration 0006), so such a cursor stands for the last of them at or before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from agent_runner.errors import InvalidCursorError, StoreError
from agent_runner.events import AgentEvent
from agent_runner.persistence import EventScope, EventScopeKind, format_position, parse_position
from agent_runner.snapshot import AgentTurn
from store._engine import dialect_insert
from store.schema import event_conversations, tenant_key, tenant_of, turn_events, turns

MESSAGE_QUEUED_POSITION = 0
"""The tree position of a MESSAGE_QUEUED event (below every position of the tree's own events)."""
MESSAGE_FAILED_POSITION = -1
"""The tree position of a MESSAGE_FAILED event."""


def needs_root_conversation(turn: AgentTurn, events: Sequence[AgentEvent]) -> bool:
    """Whether a child turn's events leave out the conversation, which then is its root's."""
    return (
        turn.conversation_id is None
        and turn.root_turn_id != turn.id
        and any(e.conversation_id is None and e.type.is_durable for e in events)
    )


@dataclass(frozen=True)
class PositionClaim:
    """The positions a save takes for its events, before it knows where each scope stands.

    A save adds `len(offsets)` to its tree's counter and `count` to the counter of each
    conversation in `conversations` (in the order given, the lock order), and reads back
    the new last positions; event `i` then sits at those plus `offsets[i]` in its tree and
    in its conversation (None: it has none).
    """

    conversations: list[tuple[str, int]]
    """`(conversation_id, count)` per conversation, sorted by id."""
    offsets: list[tuple[int, int | None]]
    """Per event: its offset from the last position of its tree, and of its conversation (zero or below)."""


def claim_positions(events: Sequence[AgentEvent]) -> PositionClaim:
    """Where the event log's copies of a save's events land (they are all in the tree of the saved turn)."""
    counts: dict[str, int] = {}
    ranks: list[int] = []
    for event in events:
        if event.conversation_id is not None:
            counts[event.conversation_id] = counts.get(event.conversation_id, 0) + 1
        ranks.append(0 if event.conversation_id is None else counts[event.conversation_id])
    total = len(events)
    offsets = [
        (index + 1 - total, None if event.conversation_id is None else rank - counts[event.conversation_id])
        for index, (event, rank) in enumerate(zip(events, ranks, strict=True))
    ]
    return PositionClaim(sorted(counts.items()), offsets)


class SqlEventLog:
    """The statements of the event log on one engine's dialect, and their use on a connection of the caller."""

    def __init__(self, engine: Engine) -> None:
        self._insert = dialect_insert(engine, turn_events).on_conflict_do_nothing(
            index_elements=[turn_events.c.event_id]
        )
        self._bump_tree = (
            sa.update(turns)
            .where(turns.c.id == sa.bindparam("root"))
            .values(event_position=turns.c.event_position + sa.bindparam("count", type_=sa.BigInteger))
            .returning(turns.c.event_position)
        )
        bump = dialect_insert(engine, event_conversations).values(
            tenant_id=sa.bindparam("tenant"),
            conversation_id=sa.bindparam("conversation"),
            last_position=sa.bindparam("count"),
        )
        self._bump_conversation = bump.on_conflict_do_update(
            index_elements=[event_conversations.c.tenant_id, event_conversations.c.conversation_id],
            set_={"last_position": event_conversations.c.last_position + bump.excluded.last_position},
        ).returning(event_conversations.c.last_position)
        self._postgres = engine.dialect.name == "postgresql"
        kinds: tuple[EventScopeKind, ...] = ("tree", "conversation")
        self._reads = {kind: _read_statement(kind) for kind in kinds}
        self._legacy = {kind: _legacy_statement(kind) for kind in kinds}

    def write(self, connection: Connection, turn: AgentTurn, kept: Sequence[AgentEvent]) -> None:
        """Insert the event log's copies of a save's events inside its transaction, each at its positions.

        Raises:
            StoreError: The turn's root turn is not stored, so its events have no tree to go to.
        """
        if not kept:
            return
        claim = claim_positions(kept)
        tree_last = connection.execute(self._bump_tree, {"root": turn.root_turn_id, "count": len(kept)}).scalar()
        if tree_last is None:
            raise StoreError(missing_root(turn))
        tenant = tenant_key(turn.tenant_id)
        last = {
            conversation: connection.execute(
                self._bump_conversation, {"tenant": tenant, "conversation": conversation, "count": count}
            ).scalar_one()
            for conversation, count in claim.conversations
        }
        rows = []
        for event, (tree_offset, conversation_offset) in zip(kept, claim.offsets, strict=True):
            rows.append(
                {
                    "event_id": event.event_id,
                    "turn_id": event.turn_id,
                    "root_turn_id": turn.root_turn_id,
                    "conversation_id": event.conversation_id,
                    "tenant_id": tenant,
                    "type": event.type.value,
                    "created_at": event.timestamp,
                    "payload": event.model_dump(mode="json", exclude={"cursor"}),
                    "root_position": tree_last + tree_offset,
                    "conversation_position": (
                        None
                        if conversation_offset is None or event.conversation_id is None
                        else last[event.conversation_id] + conversation_offset
                    ),
                }
            )
        connection.execute(self._insert, rows)

    def write_message_event(self, connection: Connection, event: AgentEvent, root_position: int) -> bool:
        """Insert a queued message's event at the next position of its conversation; False when its id is stored.

        The event's tree is its `turn_id` (the turn the message starts as), where it sits at
        `root_position`, one of the positions the tree's counter never hands out.
        """
        if event.conversation_id is None:
            raise ValueError(f"the message event {event.event_id!r} names no conversation")
        tenant = tenant_key(event.tenant_id)
        position = connection.execute(
            self._bump_conversation, {"tenant": tenant, "conversation": event.conversation_id, "count": 1}
        ).scalar_one()
        row = {
            "event_id": event.event_id,
            "turn_id": event.turn_id,
            "root_turn_id": event.turn_id,
            "conversation_id": event.conversation_id,
            "tenant_id": tenant,
            "type": event.type.value,
            "created_at": event.timestamp,
            "payload": event.model_dump(mode="json", exclude={"cursor"}),
            "root_position": root_position,
            "conversation_position": position,
        }
        return connection.execute(self._insert, row).rowcount == 1

    def read(self, connection: Connection, scope: EventScope, after: str | None, limit: int) -> list[AgentEvent]:
        """Up to `limit` events of a scope after the cursor `after`, each with its cursor.

        Raises:
            InvalidCursorError: `after` is not a cursor of this log.
        """
        start = 0
        if after is not None:
            position, legacy = self._parse(after)
            if legacy is None:
                start = position
            else:
                xid, row_id = legacy
                start = connection.execute(
                    self._legacy[scope.kind],
                    {"scope": scope.id, "tenant": tenant_key(scope.tenant_id), "xid": xid, "row_id": row_id},
                ).scalar_one()
        rows = connection.execute(
            self._reads[scope.kind],
            {"scope": scope.id, "tenant": tenant_key(scope.tenant_id), "after": start, "limit": limit},
        ).all()
        # The columns name an event's conversation: the payloads of events stored before the
        # tenant was kept beside the conversation id carry the id the tenant's name was inside of.
        return [
            AgentEvent.model_validate(
                {
                    **row.payload,
                    "conversation_id": row.conversation_id,
                    "tenant_id": tenant_of(row.tenant_id),
                    "cursor": format_position(row.position),
                }
            )
            for row in rows
        ]

    def check_cursor(self, cursor: str) -> None:
        """Raise `InvalidCursorError` unless `cursor` is one this log issues (or issued before positions)."""
        self._parse(cursor)

    def _parse(self, cursor: str) -> tuple[int, tuple[int, int] | None]:
        """The position of a cursor, or the `(xid, id)` of one of the earlier read order."""
        dots = cursor.count(".")
        if dots == 0:
            return parse_position(cursor, 1)[0], None
        if dots != 1:
            raise InvalidCursorError(
                cursor, "expected an event position (or an `<xid>.<id>` cursor of an earlier version)"
            )
        xid, row_id = parse_position(cursor, 2)
        if xid != 0 and not self._postgres:
            raise InvalidCursorError(cursor, "an earlier SQLite event cursor starts with 0.")
        return 0, (xid, row_id)


_NOT_NULL_VIOLATION = "23502"


def raise_if_no_tree(error: sa_exc.IntegrityError, turn: AgentTurn) -> None:
    """Raise a clear `StoreError` when a one-statement save was refused for want of its tree's root row.

    The statement places a child's events from its root's row; without that row they get no
    tree position, which the NOT NULL column refuses (nothing at all is written then).
    """
    if getattr(error.orig, "sqlstate", None) == _NOT_NULL_VIOLATION and turn.root_turn_id != turn.id:
        raise StoreError(missing_root(turn)) from error


def missing_root(turn: AgentTurn) -> str:
    """Why the events of a turn whose root turn is not stored cannot be saved."""
    return (
        f"turn {turn.id!r} names root turn {turn.root_turn_id!r}, which is not stored: "
        "its events have no turn tree to go to, so nothing was saved"
    )


def _scope_columns(kind: EventScopeKind) -> tuple[sa.ColumnElement[bool], sa.Column[Any]]:
    """Which rows are a scope's (parameters `scope`, and `tenant` for a conversation), and their position column."""
    if kind == "tree":
        return turn_events.c.root_turn_id == sa.bindparam("scope"), turn_events.c.root_position
    named = sa.and_(
        turn_events.c.tenant_id == sa.bindparam("tenant"), turn_events.c.conversation_id == sa.bindparam("scope")
    )
    return named, turn_events.c.conversation_position


def _read_statement(kind: EventScopeKind) -> sa.Select[Any]:
    """The page of a scope's events after a position; parameters `scope`, `tenant`, `after`, `limit`."""
    where, position = _scope_columns(kind)
    return (
        sa.select(
            position.label("position"), turn_events.c.payload, turn_events.c.conversation_id, turn_events.c.tenant_id
        )
        .where(where, position > sa.bindparam("after", type_=sa.BigInteger))
        .order_by(position)
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )


def _legacy_statement(kind: EventScopeKind) -> sa.Select[Any]:
    """The position an `<xid>.<id>` cursor stands for in a scope: its last event at or before it (0: none).

    Only events written before positions existed have an `xid`, and their positions follow
    `(xid, id)`; parameters `scope`, `tenant`, `xid`, `row_id`.
    """
    where, position = _scope_columns(kind)
    return sa.select(sa.func.coalesce(sa.func.max(position), 0)).where(
        where,
        turn_events.c.xid.is_not(None),
        sa.tuple_(turn_events.c.xid, turn_events.c.id)
        <= sa.tuple_(sa.bindparam("xid", type_=sa.BigInteger), sa.bindparam("row_id", type_=sa.BigInteger)),
    )

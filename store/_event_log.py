"""The event log of `SqlAgentTurnStore`: where the events of a save are placed, and how readers page through them.

Every turn tree (`root_turn_id`) and every conversation numbers its events 1, 2, 3, ...
An event gets its place in both scopes from a counter row per scope (`agent_event_scopes`)
that the save bumps by the number of its events, in the same statement or transaction as
the snapshot and the event rows. The bump holds the counter's row lock until the save
commits, so the next save of the same scope waits for it and takes the positions after
it: within a scope, positions follow commit order. A reader that sees position `p`
therefore sees every committed position below `p` too (a save becomes visible before its
locks are let go), and paging by position never skips an event, whatever else runs on
the database server. Positions of a save that rolled back, or of an event id that was
already stored, are simply never used; a gap means nothing.

A save of a child turn bumps its tree and its root's conversation. Every save takes its
counters in one fixed order (by kind, then id), after its own turn's row, so two saves
can wait on each other but never in a cycle.

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
from sqlalchemy.engine import Connection

from agent_runner.errors import InvalidCursor
from agent_runner.events import AgentEvent
from agent_runner.in_memory import stored_event
from agent_runner.persistence import format_position, parse_position
from agent_runner.snapshot import AgentTurn
from store._engine import dialect_insert
from store.schema import event_scopes, turn_events

ROOT = "root"
CONVERSATION = "conversation"


def needs_root_conversation(turn: AgentTurn, events: Sequence[AgentEvent]) -> bool:
    """Whether a child turn's events leave out the conversation, which then is its root's."""
    return (
        turn.conversation_id is None
        and turn.root_turn_id != turn.id
        and any(e.conversation_id is None and e.type.is_durable for e in events)
    )


def kept_events(turn: AgentTurn, events: Sequence[AgentEvent], root_conversation_id: str | None) -> list[AgentEvent]:
    """The event log's copies of the durable events among `events`, once per event id, in order."""
    kept: list[AgentEvent] = []
    seen: set[str] = set()
    for event in events:
        if not event.type.is_durable or event.event_id in seen:
            continue
        seen.add(event.event_id)
        kept.append(stored_event(event, turn, root_conversation_id))
    return kept


@dataclass(frozen=True)
class PositionClaim:
    """The positions a save takes for its events, before it knows where each scope stands.

    A save adds `count` to the counter of each scope in `scopes` (in the order given, the
    fixed lock order) and reads back the new last position; event `i` then sits at that
    position plus `offsets[i]` in its tree and in its conversation (None: it has none).
    """

    scopes: list[tuple[str, str, int]]
    """`(kind, scope_id, count)` per scope, sorted by kind, then id."""
    offsets: list[tuple[int, int | None]]
    """Per event: its offset from the last position of its tree, and of its conversation (zero or below)."""


def claim_positions(events: Sequence[AgentEvent]) -> PositionClaim:
    """The counters a save bumps for `events` (the event log's copies) and where each event lands."""
    counts: dict[tuple[str, str], int] = {}
    ranks: list[tuple[int, int | None]] = []
    for event in events:
        tree = (ROOT, event.root_turn_id or event.turn_id)
        counts[tree] = counts.get(tree, 0) + 1
        in_conversation: int | None = None
        if event.conversation_id is not None:
            conversation = (CONVERSATION, event.conversation_id)
            counts[conversation] = in_conversation = counts.get(conversation, 0) + 1
        ranks.append((counts[tree], in_conversation))
    offsets = []
    for event, (tree_rank, conversation_rank) in zip(events, ranks, strict=True):
        tree_offset = tree_rank - counts[(ROOT, event.root_turn_id or event.turn_id)]
        conversation_offset = (
            None
            if conversation_rank is None or event.conversation_id is None
            else conversation_rank - counts[(CONVERSATION, event.conversation_id)]
        )
        offsets.append((tree_offset, conversation_offset))
    return PositionClaim([(kind, scope, count) for (kind, scope), count in sorted(counts.items())], offsets)


class SqlEventLog:
    """The statements of the event log on one engine's dialect, and their use on a connection of the caller."""

    def __init__(self, connection_or_engine: Any) -> None:
        self._insert = dialect_insert(connection_or_engine, turn_events).on_conflict_do_nothing(
            index_elements=[turn_events.c.event_id]
        )
        bump = dialect_insert(connection_or_engine, event_scopes).values(
            kind=sa.bindparam("kind"), scope_id=sa.bindparam("scope_id"), last_position=sa.bindparam("count")
        )
        self._bump = bump.on_conflict_do_update(
            index_elements=[event_scopes.c.kind, event_scopes.c.scope_id],
            set_={"last_position": event_scopes.c.last_position + bump.excluded.last_position},
        ).returning(event_scopes.c.last_position)
        self._postgres = connection_or_engine.dialect.name == "postgresql"
        self._reads = {kind: _read_statement(kind) for kind in (ROOT, CONVERSATION)}
        self._legacy = {kind: _legacy_statement(kind) for kind in (ROOT, CONVERSATION)}

    def write(self, connection: Connection, kept: Sequence[AgentEvent]) -> None:
        """Insert the event log's copies of a save's events inside its transaction, each at its positions."""
        if not kept:
            return
        claim = claim_positions(kept)
        last: dict[tuple[str, str], int] = {}
        for kind, scope_id, count in claim.scopes:
            last[(kind, scope_id)] = connection.execute(
                self._bump, {"kind": kind, "scope_id": scope_id, "count": count}
            ).scalar_one()
        rows = []
        for event, (tree_offset, conversation_offset) in zip(kept, claim.offsets, strict=True):
            rows.append(
                {
                    "event_id": event.event_id,
                    "turn_id": event.turn_id,
                    "root_turn_id": event.root_turn_id,
                    "conversation_id": event.conversation_id,
                    "type": event.type.value,
                    "created_at": event.timestamp,
                    "payload": event.model_dump(mode="json", exclude={"cursor"}),
                    "root_position": last[(ROOT, event.root_turn_id or event.turn_id)] + tree_offset,
                    "conversation_position": (
                        None
                        if conversation_offset is None or event.conversation_id is None
                        else last[(CONVERSATION, event.conversation_id)] + conversation_offset
                    ),
                }
            )
        connection.execute(self._insert, rows)

    def read(self, connection: Connection, kind: str, scope_id: str, after: str | None, limit: int) -> list[AgentEvent]:
        """Up to `limit` events of a scope after the cursor `after`, each with its cursor.

        Raises:
            InvalidCursor: `after` is not a cursor of this log.
        """
        start = 0
        if after is not None:
            position, legacy = self._parse(after)
            if legacy is None:
                start = position
            else:
                xid, row_id = legacy
                start = connection.execute(
                    self._legacy[kind], {"scope": scope_id, "xid": xid, "row_id": row_id}
                ).scalar_one()
        rows = connection.execute(self._reads[kind], {"scope": scope_id, "after": start, "limit": limit}).all()
        return [AgentEvent.model_validate({**row.payload, "cursor": format_position(row.position)}) for row in rows]

    def check_cursor(self, cursor: str) -> None:
        """Raise `InvalidCursor` unless `cursor` is one this log issues (or issued before positions)."""
        self._parse(cursor)

    def _parse(self, cursor: str) -> tuple[int, tuple[int, int] | None]:
        """The position of a cursor, or the `(xid, id)` of one of the earlier read order."""
        dots = cursor.count(".")
        if dots == 0:
            return parse_position(cursor, 1)[0], None
        if dots != 1:
            raise InvalidCursor(cursor, "expected an event position (or an `<xid>.<id>` cursor of an earlier version)")
        xid, row_id = parse_position(cursor, 2)
        if xid != 0 and not self._postgres:
            raise InvalidCursor(cursor, "an earlier SQLite event cursor starts with 0.")
        return 0, (xid, row_id)


def prune_counters(connection: Connection, roots: Sequence[str]) -> None:
    """Delete the counters of pruned turn trees (conversations go on, so theirs stay)."""
    connection.execute(sa.delete(event_scopes).where(event_scopes.c.kind == ROOT, event_scopes.c.scope_id.in_(roots)))


def _scope_columns(kind: str) -> tuple[sa.Column[Any], sa.Column[Any]]:
    if kind == ROOT:
        return turn_events.c.root_turn_id, turn_events.c.root_position
    return turn_events.c.conversation_id, turn_events.c.conversation_position


def _read_statement(kind: str) -> sa.Select[Any]:
    """The page of a scope's events after a position; parameters `scope`, `after`, `limit`."""
    column, position = _scope_columns(kind)
    return (
        sa.select(position.label("position"), turn_events.c.payload)
        .where(column == sa.bindparam("scope"), position > sa.bindparam("after", type_=sa.BigInteger))
        .order_by(position)
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )


def _legacy_statement(kind: str) -> sa.Select[Any]:
    """The position an `<xid>.<id>` cursor stands for in a scope: its last event at or before it (0: none).

    Only events written before positions existed have an `xid`, and their positions follow
    `(xid, id)`; parameters `scope`, `xid`, `row_id`.
    """
    column, position = _scope_columns(kind)
    return sa.select(sa.func.coalesce(sa.func.max(position), 0)).where(
        column == sa.bindparam("scope"),
        turn_events.c.xid.is_not(None),
        sa.tuple_(turn_events.c.xid, turn_events.c.id)
        <= sa.tuple_(sa.bindparam("xid", type_=sa.BigInteger), sa.bindparam("row_id", type_=sa.BigInteger)),
    )

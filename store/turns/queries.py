"""The SQLAlchemy statements of `SqlAgentTurnStore`, built once: the guarded save, the loads, the listings, pruning.

The guarded UPDATE is generated from the column table (`store.turns.columns`), as the
PostgreSQL one-statement texts are, so the two paths write the same columns by the same rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from agent_runner.snapshot import DEADLINE_STATUSES, TERMINAL_STATUSES, AgentTurnStatus
from store.schema import NON_TERMINAL_STATUSES, turn_messages, turns
from store.turns.columns import WRITTEN, SaveRule

_READY = AgentTurnStatus.READY.value
_RETRY = AgentTurnStatus.RETRY_SCHEDULED.value


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


def _saved_value(name: str, rule: SaveRule) -> sa.ColumnElement[Any]:
    """What a save writes into a column by its rule; its parameter is `new_<column>`."""
    column = turns.c[name]
    new = sa.bindparam(f"new_{name}", type_=column.type)
    if rule is SaveRule.OR:
        return sa.or_(column, new)
    if rule is SaveRule.NEVER_DOWN:
        return sa.func.coalesce(new, column)
    return new


def _guarded_update() -> sa.Update:
    """The compare-and-swap UPDATE of a header, with its new messages' count and the stored flags back.

    It matches only the expected version and message count, and a fence no lower than the
    stored one; parameters are `new_<column>` and `match_id/version/count`. The tree's
    event counter is bumped by the writing of events, not here.
    """
    values: dict[Any, Any] = {column.name: _saved_value(column.name, column.save) for column in WRITTEN}
    del values["id"]
    values["status_changed_at"] = _status_changed_at()
    fence = sa.bindparam("new_lease_fence", type_=turns.c.lease_fence.type)
    return (
        sa.update(turns)
        .where(
            turns.c.id == sa.bindparam("match_id"),
            turns.c.version == sa.bindparam("match_version"),
            turns.c.message_count == sa.bindparam("match_count"),
            sa.or_(fence.is_(None), turns.c.lease_fence.is_(None), turns.c.lease_fence <= fence),
        )
        .values(values)
        .returning(turns.c.cancel_requested, turns.c.cancel_reason, turns.c.lease_fence)
    )


GUARDED_UPDATE = _guarded_update()


def turns_matching(statuses: Sequence[AgentTurnStatus] | None, **columns: str | None) -> sa.Select[Any]:
    """The header rows in one of `statuses` (None: any) whose given columns have the given values (None: any)."""
    query = sa.select(turns)
    if statuses is not None:
        query = query.where(turns.c.status.in_([AgentTurnStatus(s).value for s in statuses]))
    for name, value in columns.items():
        if value is not None:
            query = query.where(turns.c[name] == value)
    return query


REF_COLUMNS = (
    turns.c.id,
    turns.c.version,
    turns.c.status,
    turns.c.updated_at,
    turns.c.next_retry_at,
    turns.c.cancel_requested,
)

GET_REF = sa.select(*REF_COLUMNS).where(turns.c.id == sa.bindparam("turn_id"))
"""The header fields of a `TurnRef`; parameter `turn_id`."""

CANCELLED_AMONG = sa.select(turns.c.id).where(
    turns.c.id.in_(sa.bindparam("turn_ids", expanding=True)), turns.c.cancel_requested
)
"""The ids among `turn_ids` whose cancel is requested."""

# For READY and RETRY_SCHEDULED turns `next_retry_at` means "not runnable before" (a delayed
# start, a scheduled retry); the rule is `agent_runner.snapshot.is_runnable`.
_COME = turns.c.next_retry_at <= sa.bindparam("now", type_=turns.c.next_retry_at.type)
_DUE_RETRY = sa.or_(
    sa.and_(turns.c.status == _RETRY, sa.or_(turns.c.next_retry_at.is_(None), _COME)),
    sa.and_(turns.c.status == _READY, _COME),
)
"""Due retries and READY turns whose delayed start has come (a READY turn without a time is not scheduled)."""

LIST_RUNNABLE = (
    sa.select(*REF_COLUMNS)
    .where(
        sa.or_(
            turns.c.status == AgentTurnStatus.RUNNING.value,
            sa.and_(turns.c.status.in_((_READY, _RETRY)), sa.or_(turns.c.next_retry_at.is_(None), _COME)),
        )
    )
    .order_by(turns.c.updated_at, turns.c.id)
    .limit(sa.bindparam("limit", type_=sa.Integer))
)
"""The poll of the embedded workers; parameters `now` and `limit`."""

LIST_DUE_RETRIES = (
    sa.select(*REF_COLUMNS)
    .where(_DUE_RETRY)
    .order_by(turns.c.next_retry_at, turns.c.id)
    .limit(sa.bindparam("limit", type_=sa.Integer))
)
"""The due-retry sweep (delayed starts included); parameters `now` and `limit`."""

LIST_DUE_TIMERS = (
    sa.select(*REF_COLUMNS)
    .where(
        turns.c.wake_at <= sa.bindparam("now", type_=turns.c.wake_at.type),
        turns.c.status.in_([s.value for s in DEADLINE_STATUSES]),
    )
    .order_by(turns.c.wake_at, turns.c.id)
    .limit(sa.bindparam("limit", type_=sa.Integer))
)
"""The deadline sweep: waiting turns whose reminder or deadline has come; parameters `now` and `limit`."""

LOAD_HEADER = (
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

MESSAGES_BETWEEN = (
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
PRUNABLE_ROOTS = (
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

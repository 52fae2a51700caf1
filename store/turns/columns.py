"""The header columns of `agent_turns` a turn store reads and writes, each defined once.

Each column says its name, its PostgreSQL type (the cast in the one-statement texts of
`store.turns.postgres`), how its value is taken from an `AgentTurn`, whether a load puts it
back into the snapshot field of the same name, and how a save writes it. The row mapping
(`store.turns.rows`), the SQLAlchemy statements (`store.turns.queries`) and the PostgreSQL
texts are all generated from `HEADER`; `store.schema.turns` remains the table definition,
and a test checks the two agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from agent_runner.snapshot import AgentTurn
from store.schema import tenant_key, tenant_of


class SaveRule(Enum):
    """How a save writes a column over the stored row (see `agent_runner.store_rules.saved_snapshot`)."""

    REPLACE = "replace"
    """The snapshot's value replaces the stored one."""
    OR = "or"
    """Or'ed with the stored flag: `cancel_requested` never goes back to False."""
    NEVER_DOWN = "never_down"
    """Kept when the snapshot has none: the lease fence. The save's guard refuses a lower one."""
    KEEP = "keep"
    """Never written by a save: the cancel reason, written by a cancel request alone."""


@dataclass(frozen=True)
class Column:
    """One header column of `agent_turns`."""

    name: str
    pg_type: str
    """The PostgreSQL type its parameters are cast to."""
    value: Callable[[AgentTurn], Any]
    """Its value for a snapshot."""
    field: bool = True
    """Whether a load sets the snapshot field of the same name from it (else it is derived from the snapshot)."""
    save: SaveRule = SaveRule.REPLACE
    loaded: Callable[[Any], Any] | None = None
    """How a load turns the column value into the field's (None: as it is)."""


def _state(turn: AgentTurn) -> Any:
    return turn.model_dump(mode="json", exclude=STATE_EXCLUDED)


def _attribute(name: str) -> Callable[[AgentTurn], Any]:
    return lambda turn: getattr(turn, name)


def _column(name: str, pg_type: str, *, save: SaveRule = SaveRule.REPLACE) -> Column:
    return Column(name, pg_type, _attribute(name), save=save)


HEADER: tuple[Column, ...] = (
    _column("id", "text"),
    _column("agent_id", "text"),
    _column("agent_version", "text"),
    _column("conversation_id", "text"),
    _column("parent_turn_id", "text"),
    _column("root_turn_id", "text"),
    Column("status", "text", lambda turn: turn.status.value),
    Column("phase", "text", lambda turn: turn.phase.value),
    _column("version", "integer"),
    Column("message_count", "integer", lambda turn: len(turn.messages), field=False),
    _column("cancel_requested", "boolean", save=SaveRule.OR),
    _column("cancel_reason", "text", save=SaveRule.KEEP),
    _column("lease_fence", "bigint", save=SaveRule.NEVER_DOWN),
    _column("next_retry_at", "timestamptz"),
    _column("created_at", "timestamptz"),
    _column("updated_at", "timestamptz"),
    # `NO_TENANT` without a tenant: the column keys conversations, with `conversation_id`.
    Column("tenant_id", "text", lambda turn: tenant_key(turn.tenant_id), loaded=tenant_of),
    # Derived from the suspension on each save, for the deadline sweep's index.
    Column("wake_at", "timestamptz", _attribute("wake_at"), field=False),
    # Every other field of the snapshot, as JSON (messages have a table of their own).
    Column("state", "json", _state, field=False),
)
"""The header columns of `store.schema.turns` (a test checks they match).

Two more columns belong to the store, not to a snapshot: `status_changed_at` (moves only
with the status) and `event_position` (the tree's event counter, see `store._event_log`).
"""

FIELDS: tuple[str, ...] = tuple(column.name for column in HEADER if column.field)
"""The snapshot fields stored in a column of their own."""

LOADED: dict[str, Callable[[Any], Any]] = {
    column.name: column.loaded for column in HEADER if column.field and column.loaded is not None
}
"""The snapshot fields whose column value a load converts, with the conversion."""

STATE_EXCLUDED: set[str] = {*FIELDS, "messages"}
"""Snapshot fields kept outside the `state` JSON: the header columns, and the message table."""

WRITTEN: tuple[Column, ...] = tuple(column for column in HEADER if column.save is not SaveRule.KEEP)
"""The columns a save writes."""

READ: tuple[str, ...] = tuple(column.name for column in HEADER if column.field or column.name == "state") + (
    "message_count",
)
"""The columns a load reads: the snapshot's fields, its state, and how many messages it has."""

TIMES = frozenset(column.name for column in HEADER if column.pg_type == "timestamptz")
"""The timestamp columns (stored in UTC)."""

"""The column table of the SQL turn store matches the `agent_turns` table and the snapshot model."""

from __future__ import annotations

import json

from sqlalchemy.dialects import postgresql

from agent_runner import AgentTurn, UserMessage
from store.schema import turns
from store.turns.columns import FIELDS, HEADER
from store.turns.rows import new_row, snapshot_of

_PG_TYPES = {
    "VARCHAR": "text",
    "VARCHAR(16)": "text",
    "VARCHAR(32)": "text",
    "TEXT": "text",
    "INTEGER": "integer",
    "BIGINT": "bigint",
    "BOOLEAN": "boolean",
    "TIMESTAMP WITH TIME ZONE": "timestamptz",
    "JSON": "json",
}


def test_every_header_column_is_a_column_of_agent_turns_with_its_postgresql_type() -> None:
    store_owned = {"status_changed_at", "event_position"}
    assert {column.name for column in HEADER} == {column.name for column in turns.columns} - store_owned
    for column in HEADER:
        compiled = turns.c[column.name].type.compile(dialect=postgresql.dialect())  # type: ignore[no-untyped-call]
        assert _PG_TYPES[compiled] == column.pg_type, column.name


def test_a_snapshot_comes_back_whole_from_the_row_the_columns_make() -> None:
    turn = AgentTurn(
        id="t-1",
        agent_id="a",
        root_turn_id="t-1",
        conversation_id="c-1",
        cancel_requested=True,
        cancel_reason="enough",
        lease_fence=7,
        steps=3,
        messages=[UserMessage(id="m-1", content="hello")],
    )
    row = new_row(turn)
    assert row["message_count"] == 1 and row["status_changed_at"] == turn.updated_at
    # Saves never write the cancel reason (a cancel request does): the row gets it from there
    assert "cancel_reason" not in row
    stored = {**row, "cancel_reason": turn.cancel_reason, "state": json.loads(json.dumps(row["state"]))}
    assert snapshot_of(stored, turn.messages) == turn
    assert not set(row["state"]) & set(FIELDS)

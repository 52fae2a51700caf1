"""Between snapshots and rows: the header columns of a turn (from `store.turns.columns`), its message rows, and back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent_runner.messages import ModelMessage
from agent_runner.persistence import TurnRef
from agent_runner.snapshot import AgentTurn, AgentTurnStatus
from store._engine import AnyRow
from store.turns.columns import FIELDS, LOADED, WRITTEN


def header(turn: AgentTurn) -> dict[str, Any]:
    """The values a save writes into the header row of `turn` (all but its id), by column name."""
    return {column.name: column.value(turn) for column in WRITTEN if column.name != "id"}


def new_row(turn: AgentTurn) -> dict[str, Any]:
    """The column values of a new turn's header row."""
    return {"id": turn.id, **header(turn), "status_changed_at": turn.updated_at}


def message_rows(turn_id: str, messages: Sequence[ModelMessage], start: int) -> list[dict[str, Any]]:
    """The rows of a turn's messages from `start` on."""
    return [
        {
            "turn_id": turn_id,
            "seq": seq,
            "message_id": message.id,
            "role": message.role,
            "payload": message.model_dump(mode="json"),
        }
        for seq, message in enumerate(messages[start:], start)
    ]


def snapshot(row: AnyRow, messages: list[ModelMessage]) -> AgentTurn:
    """Build a snapshot from its header row and its messages, already validated (see `snapshot_of`)."""
    return snapshot_of(row._mapping, messages)  # type: ignore[arg-type]  # a RowMapping is a Mapping


def snapshot_of(values: Mapping[str, Any], messages: list[ModelMessage]) -> AgentTurn:
    """Build a snapshot from its header columns by name and its messages, already validated.

    Only the header goes through validation here: validating a message costs far more than
    the header, and the messages are either just validated or taken from an earlier snapshot.
    """
    data = dict(values["state"])
    for name in FIELDS:
        data[name] = values[name]
    for name, loaded in LOADED.items():
        data[name] = loaded(data[name])
    data["messages"] = []
    return AgentTurn.model_validate(data).model_copy(update={"messages": messages})


def ref(row: AnyRow) -> TurnRef:
    """The `TurnRef` of a row of `store.turns.queries.REF_COLUMNS`."""
    return TurnRef(
        row.id, row.version, AgentTurnStatus(row.status), row.updated_at, row.next_retry_at, row.cancel_requested
    )

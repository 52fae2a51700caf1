"""Deterministic ids of what a step creates, so a re-run step reuses them instead of duplicating."""

from __future__ import annotations

import uuid

from agent_runner.snapshot import AgentTurn

_CHILD_NAMESPACE = uuid.UUID("5b0c7f4e-8a52-4c8e-9d0b-6f1f3c0a9e21")


def next_message_id(turn: AgentTurn, offset: int = 0) -> str:
    """Deterministic id of the next message the runner appends: re-running a step reuses it."""
    return f"{turn.id}-{len(turn.messages) + offset}"


def child_turn_id(parent_turn_id: str, tool_call_id: str) -> str:
    """Deterministic id of the child turn of a delegation call, so a re-run step never creates two."""
    return uuid.uuid5(_CHILD_NAMESPACE, f"{parent_turn_id}/{tool_call_id}").hex


def page_message_id(turn_id: str, tool_call_id: str) -> str:
    """Stable id of the page message standing for a call, so re-projection never duplicates it."""
    return f"{turn_id}-action-{tool_call_id}"

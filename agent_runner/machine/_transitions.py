"""Turn statuses and the moves between them: every status change goes through `transition`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agent_runner.errors import InvalidTransitionError
from agent_runner.snapshot import AgentTurn, AgentTurnStatus
from agent_runner.suspensions import SuspensionType

_TERMINAL = frozenset(s for s in AgentTurnStatus if s.is_terminal)
_ACTIVE_TARGETS = frozenset(
    {
        AgentTurnStatus.RUNNING,
        AgentTurnStatus.WAITING_FOR_USER,
        AgentTurnStatus.WAITING_FOR_APPROVAL,
        AgentTurnStatus.WAITING_FOR_CHILD,
        AgentTurnStatus.RETRY_SCHEDULED,
    }
)

TRANSITIONS: dict[AgentTurnStatus, frozenset[AgentTurnStatus]] = {
    AgentTurnStatus.READY: frozenset({AgentTurnStatus.RUNNING, AgentTurnStatus.WAITING_FOR_USER} | _TERMINAL),
    AgentTurnStatus.RUNNING: _ACTIVE_TARGETS | _TERMINAL,
    AgentTurnStatus.WAITING_FOR_USER: frozenset({AgentTurnStatus.RUNNING, AgentTurnStatus.CANCELLED}),
    AgentTurnStatus.WAITING_FOR_APPROVAL: frozenset({AgentTurnStatus.RUNNING, AgentTurnStatus.CANCELLED}),
    AgentTurnStatus.WAITING_FOR_CHILD: frozenset(
        {AgentTurnStatus.WAITING_FOR_CHILD, AgentTurnStatus.RUNNING, AgentTurnStatus.CANCELLED}
    ),
    AgentTurnStatus.RETRY_SCHEDULED: frozenset({AgentTurnStatus.RUNNING, AgentTurnStatus.CANCELLED}),
    **{status: frozenset() for status in _TERMINAL},
}
"""Every status change the machine may make; terminal statuses are final."""

SUSPENSION_STATUS: dict[SuspensionType, AgentTurnStatus] = {
    SuspensionType.USER_INPUT: AgentTurnStatus.WAITING_FOR_USER,
    SuspensionType.TOOL_APPROVAL: AgentTurnStatus.WAITING_FOR_APPROVAL,
    SuspensionType.TOOL_OUTCOME_UNKNOWN: AgentTurnStatus.WAITING_FOR_APPROVAL,
    SuspensionType.CHILD_AGENT: AgentTurnStatus.WAITING_FOR_CHILD,
    SuspensionType.RETRY: AgentTurnStatus.RETRY_SCHEDULED,
}
"""The status of a turn waiting with each suspension type: a person settles an unknown outcome as an approval."""


def transition(turn: AgentTurn, target: AgentTurnStatus, now: datetime, **changes: Any) -> AgentTurn:
    """Return `turn` moved to `target` with `changes`, if the move is allowed."""
    if target is not turn.status:
        InvalidTransitionError.check(turn.status, target, TRANSITIONS[turn.status])
    elif target not in (AgentTurnStatus.RUNNING, AgentTurnStatus.WAITING_FOR_CHILD):
        InvalidTransitionError.check(turn.status, target, TRANSITIONS[turn.status])
    return turn.model_copy(update={"status": target, "updated_at": now, **changes})


def touch(turn: AgentTurn, now: datetime, **changes: Any) -> AgentTurn:
    """Return `turn` with `changes` and no status change."""
    return turn.model_copy(update={"updated_at": now, **changes})

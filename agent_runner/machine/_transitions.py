"""Turn statuses and the moves between them: every status change goes through `transition`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agent_runner.errors import InvalidTransitionError
from agent_runner.snapshot import AgentTurn, AgentTurnStatus
from agent_runner.suspensions import SuspensionType

S = AgentTurnStatus
_TERMINAL = frozenset(s for s in S if s.is_terminal)
_ACTIVE_TARGETS = frozenset(
    {S.RUNNING, S.WAITING_FOR_USER, S.WAITING_FOR_APPROVAL, S.WAITING_FOR_CHILD, S.RETRY_SCHEDULED}
)

TRANSITIONS: dict[AgentTurnStatus, frozenset[AgentTurnStatus]] = {
    S.READY: frozenset({S.RUNNING, S.WAITING_FOR_USER} | _TERMINAL),
    S.RUNNING: _ACTIVE_TARGETS | _TERMINAL,
    S.WAITING_FOR_USER: frozenset({S.RUNNING, S.CANCELLED}),
    S.WAITING_FOR_APPROVAL: frozenset({S.RUNNING, S.CANCELLED}),
    S.WAITING_FOR_CHILD: frozenset({S.WAITING_FOR_CHILD, S.RUNNING, S.CANCELLED}),
    S.RETRY_SCHEDULED: frozenset({S.RUNNING, S.CANCELLED}),
    **{status: frozenset() for status in _TERMINAL},
}
"""Every status change the machine may make; terminal statuses are final."""

SUSPENSION_STATUS: dict[SuspensionType, AgentTurnStatus] = {
    SuspensionType.USER_INPUT: S.WAITING_FOR_USER,
    SuspensionType.TOOL_APPROVAL: S.WAITING_FOR_APPROVAL,
    SuspensionType.TOOL_OUTCOME_UNKNOWN: S.WAITING_FOR_APPROVAL,
    SuspensionType.CHILD_AGENT: S.WAITING_FOR_CHILD,
    SuspensionType.RETRY: S.RETRY_SCHEDULED,
}
"""The status of a turn waiting with each suspension type: a person settles an unknown outcome as an approval."""


def transition(turn: AgentTurn, target: AgentTurnStatus, now: datetime, **changes: Any) -> AgentTurn:
    """Return `turn` moved to `target` with `changes`, if the move is allowed."""
    if target is not turn.status:
        InvalidTransitionError.check(turn.status, target, TRANSITIONS[turn.status])
    elif target not in (S.RUNNING, S.WAITING_FOR_CHILD):
        InvalidTransitionError.check(turn.status, target, TRANSITIONS[turn.status])
    return turn.model_copy(update={"status": target, "updated_at": now, **changes})


def touch(turn: AgentTurn, now: datetime, **changes: Any) -> AgentTurn:
    """Return `turn` with `changes` and no status change."""
    return turn.model_copy(update={"updated_at": now, **changes})

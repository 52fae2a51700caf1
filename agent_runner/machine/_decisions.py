"""Who decided a page action, when and why: the decision record of approvals, forms and close-outs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agent_runner.messages import ActionStatus
from agent_runner.snapshot import AgentTurn, PageAction
from agent_runner.suspensions import DEADLINE_REASON, AgentResumeCommand, ResumeType

SYSTEM_DECIDER = "system"
"""`decided_by` of page actions the runner itself settled (a close-out)."""

DECIDER_METADATA_KEYS = ("decided_by", "approverId", "approver_id", "user_id", "userId")
"""Resume-command metadata keys that name who decided, in order of preference."""


def decision(decided_by: str | None, now: datetime, reason: str | None = None) -> dict[str, Any]:
    """The `PageAction.decision` record of a decision."""
    record: dict[str, Any] = {"decided_at": now.isoformat()}
    if decided_by:
        record["decided_by"] = decided_by
    if reason:
        record["reason"] = reason
    return record


def decider(command: AgentResumeCommand) -> str | None:
    """Who decided, from a resume command's metadata."""
    for key in DECIDER_METADATA_KEYS:
        value = command.metadata.get(key)
        if value is not None and value != "":
            return str(value)
    return None


def noted_reason(command: AgentResumeCommand) -> str | None:
    """Why a person approved or settled a call: `command.reason`, else its `reason` metadata.

    Only a rejection carries `reason` as a field (the model reads it); an approval's reason
    is kept with the decision alone, and front ends send it as metadata.
    """
    if command.reason:
        return command.reason
    value = command.metadata.get("reason")
    return None if value is None or value == "" else str(value)


def decide_action(
    turn: AgentTurn,
    call_id: str,
    status: ActionStatus,
    command: AgentResumeCommand,
    now: datetime,
    reason: str | None = None,
) -> list[PageAction]:
    """The turn's page actions with the one of `call_id` decided by `command` (a deadline: by the system)."""
    if command.type is ResumeType.DEADLINE:
        reason = DEADLINE_REASON
    record = decision(
        decider(command) or (SYSTEM_DECIDER if command.type is ResumeType.DEADLINE else None), now, reason
    )
    return [
        a.model_copy(update={"status": status, "synced": False, "decision": record}) if a.action_id == call_id else a
        for a in turn.page_actions
    ]

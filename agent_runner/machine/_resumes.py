"""Resume commands: each command type checked against the turn's suspension and applied by its own function."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent_runner.errors import InvalidResumeCommand
from agent_runner.forms import validate_form_data
from agent_runner.limits import MAX_JSON_DEPTH
from agent_runner.machine._decisions import decide_action, noted_reason
from agent_runner.machine._ids import next_message_id
from agent_runner.machine._plans import FORM_SOURCE_TOOL, TAKES_DECLINE_KEY
from agent_runner.machine._results import apply_tool_result
from agent_runner.machine._transitions import TRANSITIONS, transition
from agent_runner.messages import ActionStatus, ToolCall, UserMessage
from agent_runner.snapshot import AgentTurn, AgentTurnStatus, PageAction
from agent_runner.suspensions import (
    AgentResumeCommand,
    AgentSuspension,
    Phase,
    ResumeType,
    SuspensionType,
    TimeoutAction,
)


@dataclass(frozen=True)
class _Resume:
    """A resume command to apply, with the turn and its suspension (checked to fit) and what the command needs."""

    turn: AgentTurn
    suspension: AgentSuspension
    command: AgentResumeCommand
    now: datetime
    child: AgentTurn | None
    """The ended child turn a CHILD_COMPLETED command names."""
    edit_schema: dict[str, Any] | None
    """The JSON Schema of the arguments of the tool an EDIT_TOOL command edits."""


def apply_resume(
    turn: AgentTurn,
    command: AgentResumeCommand,
    now: datetime,
    child: AgentTurn | None = None,
    *,
    edit_schema: dict[str, Any] | None = None,
) -> AgentTurn:
    """Validate `command` against the turn's suspension and apply it.

    Returns the new snapshot: RUNNING, or still WAITING_FOR_CHILD while other children run.
    `edit_schema` is the JSON Schema of the arguments of the tool an EDIT_TOOL command edits.

    Raises:
        InvalidResumeCommand: The command does not fit; nothing is changed.
    """
    if turn.status.is_terminal:
        raise InvalidResumeCommand(f"turn {turn.id!r} has ended ({turn.status}); it cannot be resumed", turn_id=turn.id)
    suspension = turn.suspension
    if suspension is None or turn.status not in TRANSITIONS or not turn.status.is_waiting:
        raise InvalidResumeCommand(
            f"turn {turn.id!r} is {turn.status}, not waiting for a resume command", turn_id=turn.id
        )
    if suspension.type not in FITS[command.type]:
        raise InvalidResumeCommand(_misfit(turn, suspension, command), turn_id=turn.id)
    return _APPLY[command.type](_Resume(turn, suspension, command, now, child, edit_schema))


_TOOL_DECISIONS = frozenset(t for t in SuspensionType if t.is_tool_decision)

FITS: dict[ResumeType, frozenset[SuspensionType]] = {
    ResumeType.USER_INPUT: frozenset({SuspensionType.USER_INPUT}),
    ResumeType.APPROVE_TOOL: _TOOL_DECISIONS,
    # A form on a tool call is declined by rejecting the call (checked in `_reject`).
    ResumeType.REJECT_TOOL: _TOOL_DECISIONS | {SuspensionType.USER_INPUT},
    ResumeType.TOOL_RESULT: frozenset({SuspensionType.TOOL_OUTCOME_UNKNOWN}),
    ResumeType.EDIT_TOOL: frozenset({SuspensionType.TOOL_APPROVAL}),
    ResumeType.CHILD_COMPLETED: frozenset({SuspensionType.CHILD_AGENT}),
    ResumeType.RETRY: frozenset({SuspensionType.RETRY}),
    # Whether the suspension has a deadline, and a default for it, is checked when it is applied.
    ResumeType.DEADLINE: frozenset(SuspensionType),
}
"""The suspension types each resume command type applies to."""


def _misfit(turn: AgentTurn, suspension: AgentSuspension, command: AgentResumeCommand) -> str:
    call_id = suspension.correlation_id
    if command.type is ResumeType.TOOL_RESULT and suspension.type is SuspensionType.TOOL_APPROVAL:
        return (
            f"tool call {call_id!r} of turn {turn.id!r} waits for approval; tool_result settles only "
            "a call whose outcome is unknown"
        )
    if command.type is ResumeType.EDIT_TOOL and suspension.is_outcome_unknown:
        return (
            f"tool call {call_id!r} of turn {turn.id!r} started and its outcome is unknown; "
            "it can be retried, settled or failed, not edited"
        )
    return f"turn {turn.id!r} waits for {suspension.type}, so a {command.type} command does not apply"


def _check_call_id(turn: AgentTurn, suspension: AgentSuspension, command: AgentResumeCommand) -> ToolCall:
    call_id = command.tool_call_id
    if call_id != suspension.correlation_id:
        raise InvalidResumeCommand(
            f"turn {turn.id!r} waits on tool call {suspension.correlation_id!r}, not {call_id!r}", turn_id=turn.id
        )
    call = next((c for c in turn.pending_tool_calls if c.id == call_id), None)
    if call is None:
        raise InvalidResumeCommand(f"tool call {call_id!r} of turn {turn.id!r} is no longer pending", turn_id=turn.id)
    return call


def _user_input(r: _Resume) -> AgentTurn:
    """Answer a plain-text question with a user message, or submit the data of a form."""
    turn, suspension, command = r.turn, r.suspension, r.command
    if suspension.correlation_id is None:
        if command.data is not None or command.content is None:
            raise InvalidResumeCommand(
                f"turn {turn.id!r} asked a plain-text question; answer it with user_input(text)", turn_id=turn.id
            )
        message = UserMessage(id=next_message_id(turn), content=command.content)
        return transition(
            turn, AgentTurnStatus.RUNNING, r.now, suspension=None, phase=Phase.MODEL, messages=[*turn.messages, message]
        )
    if command.data is None:
        raise InvalidResumeCommand(
            f"turn {turn.id!r} waits for form data for call {suspension.correlation_id!r}; "
            "send user_input(call_id, data)",
            turn_id=turn.id,
        )
    call = _check_call_id(turn, suspension, command)
    return _submit_form(r, call, command.data)


def _submit_form(r: _Resume, call: ToolCall, data: dict[str, Any]) -> AgentTurn:
    turn, suspension, now = r.turn, r.suspension, r.now
    form = suspension.form
    schema = form.schema if form is not None else {"type": "object"}
    # The runner checked the depth against the policy's limit; this bound only protects the validator.
    errors = validate_form_data(schema, data, max_depth=MAX_JSON_DEPTH)
    if errors:
        raise InvalidResumeCommand(
            f"form data for call {call.id!r} does not match the form's schema: " + "; ".join(errors),
            turn_id=turn.id,
            errors=errors,
        )
    actions = decide_action(turn, call.id, ActionStatus.SUBMITTED, r.command, now)
    if suspension.metadata.get("form_source") == FORM_SOURCE_TOOL:
        # The tool runs again from its start and reads the data from its context.
        return _run_call(turn, now, actions, form_data={**turn.form_data, call.id: dict(data)})
    content = json.dumps(data, ensure_ascii=False, sort_keys=False)
    return _answer_call(turn, call, content, False, now, actions)


def _approve(r: _Resume) -> AgentTurn:
    """Run the waiting call; for an unknown outcome, run it again."""
    return _decide_approval(r.turn, _check_call_id(r.turn, r.suspension, r.command), True, r)


def _reject(r: _Resume) -> AgentTurn:
    """Answer the waiting call with an error: rejected, failed when its outcome was unknown, or its form declined."""
    if r.suspension.type is SuspensionType.USER_INPUT:
        return _decline_form(r)
    return _decide_approval(r.turn, _check_call_id(r.turn, r.suspension, r.command), False, r)


def _decline_form(r: _Resume) -> AgentTurn:
    """The person declines the form of the waiting call: its tool hears of it, or the model does."""
    turn, suspension, command, now = r.turn, r.suspension, r.command, r.now
    if suspension.correlation_id is None or suspension.form is None:
        raise InvalidResumeCommand(
            f"turn {turn.id!r} asked a plain-text question; there is no form to decline", turn_id=turn.id
        )
    call = _check_call_id(turn, suspension, command)
    reason = command.reason or "declined by the user"
    actions = decide_action(turn, call.id, ActionStatus.REJECTED, command, now, reason)
    if suspension.metadata.get(TAKES_DECLINE_KEY):
        # The tool runs again and reads the decline from its context (`form_declined`).
        form_data = {k: v for k, v in turn.form_data.items() if k != call.id}
        return _run_call(turn, now, actions, form_data=form_data)
    content = f"The user declined the form {suspension.form.key!r}: {reason}"
    return _answer_call(turn, call, content, True, now, actions)


def _tool_result(r: _Resume) -> AgentTurn:
    """Settle a call whose outcome is unknown as done, with the result a person found out."""
    turn, command, now = r.turn, r.command, r.now
    call = _check_call_id(turn, r.suspension, command)
    started = [c for c in turn.started_call_ids if c != call.id]
    actions = decide_action(turn, call.id, ActionStatus.SUBMITTED, command, now, noted_reason(command))
    return _answer_call(turn, call, command.content or "", False, now, actions, started_call_ids=started)


def _run_call(turn: AgentTurn, now: datetime, actions: list[PageAction], **changes: Any) -> AgentTurn:
    """Resume `turn` in the tools phase, where the waiting call runs (again, from its start)."""
    return transition(
        turn, AgentTurnStatus.RUNNING, now, suspension=None, phase=Phase.TOOLS, page_actions=actions, **changes
    )


def _answer_call(
    turn: AgentTurn,
    call: ToolCall,
    content: str,
    is_error: bool,
    now: datetime,
    actions: list[PageAction],
    **changes: Any,
) -> AgentTurn:
    """Resume `turn` with `content` as the result of the waiting `call`."""
    resumed = transition(turn, AgentTurnStatus.RUNNING, now, suspension=None, page_actions=actions, **changes)
    resumed, _ = apply_tool_result(resumed, call, content, is_error, now)
    # Writing the answer is part of the resume, not a step of the turn.
    return resumed.model_copy(update={"steps": turn.steps})


def _edit(r: _Resume) -> AgentTurn:
    """Replace the waiting call's arguments by the edited ones and approve it; the model is not asked again."""
    turn, schema = r.turn, r.edit_schema
    call = _check_call_id(turn, r.suspension, r.command)
    if schema is None:
        raise InvalidResumeCommand(
            f"the arguments of tool call {call.id!r} ({call.name!r}) cannot be edited: the agent has no such tool",
            turn_id=turn.id,
        )
    arguments = dict(r.command.data or {})
    errors = validate_form_data(schema, arguments, max_depth=MAX_JSON_DEPTH)
    if errors:
        raise InvalidResumeCommand(
            f"edited arguments for call {call.id!r} do not match the schema of tool {call.name!r}: "
            + "; ".join(errors),
            turn_id=turn.id,
            errors=errors,
        )
    # Then it is an approval of the edited call: the decision (who, when, why) goes on the
    # call's card like any approval's, and the TURN_RESUMED event records that it was an edit.
    edited = call.model_copy(update={"arguments": arguments})
    with_edit = turn.model_copy(
        update={"pending_tool_calls": [edited if c.id == call.id else c for c in turn.pending_tool_calls]}
    )
    return _decide_approval(with_edit, edited, True, r)


def _decide_approval(turn: AgentTurn, call: ToolCall, approved: bool, r: _Resume) -> AgentTurn:
    """Approve (run the saved call) or reject (tell the model) a call waiting for a decision."""
    command, now = r.command, r.now
    started = [c for c in turn.started_call_ids if c != call.id]
    if approved:
        # For an unknown outcome, approving means "run it again": a person took the risk.
        actions = decide_action(turn, call.id, ActionStatus.APPROVED, command, now, noted_reason(command))
        return _run_call(
            turn, now, actions, approved_call_ids=[*turn.approved_call_ids, call.id], started_call_ids=started
        )
    reason = command.reason or "rejected by the user"
    actions = decide_action(turn, call.id, ActionStatus.REJECTED, command, now, reason)
    if command.type is ResumeType.DEADLINE:
        content = "Nobody approved this tool call before its deadline, so it was not run."
    elif r.suspension.is_outcome_unknown:
        content = f"This tool call failed (its outcome was unknown and a person marked it failed): {reason}"
    else:
        content = f"The user rejected this tool call: {reason}"
    return _answer_call(turn, call, content, True, now, actions, started_call_ids=started)


def _deadline(r: _Resume) -> AgentTurn:
    """Apply the suspension's `on_timeout` default once its deadline has passed."""
    turn, suspension, now = r.turn, r.suspension, r.now
    if suspension.deadline is None or suspension.on_timeout is None:
        raise InvalidResumeCommand(f"turn {turn.id!r} waits without a deadline", turn_id=turn.id)
    if now < suspension.deadline:
        raise InvalidResumeCommand(
            f"the deadline of turn {turn.id!r} is {suspension.deadline.isoformat()}; it has not passed",
            turn_id=turn.id,
        )
    call = _check_call_id(turn, suspension, r.command)
    match suspension.on_timeout:
        case TimeoutAction.APPROVE | TimeoutAction.REJECT if suspension.type is SuspensionType.TOOL_APPROVAL:
            return _decide_approval(turn, call, suspension.on_timeout is TimeoutAction.APPROVE, r)
        case TimeoutAction.SUBMIT if suspension.form is not None and suspension.form.default_data is not None:
            return _submit_form(r, call, dict(suspension.form.default_data))
        case TimeoutAction.REJECT if suspension.form is not None:
            actions = decide_action(turn, call.id, ActionStatus.REJECTED, r.command, now)
            content = (
                f"Nobody filled in the form {suspension.form.key!r} before its deadline. "
                "Go on without it, or tell the user what is missing."
            )
            return _answer_call(turn, call, content, True, now, actions)
    raise InvalidResumeCommand(  # pragma: no cover - AgentSuspension validates the combination
        f"turn {turn.id!r}: on_timeout {suspension.on_timeout} does not apply to {suspension.type}", turn_id=turn.id
    )


def _child_completed(r: _Resume) -> AgentTurn:
    """Record the output of an ended child turn; go on when it was the last one running."""
    turn, child, now = r.turn, r.child, r.now
    child_id = r.command.child_turn_id
    link = next((c for c in turn.children if c.child_turn_id == child_id), None)
    if link is None:
        raise InvalidResumeCommand(f"turn {child_id!r} is not a child of turn {turn.id!r}", turn_id=turn.id)
    if link.status is not None:
        raise InvalidResumeCommand(
            f"child turn {child_id!r} of turn {turn.id!r} was already recorded as {link.status}", turn_id=turn.id
        )
    if child is None or child.id != child_id or not child.status.is_terminal:
        shown = "missing" if child is None else str(child.status)
        raise InvalidResumeCommand(f"child turn {child_id!r} has not ended (it is {shown})", turn_id=turn.id)
    output = child.final_output if child.status is AgentTurnStatus.COMPLETED else (child.error or str(child.status))
    children = [
        c.model_copy(update={"status": child.status, "output": output}) if c.child_turn_id == child_id else c
        for c in turn.children
    ]
    usage = turn.usage + child.usage
    still_running = [c.child_turn_id for c in children if c.status is None]
    if still_running:
        suspension = r.suspension.model_copy(
            update={
                "metadata": {"child_turn_ids": still_running},
                "message": f"waiting for {len(still_running)} child turn(s)",
            }
        )
        return transition(
            turn, AgentTurnStatus.WAITING_FOR_CHILD, now, children=children, usage=usage, suspension=suspension
        )
    return transition(
        turn, AgentTurnStatus.RUNNING, now, children=children, usage=usage, suspension=None, phase=Phase.TOOLS
    )


def _retry(r: _Resume) -> AgentTurn:
    """Retry a RETRY_SCHEDULED turn now, even before its retry is due."""
    return transition(r.turn, AgentTurnStatus.RUNNING, r.now, suspension=None, next_retry_at=None)


_APPLY: dict[ResumeType, Callable[[_Resume], AgentTurn]] = {
    ResumeType.USER_INPUT: _user_input,
    ResumeType.APPROVE_TOOL: _approve,
    ResumeType.REJECT_TOOL: _reject,
    ResumeType.TOOL_RESULT: _tool_result,
    ResumeType.EDIT_TOOL: _edit,
    ResumeType.CHILD_COMPLETED: _child_completed,
    ResumeType.RETRY: _retry,
    ResumeType.DEADLINE: _deadline,
}
"""The function that applies each resume command type (`FITS` says which suspensions it fits)."""

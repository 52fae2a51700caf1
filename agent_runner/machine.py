"""The pure turn state machine: snapshot in, new snapshot out, no I/O.

`plan_step` decides what the next step must do; the `apply_*` functions fold the outcome
of that work (a model response, a tool result, an error, a resume command) into a new
snapshot. The runner (`agent_runner.runner`) is the shell that performs the work, saves
the snapshots and emits events. Every status change goes through `transition`, which
checks it against `TRANSITIONS`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agent_runner._base import trusted
from agent_runner.agent import Agent
from agent_runner.errors import InputLimitError, InvalidResumeCommand, InvalidTransitionError, ToolArgumentsError
from agent_runner.forms import AgentFormDefinition, validate_form_data
from agent_runner.limits import (
    MAX_JSON_DEPTH,
    InputLimits,
    bounded_text,
    check_json,
    check_tool_arguments,
    preview,
    storable_text,
)
from agent_runner.messages import ActionStatus, AiMessage, ModelMessage, ToolCall, ToolMessage, UserMessage
from agent_runner.models import ChatResponse
from agent_runner.policy import AgentExecutionPolicy, RetryPolicy
from agent_runner.snapshot import AgentTurn, AgentTurnStatus, ChildLink, PageAction
from agent_runner.suspensions import (
    DEADLINE_REASON,
    AgentResumeCommand,
    AgentSuspension,
    Phase,
    ResumeType,
    SuspensionType,
    TimeoutAction,
)
from agent_runner.tools import INVALID_ARGUMENTS_KEY, AgentUserInputTool, Tool

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
    SuspensionType.CHILD_AGENT: S.WAITING_FOR_CHILD,
    SuspensionType.RETRY: S.RETRY_SCHEDULED,
}

FORM_SOURCE_USER_INPUT_TOOL = "request_user_input"
FORM_SOURCE_TOOL = "tool"
OUTCOME_UNKNOWN = "outcome_unknown"
"""`reason` in the metadata of a TOOL_APPROVAL suspension that asks a person to settle a call
whose outcome was not recorded."""
_CHILD_NAMESPACE = uuid.UUID("5b0c7f4e-8a52-4c8e-9d0b-6f1f3c0a9e21")


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


def next_message_id(turn: AgentTurn, offset: int = 0) -> str:
    """Deterministic id of the next message the runner appends: re-running a step reuses it."""
    return f"{turn.id}-{len(turn.messages) + offset}"


def child_turn_id(parent_turn_id: str, tool_call_id: str) -> str:
    """Deterministic id of the child turn of a delegation call, so a re-run step never creates two."""
    return uuid.uuid5(_CHILD_NAMESPACE, f"{parent_turn_id}/{tool_call_id}").hex


# --- Planning --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Terminate:
    """End the turn abnormally with `status`, closing out its history."""

    status: AgentTurnStatus
    reason: str


@dataclass(frozen=True)
class CallModel:
    """Call the chat model once."""


@dataclass(frozen=True)
class ExecuteTool:
    """Execute `call` with `tool`."""

    call: ToolCall
    tool: Tool


@dataclass(frozen=True)
class ReconcileTool:
    """A non-idempotent call started earlier and its outcome was not recorded: find it out, never re-run blindly."""

    call: ToolCall
    tool: Tool


@dataclass(frozen=True)
class WriteToolResult:
    """Answer `call` without executing anything (unknown tool, invalid arguments, a child's output)."""

    call: ToolCall
    content: str
    is_error: bool


@dataclass(frozen=True)
class Suspend:
    """Stop and wait for a person (until `timeout`, if set; then `on_timeout` applies)."""

    suspension: AgentSuspension
    page_action: PageAction | None
    timeout: timedelta | None = None
    on_timeout: TimeoutAction | None = None


@dataclass(frozen=True)
class SpawnChildren:
    """Create one child turn per delegation call and wait for them."""

    calls: tuple[tuple[ToolCall, Agent, str], ...]
    """(call, sub-agent, task) for each delegation call that has no child yet."""


StepPlan = Terminate | CallModel | ExecuteTool | ReconcileTool | WriteToolResult | Suspend | SpawnChildren


def plan_step(turn: AgentTurn, agent: Agent, policy: AgentExecutionPolicy) -> StepPlan:
    """Decide what the next step of a runnable turn does. Limits are checked first."""
    if turn.cancel_requested:
        return Terminate(S.CANCELLED, turn.cancel_reason or policy.cancellation_reason)
    if turn.steps >= policy.max_steps:
        return Terminate(S.MAX_STEPS_REACHED, f"the turn reached its limit of {policy.max_steps} steps")
    budget_reason = budget_exceeded(turn, agent)
    if budget_reason:
        return Terminate(S.BUDGET_EXCEEDED, budget_reason)
    if turn.phase is Phase.MODEL or not turn.pending_tool_calls:
        if turn.model_iterations >= agent.max_iterations:
            return Terminate(
                S.MAX_ITERATIONS_REACHED, f"the turn reached its limit of {agent.max_iterations} model calls"
            )
        return CallModel()
    return _plan_tool(turn, agent, turn.pending_tool_calls[0], policy.limits)


def budget_exceeded(turn: AgentTurn, agent: Agent) -> str | None:
    """Return why the turn is over its budget, or None."""
    budget = agent.budget
    if budget.max_total_tokens is not None and turn.usage.total_tokens > budget.max_total_tokens:
        return f"the turn used {turn.usage.total_tokens} tokens, over its budget of {budget.max_total_tokens}"
    if budget.max_cost is not None and turn.usage.cost > budget.max_cost:
        return f"the turn cost {turn.usage.cost:.6g}, over its budget of {budget.max_cost:.6g}"
    return None


def _plan_tool(turn: AgentTurn, agent: Agent, call: ToolCall, limits: InputLimits) -> StepPlan:
    try:
        # Before anything copies the arguments into a suspension or a page message.
        check_tool_arguments(limits, call.arguments)
    except InputLimitError as exc:
        return WriteToolResult(
            call,
            f"The arguments for tool {preview(call.name, 64)!r} were refused, so the tool was not run: found "
            f"{exc.found}, allowed {exc.limit}. Call it again with arguments within this limit.",
            True,
        )
    invalid = call.arguments.get(INVALID_ARGUMENTS_KEY)
    if isinstance(invalid, dict) and len(call.arguments) == 1:
        return WriteToolResult(
            call,
            f"The arguments for tool {call.name!r} could not be used ({invalid.get('error')}), so the tool "
            "was not run. Call it again with a JSON object that matches its parameters.",
            True,
        )
    sub_agent = agent.sub_agent(call.name)
    if sub_agent is not None:
        return _plan_delegation(turn, agent, call)
    tool = agent.tool(call.name)
    if tool is None:
        known = sorted([t.name for t in agent.tools] + [a.id for a in agent.sub_agents])
        return WriteToolResult(
            call, f"Unknown tool {preview(call.name, 64)!r}. Available tools: {', '.join(known) or 'none'}.", True
        )
    if isinstance(tool, AgentUserInputTool):
        return _plan_user_input(turn, tool, call)
    if call.id in turn.started_call_ids:
        return ReconcileTool(call, tool)
    if tool.requires_approval and call.id not in turn.approved_call_ids:
        try:
            tool.validate_arguments(call.arguments)
        except ToolArgumentsError as exc:
            # Nobody should be asked to approve a call that cannot run.
            return WriteToolResult(call, str(exc), True)
        masked = tool.masked_arguments(call.arguments)
        summary = f"{tool.name}({', '.join(f'{k}={preview(repr(v))}' for k, v in masked.items())})"
        suspension = AgentSuspension(
            type=SuspensionType.TOOL_APPROVAL,
            correlation_id=call.id,
            message=f"Approve the call {summary}?",
            resume_phase=Phase.TOOLS,
            metadata={"tool_name": tool.name, "arguments": masked},
        )
        payload: dict[str, Any] = {
            "role": "agent_action",
            "id": page_message_id(turn.id, call.id),
            "turn_id": turn.id,
            "action_id": call.id,
            "tool_name": tool.name,
            "summary": summary,
            "arguments": masked,
        }
        return Suspend(
            suspension,
            PageAction(message_id=payload["id"], action_id=call.id, kind="approval", payload=payload),
            timeout=tool.approval_timeout,
            on_timeout=TimeoutAction(tool.on_timeout) if tool.approval_timeout is not None else None,
        )
    return ExecuteTool(call, tool)


def _plan_user_input(turn: AgentTurn, tool: AgentUserInputTool, call: ToolCall) -> StepPlan:
    key = call.arguments.get("formKey")
    form = tool.form(key) if isinstance(key, str) else None
    if form is None or set(call.arguments) - {"formKey"}:
        known = ", ".join(f.key for f in tool.forms) or "none"
        return WriteToolResult(call, f"Unknown or missing formKey {key!r}. Known form keys: {known}.", True)
    return form_suspension(turn, call, form, FORM_SOURCE_USER_INPUT_TOOL, form.description)


def form_suspension(turn: AgentTurn, call: ToolCall, form: AgentFormDefinition, source: str, message: str) -> Suspend:
    """Suspend for a form, freezing its full definition (schema included) into the snapshot."""
    suspension = AgentSuspension(
        type=SuspensionType.USER_INPUT,
        correlation_id=call.id,
        message=message or f"Please fill in the form {form.key!r}.",
        resume_phase=Phase.TOOLS,
        metadata={"form_source": source, "tool_name": call.name, "form_key": form.key},
        form=form,
    )
    payload: dict[str, Any] = {
        "role": "agent_form",
        "id": page_message_id(turn.id, call.id),
        "turn_id": turn.id,
        "action_id": call.id,
        "form_key": form.key,
        "description": form.description,
        "schema": form.schema,
    }
    timeout = form.timeout if isinstance(form.timeout, timedelta) else None
    return Suspend(
        suspension,
        PageAction(message_id=payload["id"], action_id=call.id, kind="form", payload=payload),
        timeout=timeout,
        on_timeout=TimeoutAction(form.on_timeout) if timeout is not None else None,
    )


def page_message_id(turn_id: str, tool_call_id: str) -> str:
    """Stable id of the page message standing for a call, so re-projection never duplicates it."""
    return f"{turn_id}-action-{tool_call_id}"


def _plan_delegation(turn: AgentTurn, agent: Agent, call: ToolCall) -> StepPlan:
    link = turn.child(call.id)
    if link is not None and link.status is not None:
        completed = link.status is S.COMPLETED
        content = link.output or ""
        if not completed:
            content = f"The {link.agent_id} agent did not complete ({link.status}): {content}"
        return WriteToolResult(call, content, not completed)
    spawn: list[tuple[ToolCall, Agent, str]] = []
    for pending in turn.pending_tool_calls:
        sub = agent.sub_agent(pending.name)
        if sub is None or turn.child(pending.id) is not None:
            continue
        task = pending.arguments.get("task")
        if not isinstance(task, str) or not task.strip() or set(pending.arguments) - {"task"}:
            if pending.id == call.id:
                return WriteToolResult(call, 'Invalid arguments: expected {"task": "<non-empty string>"}.', True)
            continue
        spawn.append((pending, sub, task))
    return SpawnChildren(tuple(spawn))


# --- Applying outcomes -----------------------------------------------------------------------


def start_running(turn: AgentTurn, now: datetime) -> AgentTurn:
    """Move a READY or due RETRY_SCHEDULED turn to RUNNING (in memory; saved with the step).

    A step that gets as far as saving has not failed: the count of failed steps restarts.
    """
    if turn.status is S.RUNNING:
        return turn if turn.step_failures == 0 else turn.model_copy(update={"step_failures": 0})
    return transition(turn, S.RUNNING, now, suspension=None, next_retry_at=None, step_failures=0)


def apply_model_response(
    turn: AgentTurn, response: ChatResponse, now: datetime, limits: InputLimits | None = None
) -> tuple[AgentTurn, AiMessage]:
    """Record a model response: tool calls become pending (TOOLS), a final answer completes the turn.

    The message is made storable first, and bounded by `limits` when they are given (see
    `storable_message`), whatever model produced it.
    """
    message = storable_message(response.message, limits).model_copy(update={"id": next_message_id(turn)})
    changes: dict[str, Any] = {
        "messages": [*turn.messages, message],
        "usage": turn.usage + response.usage,
        "model_iterations": turn.model_iterations + 1,
        "steps": turn.steps + 1,
        "attempt": 0,
    }
    if message.tool_calls:
        return touch(turn, now, phase=Phase.TOOLS, pending_tool_calls=list(message.tool_calls), **changes), message
    return transition(turn, S.COMPLETED, now, final_output=message.content or "", **changes), message


def storable_message(message: AiMessage, limits: InputLimits | None = None) -> AiMessage:
    """Return the model's message in a form every store can save.

    NUL characters and lone surrogates in the text, ids and names are replaced by U+FFFD.
    Tool-call arguments that hold such text, or nest deeper than `MAX_JSON_DEPTH`, are
    replaced by the invalid-arguments marker, so the call is answered with an error
    ToolMessage the model can act on, instead of failing the save. With `limits`, arguments
    over `max_tool_arguments_bytes` or `max_json_depth` get the marker too (keeping only the
    start of the text), and text over `max_message_bytes` is cut with a note; without them,
    the policy's limits still apply before a call runs (`plan_step`), but the message is
    kept whole.
    """
    calls = [_storable_call(call, limits) for call in message.tool_calls]
    content = None if message.content is None else storable_text(message.content)
    if content is not None and limits is not None:
        content = bounded_text(content, limits.max_message_bytes)
    if content == message.content and all(new is old for new, old in zip(calls, message.tool_calls, strict=True)):
        return message
    return message.model_copy(update={"content": content, "tool_calls": calls})


def _storable_call(call: ToolCall, limits: InputLimits | None) -> ToolCall:
    changes: dict[str, Any] = {}
    if storable_text(call.id) != call.id:
        changes["id"] = storable_text(call.id)
    if storable_text(call.name) != call.name:
        changes["name"] = storable_text(call.name)
    try:
        if limits is None:
            check_json(call.arguments, "arguments", max_bytes=None, max_depth=MAX_JSON_DEPTH)
        else:
            check_tool_arguments(limits, call.arguments, "arguments")
    except InputLimitError as exc:
        changes["arguments"] = {INVALID_ARGUMENTS_KEY: {"raw": _raw_preview(call.arguments), "error": str(exc)}}
    return call.model_copy(update=changes) if changes else call


def _raw_preview(arguments: dict[str, Any]) -> str:
    try:
        return preview(json.dumps(arguments, ensure_ascii=False, default=repr))
    except (RecursionError, ValueError):
        return ""


def apply_tool_result(
    turn: AgentTurn, call: ToolCall, content: str, is_error: bool, now: datetime
) -> tuple[AgentTurn, ToolMessage]:
    """Write the ToolMessage of `call`, drop it from the pending calls, and go back to MODEL when none are left."""
    # Every field is text or a flag the runner made, or comes from the validated call: the
    # message needs no validation (a str subclass is stored as plain text, as validation would).
    message = trusted(
        ToolMessage,
        _TOOL_MESSAGE_FIELDS,
        {
            "id": next_message_id(turn),
            "role": "tool",
            "tool_call_id": call.id,
            "tool_name": call.name,
            "content": content if type(content) is str else str.__str__(content),
            "is_error": bool(is_error),
        },
    )
    pending = _without_call(turn.pending_tool_calls, call.id)
    form_data = turn.form_data
    if call.id in form_data:
        form_data = {k: v for k, v in form_data.items() if k != call.id}
    updated = touch(
        turn,
        now,
        messages=[*turn.messages, message],
        pending_tool_calls=pending,
        phase=Phase.TOOLS if pending else Phase.MODEL,
        approved_call_ids=[c for c in turn.approved_call_ids if c != call.id],
        started_call_ids=[c for c in turn.started_call_ids if c != call.id],
        form_data=form_data,
        attempt=0,
        steps=turn.steps + 1,
    )
    return updated, message


_TOOL_MESSAGE_FIELDS = frozenset(ToolMessage.model_fields) - {"role"}


def _without_call(calls: list[ToolCall], call_id: str) -> list[ToolCall]:
    for index, item in enumerate(calls):
        if item.id == call_id:
            return [*calls[:index], *calls[index + 1 :]]
    return list(calls)


def apply_suspension(
    turn: AgentTurn, plan: Suspend, now: datetime, *, count_step: bool = True, reminder: float | None = None
) -> AgentTurn:
    """Suspend the turn; the status follows from the suspension type.

    With a `plan.timeout`, the suspension records its deadline (now + timeout), the default
    applied then, and, with `reminder` (a fraction of the timeout), when DEADLINE_APPROACHING is due.
    """
    actions = turn.page_actions
    if plan.page_action is not None:
        actions = [a for a in actions if a.message_id != plan.page_action.message_id] + [plan.page_action]
    suspension = plan.suspension
    if plan.timeout is not None and plan.on_timeout is not None:
        suspension = AgentSuspension.model_validate(
            {
                **dict(suspension),
                "created_at": now,
                "deadline": now + plan.timeout,
                "on_timeout": plan.on_timeout,
                "remind_at": None if reminder is None else now + plan.timeout * reminder,
            }
        )
    return transition(
        turn,
        SUSPENSION_STATUS[suspension.type],
        now,
        suspension=suspension,
        page_actions=actions,
        steps=turn.steps + (1 if count_step else 0),
    )


def apply_reminder(turn: AgentTurn, now: datetime) -> AgentTurn:
    """Record that the DEADLINE_APPROACHING reminder of the turn's suspension went out."""
    if turn.suspension is None:
        return turn
    return touch(turn, now, suspension=turn.suspension.model_copy(update={"reminded_at": now}))


def apply_children_spawned(turn: AgentTurn, links: list[ChildLink], now: datetime) -> AgentTurn:
    """Record new child turns and wait for them."""
    children = [*turn.children, *links]
    waiting = [c.child_turn_id for c in children if c.status is None]
    suspension = AgentSuspension(
        type=SuspensionType.CHILD_AGENT,
        correlation_id=None,
        message=f"waiting for {len(waiting)} child turn(s)",
        resume_phase=Phase.TOOLS,
        metadata={"child_turn_ids": waiting},
    )
    return transition(turn, S.WAITING_FOR_CHILD, now, children=children, suspension=suspension, steps=turn.steps + 1)


def schedule_retry(turn: AgentTurn, error: str, delay: float, retry: RetryPolicy, now: datetime) -> AgentTurn | None:
    """Schedule another attempt of the current call, or return None when attempts are used up."""
    attempt = turn.attempt + 1
    if attempt >= retry.max_attempts:
        return None
    due = now + timedelta(seconds=delay)
    suspension = AgentSuspension(
        type=SuspensionType.RETRY,
        message=f"attempt {attempt} of {retry.max_attempts} failed: {error}",
        resume_phase=turn.phase,
        metadata={"attempt": attempt, "error": error},
    )
    return transition(
        turn,
        S.RETRY_SCHEDULED,
        now,
        attempt=attempt,
        next_retry_at=due,
        suspension=suspension,
        error=None,
        steps=turn.steps + 1,
    )


def close_out(
    turn: AgentTurn,
    status: AgentTurnStatus,
    reason: str,
    policy: AgentExecutionPolicy,
    now: datetime,
    decided_by: str | None = None,
) -> AgentTurn:
    """End the turn abnormally and keep the model history protocol-valid.

    Every pending tool call gets a ToolMessage with the reason, then one assistant
    message says the turn did not finish, so the next turn of the conversation can
    build on this history. Pending page actions are settled as decided by `decided_by`
    (the person who cancelled), else by `SYSTEM_DECIDER`.
    """
    messages: list[ModelMessage] = list(turn.messages)
    for call in turn.pending_tool_calls:
        content = policy.render(
            policy.interrupted_tool_message_template,
            reason=reason,
            turn_id=turn.id,
            tool_call_id=call.id,
            tool_name=call.name,
        )
        messages.append(
            ToolMessage(
                id=f"{turn.id}-{len(messages)}",
                tool_call_id=call.id,
                tool_name=call.name,
                content=content,
                is_error=True,
            )
        )
    closing = policy.render(policy.interrupted_turn_message_template, reason=reason, turn_id=turn.id)
    messages.append(AiMessage(id=f"{turn.id}-{len(messages)}", content=closing))
    ended = decision(decided_by or SYSTEM_DECIDER, now, reason)
    actions = [
        a.model_copy(update={"status": ActionStatus.CANCELLED, "synced": False, "decision": ended})
        if a.status is ActionStatus.PENDING
        else a
        for a in turn.page_actions
    ]
    return transition(
        turn,
        status,
        now,
        messages=messages,
        pending_tool_calls=[],
        suspension=None,
        next_retry_at=None,
        error=reason,
        page_actions=actions,
    )


# --- Resume commands -------------------------------------------------------------------------


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
    if command.type is ResumeType.DEADLINE:
        return _resume_deadline(turn, suspension, command, now)
    expected = _EXPECTED_SUSPENSION[command.type]
    if suspension.type is not expected:
        raise InvalidResumeCommand(
            f"turn {turn.id!r} waits for {suspension.type}, so a {command.type} command does not apply",
            turn_id=turn.id,
        )
    match command.type:
        case ResumeType.USER_INPUT:
            return _resume_user_input(turn, suspension, command, now)
        case ResumeType.APPROVE_TOOL | ResumeType.REJECT_TOOL | ResumeType.TOOL_RESULT:
            return _resume_approval(turn, suspension, command, now)
        case ResumeType.EDIT_TOOL:
            return _resume_edit(turn, suspension, command, now, edit_schema)
        case ResumeType.CHILD_COMPLETED:
            return _resume_child(turn, command, child, now)
        case ResumeType.RETRY:
            return transition(turn, S.RUNNING, now, suspension=None, next_retry_at=None)
    raise InvalidResumeCommand(f"unknown command type {command.type}", turn_id=turn.id)  # pragma: no cover


_EXPECTED_SUSPENSION = {
    ResumeType.USER_INPUT: SuspensionType.USER_INPUT,
    ResumeType.APPROVE_TOOL: SuspensionType.TOOL_APPROVAL,
    ResumeType.REJECT_TOOL: SuspensionType.TOOL_APPROVAL,
    ResumeType.CHILD_COMPLETED: SuspensionType.CHILD_AGENT,
    ResumeType.RETRY: SuspensionType.RETRY,
    ResumeType.TOOL_RESULT: SuspensionType.TOOL_APPROVAL,
    ResumeType.EDIT_TOOL: SuspensionType.TOOL_APPROVAL,
}


def mark_started(turn: AgentTurn, call_id: str, now: datetime) -> AgentTurn:
    """Record that the body of a non-idempotent call is about to run (saved before it runs)."""
    return touch(turn, now, started_call_ids=[*turn.started_call_ids, call_id])


def unmark_started(turn: AgentTurn, call_id: str) -> AgentTurn:
    """Forget the start of a call whose body returned or raised: its outcome is known now."""
    if call_id not in turn.started_call_ids:
        return turn
    return turn.model_copy(update={"started_call_ids": [c for c in turn.started_call_ids if c != call_id]})


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


def _decide_action(
    turn: AgentTurn,
    call_id: str,
    status: ActionStatus,
    command: AgentResumeCommand,
    now: datetime,
    reason: str | None = None,
) -> list[PageAction]:
    if command.type is ResumeType.DEADLINE:
        reason = DEADLINE_REASON
    record = decision(
        decider(command) or (SYSTEM_DECIDER if command.type is ResumeType.DEADLINE else None), now, reason
    )
    return [
        a.model_copy(update={"status": status, "synced": False, "decision": record}) if a.action_id == call_id else a
        for a in turn.page_actions
    ]


def _resume_user_input(
    turn: AgentTurn, suspension: AgentSuspension, command: AgentResumeCommand, now: datetime
) -> AgentTurn:
    if suspension.correlation_id is None:
        if command.data is not None or command.content is None:
            raise InvalidResumeCommand(
                f"turn {turn.id!r} asked a plain-text question; answer it with user_input(text)", turn_id=turn.id
            )
        message = UserMessage(id=next_message_id(turn), content=command.content)
        return transition(turn, S.RUNNING, now, suspension=None, phase=Phase.MODEL, messages=[*turn.messages, message])
    if command.data is None:
        raise InvalidResumeCommand(
            f"turn {turn.id!r} waits for form data for call {suspension.correlation_id!r}; "
            "send user_input(call_id, data)",
            turn_id=turn.id,
        )
    call = _check_call_id(turn, suspension, command)
    return _submit_form(turn, suspension, call, command.data, command, now)


def _submit_form(
    turn: AgentTurn,
    suspension: AgentSuspension,
    call: ToolCall,
    data: dict[str, Any],
    command: AgentResumeCommand,
    now: datetime,
) -> AgentTurn:
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
    actions = _decide_action(turn, call.id, ActionStatus.SUBMITTED, command, now)
    if suspension.metadata.get("form_source") == FORM_SOURCE_TOOL:
        # The tool runs again from its start and reads the data from its context.
        return transition(
            turn,
            S.RUNNING,
            now,
            suspension=None,
            phase=Phase.TOOLS,
            form_data={**turn.form_data, call.id: dict(data)},
            page_actions=actions,
        )
    resumed = transition(turn, S.RUNNING, now, suspension=None, page_actions=actions)
    content = json.dumps(data, ensure_ascii=False, sort_keys=False)
    resumed, _ = apply_tool_result(resumed, call, content, False, now)
    # Writing the answer is part of the resume, not a step of the turn.
    return resumed.model_copy(update={"steps": turn.steps})


def _resume_approval(
    turn: AgentTurn, suspension: AgentSuspension, command: AgentResumeCommand, now: datetime
) -> AgentTurn:
    call = _check_call_id(turn, suspension, command)
    unknown_outcome = suspension.metadata.get("reason") == OUTCOME_UNKNOWN
    if command.type is ResumeType.TOOL_RESULT and not unknown_outcome:
        raise InvalidResumeCommand(
            f"tool call {call.id!r} of turn {turn.id!r} waits for approval; tool_result settles only "
            "a call whose outcome is unknown",
            turn_id=turn.id,
        )
    if command.type is ResumeType.TOOL_RESULT:
        started = [c for c in turn.started_call_ids if c != call.id]
        actions = _decide_action(turn, call.id, ActionStatus.SUBMITTED, command, now, noted_reason(command))
        resumed = transition(turn, S.RUNNING, now, suspension=None, page_actions=actions, started_call_ids=started)
        resumed, _ = apply_tool_result(resumed, call, command.content or "", False, now)
        return resumed.model_copy(update={"steps": turn.steps})
    approved = command.type is ResumeType.APPROVE_TOOL
    return _decide_approval(turn, call, approved, command, now, unknown_outcome=unknown_outcome)


def _resume_edit(
    turn: AgentTurn,
    suspension: AgentSuspension,
    command: AgentResumeCommand,
    now: datetime,
    schema: dict[str, Any] | None,
) -> AgentTurn:
    """Replace the waiting call's arguments by the edited ones and approve it; the model is not asked again."""
    call = _check_call_id(turn, suspension, command)
    if suspension.metadata.get("reason") == OUTCOME_UNKNOWN:
        raise InvalidResumeCommand(
            f"tool call {call.id!r} of turn {turn.id!r} started and its outcome is unknown; "
            "it can be retried, settled or failed, not edited",
            turn_id=turn.id,
        )
    if schema is None:
        raise InvalidResumeCommand(
            f"the arguments of tool call {call.id!r} ({call.name!r}) cannot be edited: the agent has no such tool",
            turn_id=turn.id,
        )
    arguments = dict(command.data or {})
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
    return _decide_approval(with_edit, edited, True, command, now)


def _decide_approval(
    turn: AgentTurn,
    call: ToolCall,
    approved: bool,
    command: AgentResumeCommand,
    now: datetime,
    *,
    unknown_outcome: bool = False,
) -> AgentTurn:
    """Approve (run the saved call) or reject (tell the model) a call waiting for a decision."""
    started = [c for c in turn.started_call_ids if c != call.id]
    if approved:
        # For an unknown outcome, approving means "run it again": a person took the risk.
        return transition(
            turn,
            S.RUNNING,
            now,
            suspension=None,
            phase=Phase.TOOLS,
            approved_call_ids=[*turn.approved_call_ids, call.id],
            started_call_ids=started,
            page_actions=_decide_action(turn, call.id, ActionStatus.APPROVED, command, now, noted_reason(command)),
        )
    reason = command.reason or "rejected by the user"
    actions = _decide_action(turn, call.id, ActionStatus.REJECTED, command, now, reason)
    resumed = transition(turn, S.RUNNING, now, suspension=None, page_actions=actions, started_call_ids=started)
    if command.type is ResumeType.DEADLINE:
        content = "Nobody approved this tool call before its deadline, so it was not run."
    elif unknown_outcome:
        content = f"This tool call failed (its outcome was unknown and a person marked it failed): {reason}"
    else:
        content = f"The user rejected this tool call: {reason}"
    resumed, _ = apply_tool_result(resumed, call, content, True, now)
    return resumed.model_copy(update={"steps": turn.steps})


def _resume_deadline(
    turn: AgentTurn, suspension: AgentSuspension, command: AgentResumeCommand, now: datetime
) -> AgentTurn:
    """Apply the suspension's `on_timeout` default once its deadline has passed."""
    if suspension.deadline is None or suspension.on_timeout is None:
        raise InvalidResumeCommand(f"turn {turn.id!r} waits without a deadline", turn_id=turn.id)
    if now < suspension.deadline:
        raise InvalidResumeCommand(
            f"the deadline of turn {turn.id!r} is {suspension.deadline.isoformat()}; it has not passed",
            turn_id=turn.id,
        )
    call = _check_call_id(turn, suspension, command)
    match suspension.on_timeout:
        case TimeoutAction.APPROVE | TimeoutAction.REJECT if suspension.type is SuspensionType.TOOL_APPROVAL:
            return _decide_approval(turn, call, suspension.on_timeout is TimeoutAction.APPROVE, command, now)
        case TimeoutAction.SUBMIT if suspension.form is not None and suspension.form.default_data is not None:
            return _submit_form(turn, suspension, call, dict(suspension.form.default_data), command, now)
        case TimeoutAction.REJECT if suspension.form is not None:
            actions = _decide_action(turn, call.id, ActionStatus.REJECTED, command, now)
            resumed = transition(turn, S.RUNNING, now, suspension=None, page_actions=actions)
            content = (
                f"Nobody filled in the form {suspension.form.key!r} before its deadline. "
                "Go on without it, or tell the user what is missing."
            )
            resumed, _ = apply_tool_result(resumed, call, content, True, now)
            return resumed.model_copy(update={"steps": turn.steps})
    raise InvalidResumeCommand(  # pragma: no cover - AgentSuspension validates the combination
        f"turn {turn.id!r}: on_timeout {suspension.on_timeout} does not apply to {suspension.type}", turn_id=turn.id
    )


def _resume_child(turn: AgentTurn, command: AgentResumeCommand, child: AgentTurn | None, now: datetime) -> AgentTurn:
    child_id = command.child_turn_id
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
    output = child.final_output if child.status is S.COMPLETED else (child.error or str(child.status))
    children = [
        c.model_copy(update={"status": child.status, "output": output}) if c.child_turn_id == child_id else c
        for c in turn.children
    ]
    usage = turn.usage + child.usage
    still_running = [c.child_turn_id for c in children if c.status is None]
    if still_running:
        suspension = (turn.suspension or AgentSuspension(type=SuspensionType.CHILD_AGENT)).model_copy(
            update={
                "metadata": {"child_turn_ids": still_running},
                "message": f"waiting for {len(still_running)} child turn(s)",
            }
        )
        return transition(turn, S.WAITING_FOR_CHILD, now, children=children, usage=usage, suspension=suspension)
    return transition(turn, S.RUNNING, now, children=children, usage=usage, suspension=None, phase=Phase.TOOLS)

"""Outcomes folded into a new snapshot: a model response, a tool result, a suspension, a retry, an abnormal end."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from agent_runner._base import trusted
from agent_runner.errors import InputLimitError
from agent_runner.limits import (
    MAX_JSON_DEPTH,
    InputLimits,
    bounded_text,
    check_json,
    check_tool_arguments,
    preview,
    storable_text,
)
from agent_runner.machine._decisions import SYSTEM_DECIDER, decision
from agent_runner.machine._ids import next_message_id
from agent_runner.machine._plans import Suspend
from agent_runner.machine._transitions import SUSPENSION_STATUS, touch, transition
from agent_runner.messages import ActionStatus, AiMessage, ModelMessage, ToolCall, ToolMessage, UserMessage
from agent_runner.models import ChatResponse
from agent_runner.policy import AgentExecutionPolicy, RetryPolicy
from agent_runner.snapshot import AgentTurn, AgentTurnStatus, ChildLink
from agent_runner.suspensions import AgentSuspension, Phase, SuspensionType
from agent_runner.tools import INVALID_ARGUMENTS_KEY


def start_running(turn: AgentTurn, now: datetime) -> AgentTurn:
    """Move a READY or due RETRY_SCHEDULED turn to RUNNING (in memory; saved with the step).

    A step that gets as far as saving has not failed: the count of failed steps restarts.
    """
    if turn.status is AgentTurnStatus.RUNNING:
        return turn if turn.step_failures == 0 else turn.model_copy(update={"step_failures": 0})
    return transition(turn, AgentTurnStatus.RUNNING, now, suspension=None, next_retry_at=None, step_failures=0)


def apply_model_response(
    turn: AgentTurn,
    response: ChatResponse,
    now: datetime,
    limits: InputLimits | None = None,
    steering: Sequence[UserMessage] = (),
) -> tuple[AgentTurn, AiMessage]:
    """Record a model response: tool calls become pending (TOOLS), a final answer completes the turn.

    With `steering` (messages that came while the model answered), a final answer does not
    complete the turn: the messages follow it and the turn goes on to another model call.

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
    if steering:
        # The user spoke while the model answered: the answer stays, and the model answers them next.
        answered = turn.model_copy(update=changes)
        return apply_steering(answered, steering, now), message
    return transition(turn, AgentTurnStatus.COMPLETED, now, final_output=message.content or "", **changes), message


def apply_steering(turn: AgentTurn, messages: Sequence[UserMessage], now: datetime) -> AgentTurn:
    """Add steering messages (`AgentRunner.steer`) to the history before the next model call, and record them applied."""
    return touch(
        turn,
        now,
        phase=Phase.MODEL,
        messages=[*turn.messages, *messages],
        steered_message_ids=[*turn.steered_message_ids, *(m.id for m in messages)],
    )


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
        tool_state={k: v for k, v in turn.tool_state.items() if k != call.id} if turn.tool_state else turn.tool_state,
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
    return transition(
        turn, AgentTurnStatus.WAITING_FOR_CHILD, now, children=children, suspension=suspension, steps=turn.steps + 1
    )


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
        AgentTurnStatus.RETRY_SCHEDULED,
        now,
        attempt=attempt,
        next_retry_at=due,
        suspension=suspension,
        error=None,
        steps=turn.steps + 1,
    )


LIMIT_WAIT_REASON = "model_limit"
"""`metadata["reason"]` of a RETRY suspension that waits for a shared model limit, not after a failure."""


def schedule_limit_wait(
    turn: AgentTurn, message: str, until: datetime, metadata: dict[str, Any], now: datetime, *, called: bool
) -> AgentTurn:
    """Wait as RETRY_SCHEDULED until `until` for a shared model limit; no retry attempt is used.

    `called`: the model was called (and answered 429), which counts as a step.
    """
    return _wait(turn, LIMIT_WAIT_REASON, message, until, metadata, now, turn.steps + (1 if called else 0))


def _wait(
    turn: AgentTurn, reason: str, message: str, until: datetime, metadata: dict[str, Any], now: datetime, steps: int
) -> AgentTurn:
    """RETRY_SCHEDULED until `until` for `reason`, not after a failure: the attempt count stays."""
    suspension = AgentSuspension(
        type=SuspensionType.RETRY, message=message, resume_phase=turn.phase, metadata={"reason": reason, **metadata}
    )
    return transition(
        turn, AgentTurnStatus.RETRY_SCHEDULED, now, next_retry_at=until, suspension=suspension, error=None, steps=steps
    )


OPERATION_WAIT_REASON = "operation"
"""`metadata["reason"]` of a RETRY suspension that waits for work a tool started elsewhere (see `agent_runner.operations`)."""


def schedule_operation_wait(
    turn: AgentTurn, message: str, until: datetime, metadata: dict[str, Any], now: datetime
) -> AgentTurn:
    """Wait as RETRY_SCHEDULED until the next poll of work a tool started elsewhere; no retry attempt is used."""
    return _wait(turn, OPERATION_WAIT_REASON, message, until, metadata, now, turn.steps + 1)


def close_out(
    turn: AgentTurn,
    status: AgentTurnStatus,
    reason: str,
    policy: AgentExecutionPolicy,
    now: datetime,
    decided_by: str | None = None,
    answer: ChatResponse | None = None,
) -> AgentTurn:
    """End the turn abnormally and keep the model history protocol-valid.

    Every pending tool call gets a ToolMessage with the reason, then one assistant
    message says the turn did not finish, so the next turn of the conversation can
    build on this history. Pending page actions are settled as decided by `decided_by`
    (the person who cancelled), else by `SYSTEM_DECIDER`. With `answer` (a final answer
    asked for, see `FinalAnswer`), its text is that message and the turn's `final_output`,
    and its usage counts as a model call.
    """
    messages = closed_calls(turn, reason, policy)
    closing = policy.render(policy.interrupted_turn_message_template, reason=reason, turn_id=turn.id)
    changes: dict[str, Any] = {}
    if answer is not None:
        called = {"usage": turn.usage + answer.usage, "model_iterations": turn.model_iterations + 1}
        changes = {**called, "steps": turn.steps + 1}
        if answer.message.content:
            closing = changes["final_output"] = answer.message.content
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
        **changes,
    )


def closed_calls(turn: AgentTurn, reason: str, policy: AgentExecutionPolicy) -> list[ModelMessage]:
    """The turn's history with a ToolMessage saying `reason` for each pending call (protocol-valid again)."""
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
    return messages


def mark_started(turn: AgentTurn, call_id: str, now: datetime) -> AgentTurn:
    """Record that the body of a non-idempotent call is about to run (saved before it runs)."""
    return touch(turn, now, started_call_ids=[*turn.started_call_ids, call_id])


def unmark_started(turn: AgentTurn, call_id: str) -> AgentTurn:
    """Forget the start of a call whose body returned or raised: its outcome is known now."""
    if call_id not in turn.started_call_ids:
        return turn
    return turn.model_copy(update={"started_call_ids": [c for c in turn.started_call_ids if c != call_id]})

"""One step of a turn: perform what `machine.plan_step` decides and save the outcome.

A step is one model call, one tool call, one suspension, or the creation of child turns.
The step's first save expects the version it started from; a newer snapshot in the store
(a resume, a cancel, another worker) wins and the step's work is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from agent_runner import event_payloads as payloads
from agent_runner import machine
from agent_runner._base import trusted
from agent_runner._runtime import children, limiting, steering, waiting
from agent_runner._runtime.cancelling import stored_cancel_reason
from agent_runner._runtime.context import RunnerContext
from agent_runner._runtime.endings import after_terminal, failed_call, finish
from agent_runner._runtime.outcomes import BodyWatch, find_outcome, outcome_unknown_suspension
from agent_runner._runtime.saving import (
    carried_events,
    deliver_with_next_save,
    emit,
    save,
    suspended_event,
    terminal_event,
)
from agent_runner._runtime.streaming import CancelledMidCall, DeltaSink
from agent_runner.agent import Agent
from agent_runner.errors import (
    DefinitionError,
    FormProtocolError,
    ToolError,
    VersionConflictError,
)
from agent_runner.forms import AgentFormRequiredException
from agent_runner.limits import bounded_text, storable_text
from agent_runner.messages import AiMessage, ModelMessage, SystemMessage, ToolCall, UserMessage
from agent_runner.middleware import chain
from agent_runner.model_limits import WAIT_OVER_REASON
from agent_runner.models import ChatRequest, ChatResponse
from agent_runner.operations import OperationPending
from agent_runner.policy import RetryPolicy
from agent_runner.results import AgentStepResult
from agent_runner.snapshot import AgentTurn, AgentTurnStatus
from agent_runner.suspensions import AgentSuspension
from agent_runner.tools import Tool, encode_tool_result, tool_scope
from agent_runner.toolsets import list_turn_tools, listed_specs

logger = logging.getLogger("agent_runner")


FINAL_ANSWER_STATUSES = frozenset(
    {AgentTurnStatus.BUDGET_EXCEEDED, AgentTurnStatus.MAX_ITERATIONS_REACHED, AgentTurnStatus.MAX_STEPS_REACHED}
)
"""The limits after which an agent with a `FinalAnswer` asks its model for one."""

# The fields set here when these models are built from validated data (see `trusted`).
_REQUEST_GIVEN = frozenset(ChatRequest.model_fields)
_RESPONSE_GIVEN = frozenset(ChatResponse.model_fields)


def step(ctx: RunnerContext, turn: AgentTurn) -> AgentStepResult:
    """Advance the turn by one step, through the `wrap_step` middleware (see `AgentRunner.step`)."""
    if not ctx.middleware:
        return step_once(ctx, turn)
    produced: list[AgentStepResult] = []

    def innermost(_: AgentTurn) -> AgentStepResult:
        # Middleware observes steps but cannot change the state flow: the step runs on the
        # caller's snapshot, and its own result is returned whatever the middleware returns.
        result = step_once(ctx, turn)
        produced.append(result)
        return result

    chain(ctx.middleware, "wrap_step", innermost)(turn)
    return produced[0] if produced else step_once(ctx, turn)


def step_once(ctx: RunnerContext, turn: AgentTurn) -> AgentStepResult:
    """One step of `turn`; a turn that is not runnable is returned unchanged."""
    now = ctx.clock()
    if not turn.is_runnable(now):
        return AgentStepResult(turn=turn)
    expected = turn.version
    carried_events(ctx, turn.id).clear()  # nothing carries over from a step that raised
    if turn.status is AgentTurnStatus.RETRY_SCHEDULED:
        reason = WAIT_OVER_REASON if limiting.is_limit_wait(turn.suspension) else "retry due"
        reason = "poll due" if waiting.is_operation_wait(turn.suspension) else reason
        deliver_with_next_save(ctx, payloads.turn_resumed(command=None, reason=reason, attempt=turn.attempt), turn)
    agent = ctx.agent_for(turn)
    running = machine.start_running(turn, now)
    plan = machine.plan_step(running, agent, ctx.policy)
    try:
        if turn.status is AgentTurnStatus.READY and isinstance(plan, machine.CallModel):
            # Taken off the queue: say so durably before the model call, which may take a
            # while, so that clients can tell a queued turn from a running one.
            running = save(ctx, running, expected, payloads.turn_running())
            expected = running.version
        if isinstance(plan, machine.CallModel) and waiting.MODEL_CALL not in running.tool_state:
            # Not while a model call runs elsewhere: its answer is to the history it was sent.
            steered = steering.apply_pending(ctx, running, expected)
            if steered is not running:
                running, expected = steered, steered.version
        match plan:
            case machine.Terminate(status=status, reason=reason):
                return _terminate(ctx, running, agent, status, reason, expected, turn.suspension)
            case machine.CallModel():
                return _call_model(ctx, running, agent, expected, turn.suspension)
            case machine.ExecuteTool(call=call, tool=tool):
                return _execute_tool(ctx, running, call, tool, expected, ctx.policy.retry_for(agent))
            case machine.ReconcileTool(call=call, tool=tool):
                return _reconcile_tool(ctx, running, call, tool, expected, ctx.policy.retry_for(agent), None)
            case machine.WriteToolResult(call=call, content=content, is_error=is_error):
                updated, message = machine.apply_tool_result(running, call, content, is_error, now)
                saved = save(ctx, updated, expected, payloads.tool_completed(call, is_error))
                return AgentStepResult(turn=saved, tool_messages=[message])
            case machine.Suspend():
                suspended = machine.apply_suspension(running, plan, now, reminder=ctx.policy.deadline_reminder)
                return AgentStepResult(turn=save(ctx, suspended, expected, suspended_event(ctx, suspended)))
            case machine.SpawnChildren(calls=calls):
                return AgentStepResult(turn=children.spawn(ctx, running, calls, expected))
    except VersionConflictError as conflict:
        # Someone else advanced the turn (a resume, a cancel, another worker): never
        # overwrite it; hand back the newer snapshot.
        logger.warning(
            "turn %s changed while a step ran (the step expected version %s, the store has %s); "
            "the step's save is dropped and the newer snapshot wins",
            turn.id,
            conflict.expected_version,
            conflict.actual_version,
        )
        return AgentStepResult(turn=ctx.turn_store.load(turn.id), error=conflict)
    raise AssertionError(f"unhandled plan {plan!r}")  # pragma: no cover


def _terminate(
    ctx: RunnerContext,
    turn: AgentTurn,
    agent: Agent,
    status: AgentTurnStatus,
    reason: str,
    expected: int,
    previous: AgentSuspension | None,
) -> AgentStepResult:
    """End the turn as the plan says; after a limit, with the model's last answer when the agent asks for one.

    The last answer (see `FinalAnswer`) is asked for without tools. Waiting for a shared
    limit, it waits like any call; when it is due, the same limit stops the turn and asks
    again. A call that raises ends the turn with the close-out.
    """
    if status is AgentTurnStatus.CANCELLED:
        reason = stored_cancel_reason(ctx.turn_store, turn) or reason
    final = agent.final_answer
    if status not in FINAL_ANSWER_STATUSES or final is None:
        return AgentStepResult(turn=finish(ctx, turn, status, reason, expected_version=expected))

    def failed(_: limiting.CallGate | None, exc: Exception) -> AgentStepResult:
        logger.warning("turn %s: the final answer failed, it ends with the close-out: %s", turn.id, exc)
        return AgentStepResult(turn=finish(ctx, turn, status, reason, expected_version=expected), error=exc)

    polled, turn = waiting.model_operation(turn)
    closed = turn.model_copy(update={"messages": machine.closed_calls(turn, reason, ctx.policy)})
    ask = UserMessage(id=f"{turn.id}-final-answer", content=final.prompt(reason))
    fields = {"messages": [*_request_messages(closed, agent), ask], "tools": []}
    response = _ask_model(ctx, turn, agent, fields, expected, previous, failed, polled)
    if isinstance(response, AgentStepResult):
        return response
    message = machine.storable_message(response.message, ctx.policy.limits)
    answer = trusted(
        ChatResponse, _RESPONSE_GIVEN, {"message": message, "usage": response.usage, "model": response.model}
    )
    ended = machine.close_out(turn, status, reason, ctx.policy, ctx.clock(), answer=answer)
    usage = answer.usage
    text = ended.final_output or ""
    event = payloads.model_response(
        ended.messages[-1].id, text, [], usage.input_tokens, usage.output_tokens, answer.model
    )
    saved = save(ctx, ended, expected, event, terminal_event(ended))
    after_terminal(ctx, saved)
    return AgentStepResult(turn=saved, response=answer)


ModelFailed = Callable[[limiting.CallGate | None, Exception], AgentStepResult]
"""What a model call that raised comes to (given the call's gate to the shared limits, already told)."""


def _ask_model(
    ctx: RunnerContext,
    turn: AgentTurn,
    agent: Agent,
    request_fields: dict[str, Any],
    expected: int,
    previous: AgentSuspension | None,
    failed: ModelFailed,
    polled: dict[str, Any] | None = None,
) -> ChatResponse | AgentStepResult:
    """One model call under the shared limits, through the `wrap_model` middleware; or the step's outcome without one.

    `request_fields`: the request's messages and tools. Without capacity the turn waits; a
    cancel while the answer streams in ends it; an exception is `failed`'s to handle. A
    model that started its answer elsewhere (`OperationPending`) makes the turn wait for
    it; with `polled` (that wait's state) the model is asked to read it instead of called,
    outside the shared limits (a poll is not a model call).
    """
    if agent.chat_model is None:
        raise DefinitionError(f"agent {agent.id!r} has no chat_model")
    chat_model = agent.chat_model
    name = str(getattr(chat_model, "model", type(chat_model).__name__))
    if polled is not None:
        return _poll_model(ctx, turn, chat_model, name, polled, expected, failed)
    sink = DeltaSink(ctx, turn)
    retry = ctx.policy.retry_for(agent)
    limits = limiting.gate(ctx, turn, request_fields["messages"], request_fields["tools"], previous, retry)
    request = trusted(ChatRequest, _REQUEST_GIVEN, {**request_fields, "on_delta": sink, "limits": limits})
    try:
        if limits is not None:
            limits.admit(chat_model)
        raw: object = chain(ctx.middleware, "wrap_model", chat_model.generate)(request)
        # Lenient with hand-written models and middleware that return a bare AiMessage.
        response = ChatResponse(message=raw) if isinstance(raw, AiMessage) else raw
        if not isinstance(response, ChatResponse):
            raise DefinitionError(f"chat model returned {type(response).__name__}, expected ChatResponse")
    except limiting.LimitWaitError as limit_wait:
        if limits is not None:
            limits.done(chat_model, None, limit_wait)
        return limiting.must_wait(ctx, turn, limits, limit_wait, expected)
    except OperationPending as pending:
        if limits is not None:
            limits.done(chat_model, None, None)
        return waiting.wait_for_model(ctx, turn, name, None, pending, expected)
    except CancelledMidCall:
        if limits is not None:
            limits.done(chat_model, None, None)
        # Cancelled while the answer streamed in: stop paying for it and end the turn now.
        reason = stored_cancel_reason(ctx.turn_store, turn) or ctx.policy.cancellation_reason
        return AgentStepResult(turn=finish(ctx, turn, AgentTurnStatus.CANCELLED, reason, expected_version=expected))
    except Exception as exc:
        if limits is not None:
            limits.done(chat_model, None, exc)
        return failed(limits, exc)
    finally:
        sink.close()
    if limits is not None:
        limits.done(chat_model, response.usage, None)
    return response


def _poll_model(
    ctx: RunnerContext,
    turn: AgentTurn,
    chat_model: object,
    name: str,
    polled: dict[str, Any],
    expected: int,
    failed: ModelFailed,
) -> ChatResponse | AgentStepResult:
    """Read the answer the model works on elsewhere: it, another wait, or `failed`'s outcome."""
    try:
        return waiting.poll_model(chat_model, polled)
    except OperationPending as pending:
        return waiting.wait_for_model(ctx, turn, name, polled, pending, expected)
    except Exception as exc:
        return failed(None, exc)


def _call_model(
    ctx: RunnerContext, turn: AgentTurn, agent: Agent, expected: int, previous: AgentSuspension | None
) -> AgentStepResult:
    def failed(limits: limiting.CallGate | None, exc: Exception) -> AgentStepResult:
        retry = ctx.policy.retry_for(agent)
        refused = limiting.provider_refused(ctx, turn, limits, exc, expected, retry)
        return refused if refused is not None else failed_call(ctx, turn, exc, expected, retry)

    if agent.toolsets and turn.listed_tools is None:
        try:
            taken = [spec.name for spec in agent.tool_specs()]
            turn = turn.model_copy(update={"listed_tools": list_turn_tools(agent.toolsets, taken, turn)})
        except Exception as exc:  # a server that cannot list now: on the retry schedule when transient
            return failed_call(ctx, turn, exc, expected, ctx.policy.retry_for(agent))
    tools = [*agent.tool_specs(), *listed_specs(turn.listed_tools)] if turn.listed_tools else agent.tool_specs()
    fields = {"messages": _request_messages(turn, agent), "tools": tools}
    # Dropped from the turn whatever the poll finds: an answer or a failure ends the wait.
    polled, turn = waiting.model_operation(turn)
    response = _ask_model(ctx, turn, agent, fields, expected, previous, failed, polled)
    if isinstance(response, AgentStepResult):
        return response
    # Messages that came while the model answered: a final answer does not end the turn then.
    late = [] if response.message.tool_calls else steering.pending(ctx, turn)
    updated, message = machine.apply_model_response(
        turn, response, ctx.clock(), steering=steering.as_user_messages(late)
    )
    response = trusted(
        ChatResponse, _RESPONSE_GIVEN, {"message": message, "usage": response.usage, "model": response.model}
    )
    usage = response.usage
    event = payloads.model_response(
        message.id,
        message.content,
        [c.name for c in message.tool_calls],
        usage.input_tokens,
        usage.output_tokens,
        response.model,
    )
    applied = payloads.steering_applied([m.message_id for m in late]) if late else None
    saved = save(ctx, updated, expected, event, applied, terminal_event(updated))
    if saved.is_terminal:
        after_terminal(ctx, saved)
    return AgentStepResult(turn=saved, response=response)


def _request_messages(turn: AgentTurn, agent: Agent) -> list[ModelMessage]:
    messages: list[ModelMessage] = []
    if agent.instructions:
        messages.append(SystemMessage(id=f"{agent.id}-instructions", content=agent.instructions))
    messages.extend(turn.messages)
    return messages


def _execute_tool(
    ctx: RunnerContext, turn: AgentTurn, call: ToolCall, tool: Tool, expected: int, retry: RetryPolicy
) -> AgentStepResult:
    deliver_with_next_save(ctx, payloads.tool_started(call), turn)
    started = turn
    if not tool.idempotent and not waiting.is_polling(turn, call):
        # Saved before the body runs: after a crash, the call is known to have started and
        # is reconciled instead of being run again. The saves after the body forget the mark.
        started = save(ctx, machine.mark_started(turn, call.id, ctx.clock()), expected)
        expected = started.version
        turn = machine.unmark_started(started, call.id)
    submitted = turn.form_data.get(call.id, {})
    body = BodyWatch()  # middleware may fail before the body runs, or recast what it raised

    def progress(data: Any) -> None:
        if not ctx.listeners:
            return
        try:
            report = payloads.tool_progress(call, data)
        except ValidationError:
            # A report that is not JSON must not fail the tool that made it.
            logger.warning("tool %s reported progress that is not JSON; it is dropped: %r", call.name, data)
            return
        emit(ctx, report, turn)

    def invoke(tool_call: ToolCall) -> Any:
        with tool_scope(turn, tool_call, submitted, progress):
            return body.invoke(tool, tool_call.arguments)

    is_error = False
    try:
        content = _tool_text(ctx, encode_tool_result(chain(ctx.middleware, "wrap_tool", invoke)(call)))
    except OperationPending as pending:
        return waiting.wait(ctx, turn, call, pending, expected)
    except ToolError as exc:
        content, is_error = _tool_text(ctx, str(exc)), True
    except AgentFormRequiredException as exc:
        if call.id in turn.form_data and exc.state is None:
            error = FormProtocolError(turn.id, call.id, exc.form.key)
            failed = finish(ctx, turn, AgentTurnStatus.FAILED, str(error), expected_version=expected)
            return AgentStepResult(turn=failed, error=error)
        if exc.state is not None:
            turn = turn.model_copy(update={"tool_state": {**turn.tool_state, call.id: exc.state}})
        plan = machine.form_suspension(
            turn, call, exc.form, machine.FORM_SOURCE_TOOL, exc.message, takes_decline=exc.takes_decline
        )
        suspended = machine.apply_suspension(turn, plan, ctx.clock(), reminder=ctx.policy.deadline_reminder)
        return AgentStepResult(turn=save(ctx, suspended, expected, suspended_event(ctx, suspended)))
    except Exception as exc:
        if body.leaves_outcome_unknown(tool):
            return _reconcile_tool(ctx, started, call, tool, expected, retry, exc)
        return failed_call(ctx, turn, exc, expected, retry, tool.retry_on)
    updated, message = machine.apply_tool_result(turn, call, content, is_error, ctx.clock())
    saved = save(ctx, updated, expected, payloads.tool_completed(call, is_error))
    return AgentStepResult(turn=saved, tool_messages=[message])


def _reconcile_tool(
    ctx: RunnerContext,
    turn: AgentTurn,
    call: ToolCall,
    tool: Tool,
    expected: int,
    retry: RetryPolicy,
    raised: Exception | None,
) -> AgentStepResult:
    """Settle a started non-idempotent call, never re-running it blindly (`raised`: what its body raised now)."""
    outcome = find_outcome(tool, turn, call)
    if outcome.state == "done":
        content = _tool_text(ctx, encode_tool_result(outcome.result))
        updated, message = machine.apply_tool_result(turn, call, content, False, ctx.clock())
        saved = save(ctx, updated, expected, payloads.tool_completed(call, False, reconciled=True))
        return AgentStepResult(turn=saved, tool_messages=[message])
    if outcome.state == "not_done" and raised is not None:
        # Nothing took effect: the error counts as for any tool (retried on the schedule, or failed).
        return failed_call(ctx, machine.unmark_started(turn, call.id), raised, expected, retry, tool.retry_on)
    if outcome.state == "not_done":
        return _execute_tool(ctx, machine.unmark_started(turn, call.id), call, tool, expected, retry)
    plan = outcome_unknown_suspension(turn, call, tool, outcome.note, raised)
    suspended = machine.apply_suspension(turn, plan, ctx.clock())
    return AgentStepResult(turn=save(ctx, suspended, expected, suspended_event(ctx, suspended)))


def _tool_text(ctx: RunnerContext, content: str) -> str:
    """A tool's answer in a form every store can save: unstorable characters replaced, cut at the message limit.

    A tool's return value, like model output, is kept rather than refused: the call ran,
    and failing its save would run it again.
    """
    return bounded_text(storable_text(content), ctx.policy.limits.max_message_bytes)

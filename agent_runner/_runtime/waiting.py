"""Waits on work that runs elsewhere (see `agent_runner.operations`): saved RETRY_SCHEDULED, polled, cancelled with the turn.

The work is a tool call's (its state under the call id) or a model call's: a chat model
whose `generate` raised `OperationPending` (a background response) keeps its handle under
`MODEL_CALL`, and the next step asks the model to read it (`poll_operation`) instead of
calling it again.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from agent_runner import event_payloads as payloads
from agent_runner import machine
from agent_runner._runtime.context import RunnerContext
from agent_runner._runtime.saving import save
from agent_runner.errors import DefinitionError
from agent_runner.messages import AiMessage, ToolCall
from agent_runner.models import ChatResponse
from agent_runner.operations import OPERATION_KEY, POLLS_KEY, OperationPending, next_poll
from agent_runner.results import AgentStepResult
from agent_runner.snapshot import AgentTurn
from agent_runner.suspensions import AgentSuspension
from agent_runner.tools import Tool, tool_scope

logger = logging.getLogger("agent_runner")

MODEL_CALL = "#model"
"""Key in `AgentTurn.tool_state` of a model call that runs elsewhere (no tool call id starts with '#')."""


def is_polling(turn: AgentTurn, call: ToolCall) -> bool:
    """Whether the call started work elsewhere and its run is a poll of that work."""
    return OPERATION_KEY in turn.tool_state.get(call.id, {})


def is_operation_wait(suspension: AgentSuspension | None) -> bool:
    """Whether `suspension` is a wait for work elsewhere (not a retry after a failure)."""
    return suspension is not None and suspension.metadata.get("reason") == machine.OPERATION_WAIT_REASON


def wait(
    ctx: RunnerContext, turn: AgentTurn, call: ToolCall, pending: OperationPending, expected: int
) -> AgentStepResult:
    """Save the turn RETRY_SCHEDULED until the next poll (no retry attempt used), the handle in its tool state."""
    return _wait(ctx, turn, call.id, call.name, turn.tool_state.get(call.id, {}), pending, expected)


def wait_for_model(
    ctx: RunnerContext,
    turn: AgentTurn,
    model: str,
    polled: dict[str, Any] | None,
    pending: OperationPending,
    expected: int,
) -> AgentStepResult:
    """`wait` for a model call that runs elsewhere (`polled`: the wait's state so far, None when just started)."""
    return _wait(ctx, turn, MODEL_CALL, model, polled or {}, pending, expected)


def model_operation(turn: AgentTurn) -> tuple[dict[str, Any] | None, AgentTurn]:
    """The handle of the turn's model call that runs elsewhere (or None), and the turn without it."""
    state = turn.tool_state.get(MODEL_CALL)
    if state is None:
        return None, turn
    rest = {k: v for k, v in turn.tool_state.items() if k != MODEL_CALL}
    return state, turn.model_copy(update={"tool_state": rest})


def poll_model(chat_model: object, state: dict[str, Any]) -> ChatResponse:
    """Ask `chat_model` to read the model call it started elsewhere; raises `OperationPending` while it runs."""
    poll = getattr(chat_model, "poll_operation", None)
    if poll is None:
        raise DefinitionError(
            f"the turn waits for a model call that runs elsewhere, but its model {chat_model!r} cannot read it "
            "(no poll_operation); keep the agent's model while its turns wait"
        )
    response = poll(state[OPERATION_KEY])
    if not isinstance(response, ChatResponse):
        raise DefinitionError(
            f"{chat_model!r}.poll_operation returned {type(response).__name__}, expected ChatResponse"
        )
    return response


def _wait(
    ctx: RunnerContext,
    turn: AgentTurn,
    key: str,
    name: str,
    state: dict[str, Any],
    pending: OperationPending,
    expected: int,
) -> AgentStepResult:
    now = ctx.clock()
    polls = int(state.get(POLLS_KEY, 0))
    due = now + timedelta(seconds=next_poll(polls, pending.poll_after))
    message = f"waiting for {name} ({pending.status}); next look at {due.isoformat()}"
    kept = {**state, OPERATION_KEY: pending.handle, POLLS_KEY: polls + 1}
    metadata = {"tool_call_id": key, "status": pending.status, "polls": polls + 1}
    waiting = machine.schedule_operation_wait(
        turn.model_copy(update={"tool_state": {**turn.tool_state, key: kept}}), message, due, metadata, now
    )
    saved = save(ctx, waiting, expected, payloads.retry_scheduled(waiting, message))
    ctx.execution.dispatch(saved)
    return AgentStepResult(turn=saved)


def abandon_calls(ctx: RunnerContext, turn: AgentTurn) -> None:
    """Tell each tool whose call kept state (work elsewhere, a question) that the turn ended; failures are logged."""
    for call_id, state in turn.tool_state.items():
        if call_id == MODEL_CALL:
            _abandon_model_call(ctx, turn, state)
            continue
        try:
            agent = ctx.agent_for(turn)
            calls = (c for m in turn.messages if isinstance(m, AiMessage) for c in m.tool_calls)
            call = next((c for c in calls if c.id == call_id), None)
            tool = None if call is None else agent.tool(call.name) or agent.listed_tool(turn, call.name)
            if isinstance(tool, Tool) and call is not None:
                with tool_scope(turn, call, {}, lambda _: None):
                    tool.call_abandoned(state)
        except Exception:
            logger.exception("turn %s: the tool of call %s could not be told that the turn ended", turn.id, call_id)


def _abandon_model_call(ctx: RunnerContext, turn: AgentTurn, state: dict[str, Any]) -> None:
    """Cancel the model call the turn waited for (a background response), so that it stops costing."""
    try:
        cancel = getattr(ctx.agent_for(turn).chat_model, "cancel_operation", None)
        if cancel is not None and OPERATION_KEY in state:
            cancel(state[OPERATION_KEY])
    except Exception:
        logger.exception("turn %s: the model call it waited for could not be cancelled", turn.id)

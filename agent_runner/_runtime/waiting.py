"""Waits on work that runs elsewhere (see `agent_runner.operations`): saved RETRY_SCHEDULED, polled, cancelled with the turn."""

from __future__ import annotations

import logging
from datetime import timedelta

from agent_runner import event_payloads as payloads
from agent_runner import machine
from agent_runner._runtime.context import RunnerContext
from agent_runner._runtime.saving import save
from agent_runner.messages import AiMessage, ToolCall
from agent_runner.operations import OPERATION_KEY, POLLS_KEY, OperationPending, next_poll
from agent_runner.results import AgentStepResult
from agent_runner.snapshot import AgentTurn
from agent_runner.suspensions import AgentSuspension
from agent_runner.tools import Tool, tool_scope

logger = logging.getLogger("agent_runner")


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
    now = ctx.clock()
    state = turn.tool_state.get(call.id, {})
    polls = int(state.get(POLLS_KEY, 0))
    due = now + timedelta(seconds=next_poll(polls, pending.poll_after))
    message = f"waiting for {call.name} ({pending.status}); next look at {due.isoformat()}"
    kept = {**state, OPERATION_KEY: pending.handle, POLLS_KEY: polls + 1}
    metadata = {"tool_call_id": call.id, "status": pending.status, "polls": polls + 1}
    waiting = machine.schedule_operation_wait(
        turn.model_copy(update={"tool_state": {**turn.tool_state, call.id: kept}}), message, due, metadata, now
    )
    saved = save(ctx, waiting, expected, payloads.retry_scheduled(waiting, message))
    ctx.execution.dispatch(saved)
    return AgentStepResult(turn=saved)


def abandon_calls(ctx: RunnerContext, turn: AgentTurn) -> None:
    """Tell each tool whose call kept state (work elsewhere, a question) that the turn ended; failures are logged."""
    for call_id, state in turn.tool_state.items():
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

"""Creating a root turn: checking the input, resolving the agent, attaching history, saving it READY."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from agent_runner import event_payloads as payloads
from agent_runner import telemetry_hooks
from agent_runner._runtime.context import RunnerContext
from agent_runner._runtime.saving import deliver, event, save_turn
from agent_runner.agent import Agent
from agent_runner.errors import AgentRunnerError, DefinitionError
from agent_runner.ids import new_id
from agent_runner.limits import check_id, check_not_before, check_turn_input
from agent_runner.messages import ModelMessage, UserMessage
from agent_runner.persistence import ConversationKey
from agent_runner.snapshot import AgentTurn

logger = logging.getLogger("agent_runner")


def create(
    ctx: RunnerContext,
    agent_ref: Agent | str,
    message: str | UserMessage,
    *,
    history: Sequence[ModelMessage] | None,
    conversation_id: str | None,
    tenant_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    turn_id: str | None = None,
    not_before: datetime | None = None,
) -> AgentTurn:
    """Save a new READY turn with its TURN_STARTED event (see `AgentRunner.start` for the arguments).

    A turn with a `not_before` ahead is saved READY with it as `next_retry_at`: no worker steps
    it before then, and it is the conversation's active turn while it waits.

    Raises:
        AgentConversationBusyException: The conversation already has an active turn.
        VersionConflictError: A turn with `turn_id` is stored already.
    """
    check_turn_input(ctx.policy.limits, message, history, conversation_id, tenant_id, metadata)
    if turn_id is not None:
        check_id(turn_id, "turn_id", ctx.policy.limits)
    starts_at = None if not_before is None else check_not_before(not_before, ctx.clock(), limits=ctx.policy.limits)
    agent = _resolve_agent(ctx, agent_ref)
    user = UserMessage(content=message) if isinstance(message, str) else message
    if not isinstance(user, UserMessage):
        raise DefinitionError(f"a turn starts from a str or UserMessage, got {type(message).__name__}")
    if history is not None and conversation_id is not None:
        raise DefinitionError("pass either history= (explicit history) or conversation_id= (ChatMemory), not both")
    window: list[ModelMessage] = []
    if history is not None:
        window = [m for m in history if m.model_visible]
    elif conversation_id is not None:
        conversation = ConversationKey(conversation_id, tenant_id)
        _finish_projection_of_last_turn(ctx, conversation)
        window = ctx.projection.memory(conversation).get_model_messages(agent.max_attached_messages)
    turn_id = turn_id or new_id()
    now = ctx.clock()
    turn = AgentTurn(
        id=turn_id,
        agent_id=agent.id,
        agent_version=agent.version,
        conversation_id=conversation_id,
        root_turn_id=turn_id,
        messages=[*window, user],
        projected_count=len(window),
        root_conversation_id=conversation_id,
        tenant_id=tenant_id,
        metadata=dict(metadata or {}),
        created_at=now,
        updated_at=now,
        next_retry_at=starts_at,
    )
    turn = telemetry_hooks.stamp_new_turn(ctx.telemetry_key, turn)  # trace context of the new turn
    started = event(ctx, payloads.turn_started(turn, user.id), turn, 0, 0)
    saved = ctx.gate.create(turn, [started], lambda t, v, e: save_turn(ctx, t, v, e))
    deliver(ctx, started)
    return ctx.projection.project(saved)


def _resolve_agent(ctx: RunnerContext, agent: Agent | str) -> Agent:
    if isinstance(agent, Agent):
        register = getattr(ctx.agent_loader, "register", None)
        if callable(register):
            register(agent)
        return agent
    return ctx.agent_loader.load(agent)


def _finish_projection_of_last_turn(ctx: RunnerContext, conversation: ConversationKey) -> None:
    """Redo the projection of the conversation's last turn if it ended before ChatMemory had it all.

    A failed projection is retried after the next save of the turn, but an ended turn has
    no next save: without this, its last messages (the final answer) would be missing
    from the history every later turn of the conversation reads.
    """
    if ctx.projection.provider is None:
        return
    try:
        last = ctx.turn_store.list_turns(
            conversation_id=conversation.conversation_id, tenant_id=conversation.tenant_id, limit=1
        )
    except AgentRunnerError as exc:
        logger.warning("could not check the last turn of conversation %s: %s", conversation, exc)
        return
    for turn in last:
        unsynced = any(not action.synced for action in turn.page_actions)
        if turn.is_terminal and (turn.projected_count < len(turn.messages) or unsynced):
            ctx.projection.project(turn)

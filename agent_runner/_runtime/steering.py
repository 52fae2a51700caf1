"""Steering: user messages that join a turn while it works, before its next model call.

Accepting one (`steer`) stores it in the turn store's `SteeringQueue`, from any process and
without the turn's lease. The process that steps the turn applies what is pending at the
next model-call boundary (`apply_pending`): the messages join the history as user messages,
in the order they were accepted, in a save of their own before the model call. That is
never between a tool call and its result, since a model call is planned only once every
call of the previous answer has its result. The snapshot records the ids it applied, so a
message is applied once, and one accepted before its worker died is applied by the next.

A final answer (no tool calls) that comes back while messages are pending does not end the
turn: the answer is kept and the messages follow it, for another model call (`pending`).

A turn that waits (for a person, a child, a retry) keeps its pending messages until it runs
again. A turn that ends without applying some hands them on once (`hand_on`): in a
conversation, to the conversation's active turn if another one is running, else the first
starts the conversation's next turn and the others steer it; a cancelled turn, or one
outside a conversation, drops them. Either way STEERING_NOT_APPLIED says so.
"""

from __future__ import annotations

import logging

from agent_runner import event_payloads as payloads
from agent_runner import machine
from agent_runner._runtime import creation
from agent_runner._runtime.context import RunnerContext
from agent_runner._runtime.saving import emit, save
from agent_runner.errors import (
    AgentConversationBusyException,
    AgentRunnerError,
    DefinitionError,
    SteeringRefusedError,
    TurnNotFound,
)
from agent_runner.ids import new_id
from agent_runner.limits import check_id, check_text
from agent_runner.messages import UserMessage
from agent_runner.persistence import SteeringMessage, SteeringQueue
from agent_runner.snapshot import AgentTurn, AgentTurnStatus

logger = logging.getLogger("agent_runner")

_HAND_ON_ATTEMPTS = 5
"""Tries to find the conversation's turn for messages a turn ended without (each loses a race to a turn that ends)."""


def queue_of(ctx: RunnerContext) -> SteeringQueue | None:
    """The runner's store as a steering queue, or None when it keeps no steering messages."""
    store = ctx.turn_store
    return store if isinstance(store, SteeringQueue) else None


def steer(ctx: RunnerContext, turn_id: str, text: str, message_id: str | None) -> AgentTurn:
    """Accept a steering message for a turn (see `AgentRunner.steer`); return the turn that will read it."""
    limits = ctx.policy.limits
    check_id(turn_id, "turn_id", limits)
    check_text(text, "message", limits.max_message_bytes)
    message_id = new_id() if message_id is None else check_id(message_id, "message_id", limits)
    queue = queue_of(ctx)
    if queue is None:
        raise DefinitionError(f"{type(ctx.turn_store).__name__} keeps no steering messages (it is not a SteeringQueue)")
    turn = ctx.turn_store.load(turn_id)
    if turn.is_terminal and message_id not in turn.steered_message_ids:
        # Ended before the message came: it goes where a message that came too late goes.
        return _hand_on_message(ctx, turn, message_id, text)
    return _accept(ctx, queue, turn, message_id, text)


def _accept(ctx: RunnerContext, queue: SteeringQueue, turn: AgentTurn, message_id: str, text: str) -> AgentTurn:
    stored, new = queue.accept_steering(turn.id, message_id, text, ctx.clock())
    if new:
        emit(ctx, payloads.steering_accepted(stored.message_id, stored.text), turn)
    # The turn may have ended between the load and the accept; its stepper hands on what
    # it finds after its last save, and this finds what came after that: one of the two
    # sees the message, and `take_unapplied_steering` gives it to one only.
    current = ctx.turn_store.load(turn.id)
    if current.is_terminal:
        return hand_on(ctx, current) or current
    return current


def _hand_on_message(ctx: RunnerContext, turn: AgentTurn, message_id: str, text: str) -> AgentTurn:
    if turn.conversation_id is None:
        raise SteeringRefusedError(turn.id, turn.status.value)
    if turn.status is AgentTurnStatus.CANCELLED:
        raise SteeringRefusedError(turn.id, turn.status.value)
    message = SteeringMessage(turn.id, message_id, text, ctx.clock(), 0)
    taken = _to_conversation(ctx, turn, [message])
    if taken is None:
        raise SteeringRefusedError(turn.id, turn.status.value)
    return taken


def pending(ctx: RunnerContext, turn: AgentTurn) -> list[SteeringMessage]:
    """The turn's steering messages not applied yet, in order (none when the store keeps none)."""
    queue = queue_of(ctx)
    if queue is None:
        return []
    applied = set(turn.steered_message_ids)
    return [m for m in queue.steering_messages(turn.id) if m.message_id not in applied]


def as_user_messages(messages: list[SteeringMessage]) -> list[UserMessage]:
    """The history entries of steering messages."""
    return [UserMessage(id=m.message_id, content=m.text) for m in messages]


def apply_pending(ctx: RunnerContext, turn: AgentTurn, expected: int) -> AgentTurn:
    """Before a model call: save the pending steering messages into the history (the turn as it was when none)."""
    waiting = pending(ctx, turn)
    if not waiting:
        return turn
    updated = machine.apply_steering(turn, as_user_messages(waiting), ctx.clock())
    return save(ctx, updated, expected, payloads.steering_applied([m.message_id for m in waiting]))


def hand_on(ctx: RunnerContext, turn: AgentTurn) -> AgentTurn | None:
    """Hand on the steering messages an ended turn did not apply; return the turn that took them, if any.

    Never raises: a failure is logged, and the messages stay with the ended turn.
    """
    queue = queue_of(ctx)
    if queue is None:
        return None
    try:
        # A read first: most turns end with nothing left, and the take is a write.
        if not pending(ctx, turn):
            return None
        left = queue.take_unapplied_steering(turn.id, turn.steered_message_ids)
        if not left:
            return None
        ids = [m.message_id for m in left]
        taken: AgentTurn | None = None
        if turn.conversation_id is None:
            reason = "the turn ended and belongs to no conversation"
        elif turn.status is AgentTurnStatus.CANCELLED:
            reason = "the turn was cancelled"
        else:
            taken = _to_conversation(ctx, turn, left)
            reason = f"the turn ended ({turn.status.value}) before its next model call"
        emit(ctx, payloads.steering_not_applied(ids, reason, None if taken is None else taken.id), turn)
        return taken
    except AgentRunnerError as exc:
        logger.warning("could not hand on the steering messages of ended turn %s: %s", turn.id, exc)
        return None


def _to_conversation(ctx: RunnerContext, ended: AgentTurn, messages: list[SteeringMessage]) -> AgentTurn | None:
    """Give `messages` to the conversation's active turn, or start its next turn with them."""
    conversation = ended.conversation_id
    assert conversation is not None
    queue = queue_of(ctx)
    assert queue is not None
    for _ in range(_HAND_ON_ATTEMPTS):
        active = ctx.turn_store.find_active_turn(conversation, ended.tenant_id)
        if active is not None:
            for message in messages:
                queue.accept_steering(active.id, message.message_id, message.text, ctx.clock())
                emit(ctx, payloads.steering_accepted(message.message_id, message.text), active)
            current = ctx.turn_store.load(active.id)
            if not current.is_terminal:
                return current
            # It ended meanwhile: whoever saw it end hands these on again.
            return hand_on(ctx, current)
        first, rest = messages[0], messages[1:]
        try:
            started = creation.create(
                ctx,
                ended.agent_id,
                UserMessage(id=first.message_id, content=first.text),
                history=None,
                conversation_id=conversation,
                tenant_id=ended.tenant_id,
                metadata=ended.metadata,
            )
        except AgentConversationBusyException:
            continue
        except TurnNotFound:
            return None
        for message in rest:
            queue.accept_steering(started.id, message.message_id, message.text, ctx.clock())
        ctx.execution.dispatch(started)
        return started
    return None

"""Saving a turn with the events it causes, and delivering events to the runner's listeners.

Every save is a compare-and-swap that writes the snapshot and its events together, then
projects the turn into its conversation's ChatMemory and delivers the new events. Events
that happen before a save (TOOL_STARTED, a retry coming due) are delivered at once and
carried, per thread, into the turn's next save.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from agent_runner import event_payloads as payloads
from agent_runner._base import trusted
from agent_runner._runtime.context import RunnerContext
from agent_runner.events import AgentEvent, AgentEventType
from agent_runner.ids import new_id, utcnow
from agent_runner.snapshot import AgentTurn, AgentTurnStatus

logger = logging.getLogger("agent_runner")


PendingEvent = payloads.EventBody | None
"""An event a save causes: its type and fields, from `agent_runner.event_payloads` (None: no event)."""

# The fields set here when the event is built from validated data (see `trusted`).
_EVENT_GIVEN = frozenset(AgentEvent.model_fields) - {"cursor"}
# Those of an event that is not saved: its id and time are the model's defaults.
_UNSAVED_GIVEN = frozenset({"type", "turn_id", "root_turn_id", "conversation_id", "data"})

TERMINAL_EVENTS: dict[AgentTurnStatus, AgentEventType] = {
    AgentTurnStatus.COMPLETED: AgentEventType.TURN_COMPLETED,
    AgentTurnStatus.FAILED: AgentEventType.TURN_FAILED,
    AgentTurnStatus.CANCELLED: AgentEventType.TURN_CANCELLED,
    AgentTurnStatus.MAX_ITERATIONS_REACHED: AgentEventType.MAX_ITERATIONS_REACHED,
    AgentTurnStatus.MAX_STEPS_REACHED: AgentEventType.MAX_STEPS_REACHED,
    AgentTurnStatus.BUDGET_EXCEEDED: AgentEventType.BUDGET_EXCEEDED,
}


def save(ctx: RunnerContext, turn: AgentTurn, expected_version: int, *events: PendingEvent) -> AgentTurn:
    """Compare-and-swap save with the events it causes, then project into ChatMemory and deliver them.

    The events are written in the same transaction as the snapshot (a saved state never
    lacks its events, an event never describes an unsaved state), with ids made of the
    turn id, the saved version and their position, so a step re-run after a crash cannot
    write them twice. Events carried from earlier in the step (TOOL_STARTED, a retry
    coming due) are saved with them; listeners saw those already.
    """
    version = expected_version + 1
    carried = carried_events(ctx, turn.id)
    built = list(carried)
    carried.clear()
    delivered = len(built)
    for pending in events:
        if pending is not None:
            built.append(event(ctx, pending, turn, version, len(built)))
    saved = save_turn(ctx, turn, expected_version, built)
    if saved.conversation_id is not None:
        saved = ctx.projection.project(saved)
    for built_event in built[delivered:]:
        deliver(ctx, built_event)
    return saved


def save_turn(ctx: RunnerContext, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent]) -> AgentTurn:
    """The store's save, carrying the ChatMemory projection when the store can (see `Projection.save`)."""
    return ctx.projection.save(ctx.turn_store, turn, expected_version, events)


def event(ctx: RunnerContext, body: payloads.EventBody, turn: AgentTurn, version: int, index: int) -> AgentEvent:
    """A durable event of the save that gives `turn` the version `version`."""
    # Every field comes from a validated snapshot or from here: no need to validate again.
    return trusted(
        AgentEvent,
        _EVENT_GIVEN,
        {
            "event_id": f"{turn.id}:{version}:{index}",
            "type": body.type,
            "turn_id": turn.id,
            "root_turn_id": turn.root_turn_id,
            "conversation_id": turn.conversation_id or turn.root_conversation_id,
            "tenant_id": turn.tenant_id,
            "timestamp": ctx.clock(),
            "data": body.data(turn.status, version),
            "cursor": None,
        },
    )


def carried_events(ctx: RunnerContext, turn_id: str) -> list[AgentEvent]:
    """The events this thread delivered for the turn's next save (a list to append to or clear)."""
    carried: dict[str, list[AgentEvent]] | None = getattr(ctx.local, "carried", None)
    if carried is None:
        carried = ctx.local.carried = {}
    return carried.setdefault(turn_id, [])


def deliver_with_next_save(ctx: RunnerContext, body: payloads.EventBody, turn: AgentTurn) -> None:
    """Deliver a durable event now and save it with the turn's next save (it precedes any save)."""
    carried = carried_events(ctx, turn.id)
    built = event(ctx, body, turn, turn.version + 1, len(carried))
    carried.append(built)
    deliver(ctx, built)


def suspended_event(ctx: RunnerContext, turn: AgentTurn) -> PendingEvent:
    """TURN_SUSPENDED of `turn`, the call's arguments masked as the turn's agent says."""
    return payloads.turn_suspended(turn, ctx.agent_for(turn).masked_arguments)


def terminal_event(turn: AgentTurn) -> PendingEvent:
    """The event that ends `turn` (TURN_COMPLETED, TURN_FAILED...), or None when it has not ended."""
    return payloads.turn_ended(turn, TERMINAL_EVENTS[turn.status]) if turn.is_terminal else None


def projection_failed(ctx: RunnerContext, turn: AgentTurn, error: str) -> None:
    """Tell the listeners that projecting `turn` into ChatMemory failed (it is retried later)."""
    emit(ctx, payloads.chat_memory_error(error), turn)


def emit(ctx: RunnerContext, body: payloads.EventBody, turn: AgentTurn) -> None:
    """Deliver an event that is not saved (MODEL_DELTA, TOOL_PROGRESS, CHAT_MEMORY_ERROR) to the listeners."""
    if not ctx.listeners:
        return
    deliver(ctx, unsaved_event(body.type, turn, body.data(turn.status, turn.version)))


def unsaved_event(event_type: AgentEventType, turn: AgentTurn, data: dict[str, Any]) -> AgentEvent:
    """An event of `turn` that is not saved: a new id, the time now, and `data` (already its payload's shape)."""
    # Every field comes from a validated snapshot or payload: no need to validate again.
    return trusted(
        AgentEvent,
        _UNSAVED_GIVEN,
        {
            "event_id": new_id(),
            "type": event_type,
            "turn_id": turn.id,
            "root_turn_id": turn.root_turn_id,
            "conversation_id": turn.conversation_id or turn.root_conversation_id,
            "tenant_id": turn.tenant_id,
            "timestamp": utcnow(),
            "data": data,
            "cursor": None,
        },
    )


def deliver(ctx: RunnerContext, built: AgentEvent) -> None:
    """Call every listener with the event; a listener that raises is logged and the turn goes on."""
    for listener in list(ctx.listeners):
        try:
            listener(built)
        except Exception:
            logger.exception("event listener %r raised on %s; the turn goes on", listener, built.type)

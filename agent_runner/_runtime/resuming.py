"""Suspending a turn on request, and the decisions that move a waiting turn on: resume commands, deadlines."""

from __future__ import annotations

import logging
from typing import Any

from agent_runner import event_payloads as payloads
from agent_runner import machine
from agent_runner._cas import retry_on_conflict
from agent_runner._runtime import children, pickup
from agent_runner._runtime.context import RunnerContext
from agent_runner._runtime.saving import save, suspended_event
from agent_runner.errors import (
    AgentRunnerError,
    DefinitionError,
    InvalidResumeCommand,
    InvalidTransitionError,
    TurnError,
    TurnNotFound,
)
from agent_runner.limits import InputLimits, check_id, check_json, check_metadata, check_reference, check_text
from agent_runner.persistence import DeadlineSource
from agent_runner.snapshot import AgentTurn, AgentTurnStatus
from agent_runner.suspensions import AgentResumeCommand, AgentSuspension, ResumeType

logger = logging.getLogger("agent_runner")


DEADLINE_BATCH = 500
"""Most turns one deadline sweep handles (`AgentRunner.apply_due_deadlines`)."""


def suspend(ctx: RunnerContext, turn: AgentTurn, suspension: AgentSuspension) -> AgentTurn:
    """Suspend a READY or RUNNING turn with a custom suspension (see `AgentRunner.suspend`).

    Raises:
        InvalidTransitionError: The turn is not READY or RUNNING.
        TurnError: A tool call of the turn is unanswered.
    """
    if turn.status not in (AgentTurnStatus.READY, AgentTurnStatus.RUNNING):
        raise InvalidTransitionError(
            turn.status, machine.SUSPENSION_STATUS[suspension.type], {AgentTurnStatus.READY, AgentTurnStatus.RUNNING}
        )
    if turn.pending_tool_calls:
        # A user message cannot sit between a tool call and its result: the model API
        # would reject the history. Suspend before the model step or after the tools ran.
        raise TurnError(
            f"turn {turn.id!r} has {len(turn.pending_tool_calls)} unanswered tool call(s); "
            "it can be suspended only when no tool call is pending"
        )
    suspended = machine.apply_suspension(turn, machine.Suspend(suspension, None), ctx.clock(), count_step=False)
    return save(ctx, suspended, turn.version, suspended_event(ctx, suspended))


def apply_resume(ctx: RunnerContext, turn_id: str, command: AgentResumeCommand) -> AgentTurn:
    """Validate `command` against the turn and save its effect; return the newest snapshot.

    Raises:
        InvalidResumeCommand: The command does not fit the turn's suspension; nothing changed.
    """
    _check_resume_input(ctx.policy.limits, turn_id, command)
    if command.type is ResumeType.CHILD_COMPLETED:
        turn = ctx.turn_store.load(turn_id)
        try:
            child = ctx.turn_store.load(command.child_turn_id) if command.child_turn_id else None
        except TurnNotFound:
            child = None  # an unknown child id makes the command invalid; the turn itself exists
        if child is None or child.parent_turn_id != turn_id:
            raise InvalidResumeCommand(
                f"turn {command.child_turn_id!r} is not a child of turn {turn_id!r}", turn_id=turn_id
            )
        machine.apply_resume(turn, command, ctx.clock(), child=child)  # validate before writing
        recorded = children.record(ctx, turn_id, child)
        return recorded if recorded is not None else ctx.turn_store.load(turn_id)
    event = payloads.turn_resumed(
        command=command.type, tool_call_id=command.tool_call_id, reason=command.reason, metadata=command.metadata
    )

    from_cache = True

    def attempt() -> AgentTurn:
        nonlocal from_cache
        # Re-validated against the newest snapshot each time: a concurrent decision wins once.
        # The first attempt may start from the store's cached snapshot: if the turn moved on
        # since, the save is refused and the next attempt loads it (see `pickup`).
        turn = pickup.cached(ctx.turn_store, turn_id) if from_cache else None
        from_cache = False
        if turn is not None:
            try:
                return _resume(ctx, turn, command, event)
            except InvalidResumeCommand:
                pass  # the command may fit the stored snapshot: decide on that one
        return _resume(ctx, ctx.turn_store.load(turn_id), command, event)

    return retry_on_conflict(turn_id, attempt)


def _resume(ctx: RunnerContext, turn: AgentTurn, command: AgentResumeCommand, event: payloads.EventBody) -> AgentTurn:
    """Apply `command` to `turn` and save the result over `turn`'s version."""
    schema = _edited_tool_schema(ctx, turn, command)
    return save(ctx, machine.apply_resume(turn, command, ctx.clock(), edit_schema=schema), turn.version, event)


def _check_resume_input(limits: InputLimits, turn_id: object, command: AgentResumeCommand) -> None:
    """Check a resume command and the turn id it names, before the turn is loaded.

    Raises:
        InputLimitError: A value over its limit, or a turn id outside the id rules.
        InvalidTextError: Text that cannot be stored.
    """
    check_id(turn_id, "turn_id", limits)
    if command.tool_call_id is not None:
        check_reference(command.tool_call_id, "tool_call_id", limits)
    if command.child_turn_id is not None:
        check_id(command.child_turn_id, "child_turn_id", limits)
    if command.content is not None:
        check_text(command.content, "content", limits.max_message_bytes)
    if command.reason is not None:
        check_text(command.reason, "reason", limits.max_message_bytes)
    if command.data is not None:
        check_json(command.data, "form data", max_bytes=limits.max_form_data_bytes, max_depth=limits.max_json_depth)
    check_metadata(limits, command.metadata, "resume metadata")


def _edited_tool_schema(ctx: RunnerContext, turn: AgentTurn, command: AgentResumeCommand) -> dict[str, Any] | None:
    """The argument schema of the tool an EDIT_TOOL command edits (None for other commands or no such tool)."""
    if command.type is not ResumeType.EDIT_TOOL:
        return None
    call = next((c for c in turn.pending_tool_calls if c.id == command.tool_call_id), None)
    tool = None if call is None else ctx.agent_for(turn).tool(call.name)
    return None if tool is None else dict(tool.parameters)


def submit_resume(ctx: RunnerContext, turn_id: str, command: AgentResumeCommand) -> AgentTurn:
    """Apply `command` and hand the turn on if that made it runnable (see `AgentRunner.submit_resume`)."""
    turn = apply_resume(ctx, turn_id, command)
    if turn.is_runnable(ctx.clock()):
        ctx.execution.dispatch(turn)
    return turn


def apply_deadline(ctx: RunnerContext, turn_id: str) -> AgentTurn:
    """Send the reminder or apply the default of a waiting turn's deadline (see `AgentRunner.apply_deadline`)."""
    due: list[AgentSuspension] = []

    def attempt() -> AgentTurn:
        turn = ctx.turn_store.load(turn_id)
        suspension = turn.suspension
        now = ctx.clock()
        if suspension is None or turn.wake_at is None or suspension.deadline is None or turn.wake_at > now:
            return turn
        if suspension.deadline <= now:
            due.append(suspension)
            return turn
        reminded = machine.apply_reminder(turn, now)
        return save(ctx, reminded, turn.version, payloads.deadline_approaching(suspension))

    turn = retry_on_conflict(turn_id, attempt)
    if not due:
        return turn
    command = AgentResumeCommand.deadline_passed(due[0].correlation_id).with_metadata(
        "decided_by", machine.SYSTEM_DECIDER
    )
    try:
        return submit_resume(ctx, turn_id, command)
    except InvalidResumeCommand:
        return ctx.turn_store.load(turn_id)  # decided (or cancelled) meanwhile: that decision stands


def apply_due_deadlines(ctx: RunnerContext, limit: int) -> int:
    """Handle up to `limit` turns whose deadline or reminder is due; return how many were handled.

    Raises:
        DefinitionError: The turn store cannot list due deadlines (it is not a `DeadlineSource`).
        StoreError: The store could not list them.
    """
    source = ctx.turn_store
    if not isinstance(source, DeadlineSource):
        raise DefinitionError(
            f"the turn store {type(source).__name__} cannot list due deadlines (it has no list_due_timers)"
        )
    handled = 0
    for ref in source.list_due_timers(ctx.clock(), limit):
        try:
            apply_deadline(ctx, ref.turn_id)
            handled += 1
        except AgentRunnerError as exc:
            logger.warning("could not apply the deadline of turn %s: %s", ref.turn_id, exc)
    return handled

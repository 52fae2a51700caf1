"""How turns end: closing out, cancelling, failing a call on the retry schedule, counting steps that raised.

An ended turn cascades: its unfinished children are cancelled, its conversation is freed
in the guard, and a child tells its parent (unless the thread stepping it does so when its
loop is over).
"""

from __future__ import annotations

import logging

from agent_runner import event_payloads as payloads
from agent_runner import machine
from agent_runner._cas import AGAIN, retry_on_conflict
from agent_runner._runtime import children, steering
from agent_runner._runtime.cancelling import request_cancel
from agent_runner._runtime.context import RunnerContext
from agent_runner._runtime.reentry import is_driving
from agent_runner._runtime.saving import save, terminal_event
from agent_runner._runtime.waiting import abandon_calls
from agent_runner.errors import AgentRunnerError, VersionConflictError
from agent_runner.limits import check_id, check_text
from agent_runner.policy import RetryPolicy
from agent_runner.results import AgentStepResult
from agent_runner.snapshot import AgentTurn, AgentTurnStatus

logger = logging.getLogger("agent_runner")


def finish(
    ctx: RunnerContext,
    turn: AgentTurn,
    status: AgentTurnStatus,
    reason: str,
    *,
    expected_version: int | None = None,
    steps: int | None = None,
    decided_by: str | None = None,
) -> AgentTurn:
    """Close out and save a terminal snapshot, then cascade to children, guard and parent."""
    expected = turn.version if expected_version is None else expected_version
    ended = machine.close_out(turn, status, reason, ctx.policy, ctx.clock(), decided_by)
    if steps is not None:
        ended = ended.model_copy(update={"steps": steps})
    saved = save(ctx, ended, expected, terminal_event(ended))
    after_terminal(ctx, saved)
    return saved


def after_terminal(ctx: RunnerContext, turn: AgentTurn) -> None:
    """The cascade of a turn that has just been saved ended."""
    cancel_unfinished_children(ctx, turn)
    if turn.tool_state:
        abandon_calls(ctx, turn)
    ctx.gate.release(turn)
    # After the release: messages the turn ended without may start the conversation's next turn.
    steering.hand_on(ctx, turn)
    if turn.parent_turn_id is not None and not is_driving(ctx, turn.id):
        # A child that ended outside a stepping loop (cancelled, resumed elsewhere) tells its parent now.
        child_ended(ctx, turn)


def child_ended(ctx: RunnerContext, child: AgentTurn) -> None:
    """Record an ended child in its parent; the save that records the last child resumes the parent."""
    assert child.parent_turn_id is not None
    parent = children.record(ctx, child.parent_turn_id, child)
    if parent is not None and parent.is_runnable(ctx.clock()):
        ctx.execution.parent_resumed(parent)


def cancel_unfinished_children(ctx: RunnerContext, parent: AgentTurn) -> None:
    """Cancel the children of an ended parent that have not ended."""
    reason = parent.error or ctx.policy.cancellation_reason
    for link in parent.children:
        if link.status is None:
            cancel_quietly(ctx, link.child_turn_id, reason)


def cancel(ctx: RunnerContext, turn_id: str, reason: str | None, cancelled_by: str | None = None) -> AgentTurn:
    """Cancel a turn and its children (see `AgentRunner.cancel`)."""
    check_id(turn_id, "turn_id", ctx.policy.limits)
    if reason is not None:
        check_text(reason, "reason", ctx.policy.limits.max_message_bytes)
    given = reason or None

    def attempt() -> AgentTurn | object:
        turn = ctx.turn_store.load(turn_id)
        if turn.is_terminal:
            return turn
        if turn.status is AgentTurnStatus.RUNNING:
            flagged = request_cancel(ctx.turn_store, turn_id, given)
            # It blocked or ended meanwhile: cancel that state instead.
            return flagged if flagged.status is AgentTurnStatus.RUNNING else AGAIN
        # A turn flagged while it ran and then suspended ends with the flag's reason.
        reason = given or turn.cancel_reason or ctx.policy.cancellation_reason
        return finish(ctx, turn, AgentTurnStatus.CANCELLED, reason, decided_by=cancelled_by)

    return retry_on_conflict(turn_id, attempt)  # type: ignore[return-value]


def cancel_quietly(ctx: RunnerContext, turn_id: str, reason: str | None = None) -> AgentTurn | None:
    """Cancel a turn; a failure is logged (the turn then ends by a later cancel or a sweep)."""
    try:
        return cancel(ctx, turn_id, reason)
    except AgentRunnerError as exc:
        logger.warning("could not cancel turn %s: %s", turn_id, exc)
        return None


def failed_call(
    ctx: RunnerContext,
    turn: AgentTurn,
    exc: Exception,
    expected: int,
    retry: RetryPolicy,
    retry_on: tuple[type[BaseException], ...] = (),
) -> AgentStepResult:
    """A model or tool call raised: retry later if transient and attempts remain, else fail."""
    if isinstance(exc, VersionConflictError):
        raise exc
    description = f"{type(exc).__name__}: {exc}"
    delay = retry.delay_after(exc, turn.attempt + 1, retry_on)
    if delay is not None:
        scheduled = machine.schedule_retry(turn, description, delay, retry, ctx.clock())
        if scheduled is not None:
            saved = save(ctx, scheduled, expected, payloads.retry_scheduled(scheduled, description))
            ctx.execution.dispatch(saved)
            return AgentStepResult(turn=saved, error=exc)
        description = f"gave up after {turn.attempt + 1} attempts: {description}"
    failed = finish(ctx, turn, AgentTurnStatus.FAILED, description, expected_version=expected, steps=turn.steps + 1)
    return AgentStepResult(turn=failed, error=exc)


def step_failed(ctx: RunnerContext, turn: AgentTurn, exc: Exception) -> AgentTurn:
    """Count a step that raised; end the turn FAILED when that makes too many in a row.

    Transient store and lease errors are not the turn's fault and are not counted; nor
    can anything be counted while the store is unreachable. Returns the newest snapshot.
    """
    if isinstance(exc, AgentRunnerError) and exc.retryable:
        return turn
    description = f"{type(exc).__name__}: {exc}"
    try:
        # The step may have saved before it raised (a READY turn is saved RUNNING first):
        # count on the stored snapshot, under the caller's fence.
        current = ctx.turn_store.load(turn.id)
        if current.is_terminal:
            return current
        current = current.model_copy(update={"lease_fence": turn.lease_fence})
        failures = current.step_failures + 1
        if failures >= ctx.policy.max_step_failures:
            logger.error("turn %s failed %d steps in a row; ending it: %s", turn.id, failures, description)
            reason = f"a step failed {failures} times in a row: {description}"
            return finish(ctx, current, AgentTurnStatus.FAILED, reason[:2000])
        return ctx.turn_store.save(current.model_copy(update={"step_failures": failures}), current.version)
    except AgentRunnerError as error:
        logger.warning("could not count the failed step of turn %s: %s", turn.id, error)
        return turn

"""The stepping core: advance one turn under a lease until it blocks or a budget runs out.

Every path that moves a turn forward comes through `step_until_stopped`: `run_until_blocked` (and so
`AgentRunner.run` and `resume`), the embedded `AgentWorker`, and the Celery `step_turn` task.
The rules live here once:

- the first step may be a retry that has come due; after it only READY and RUNNING turns
  go on, so a retry scheduled during the run waits for its time instead of running at once
  (and a turn that keeps failing is not retried in a tight loop under one lease); a READY
  turn started with a delay takes no step before its `starts_at`;
- a step starts only while the caller's lease is safe (`may_continue`), within the step and
  time budgets;
- every save carries the lease's fencing number, so a holder whose lease was taken over has
  its saves refused instead of overwriting newer work;
- a step that raises an unexpected exception is counted in the snapshot, and the turn ends
  FAILED after `AgentExecutionPolicy.max_step_failures` such steps in a row, so a poison turn
  (a bug, a model response that cannot be saved) is not retried, and billed, for ever;
- a cancel flag found on a turn that blocked (the cancel came while its last step ran) ends
  it here, since no poll would find a waiting turn again;
- a holder that takes a RUNNING turn over from holders that died without saving anything
  records it (TURN_RECOVERING), and past `AgentExecutionPolicy.max_recoveries` such
  takeovers in a row the turn ends FAILED (see `agent_runner._runtime.recovery`);
- a child turn that ended tells its parent once the loop is over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agent_runner._runtime import recovery
from agent_runner._runtime.context import RunnerContext
from agent_runner._runtime.endings import cancel_quietly, child_ended, step_failed
from agent_runner._runtime.executing import step
from agent_runner._runtime.reentry import driving
from agent_runner.errors import LeaseLostError, VersionConflictError
from agent_runner.results import AdvanceResult, StopReason
from agent_runner.snapshot import RUNNABLE_STATUSES, AgentTurn, AgentTurnStatus

logger = logging.getLogger("agent_runner")


def _always() -> bool:
    return True


def _fenced(turn: AgentTurn, fence: int | None) -> AgentTurn:
    """`turn` to save under `fence`; after the first save it already carries it (no copy then)."""
    if fence is None or turn.lease_fence == fence:
        return turn
    return turn.model_copy(update={"lease_fence": fence})


def step_until_stopped(
    ctx: RunnerContext,
    turn: AgentTurn,
    *,
    fence: int | None = None,
    max_steps: int | None = None,
    deadline: float | None = None,
    may_continue: Callable[[], bool] | None = None,
) -> AdvanceResult:
    """Step `turn` until it blocks or ends, or a budget or the lease runs out (see the module docstring)."""
    may_continue = may_continue or _always
    clock = ctx.clock
    steps = 0
    first = True
    error: Exception | None = None
    with driving(ctx, turn.id):
        if fence is not None and recovery.is_takeover(turn, fence):
            try:
                turn = recovery.take_over(ctx, turn, fence)
            except LeaseLostError as exc:
                return AdvanceResult(turn=turn, steps=0, stopped=StopReason.LEASE_LOST, error=exc)
            except VersionConflictError as exc:
                return AdvanceResult(turn=ctx.turn_store.load(turn.id), steps=0, stopped=StopReason.CONFLICT, error=exc)
        while True:
            if turn.cancel_requested and not turn.is_terminal and not turn.is_runnable(clock()):
                turn = cancel_quietly(ctx, turn.id) or turn
                stopped = StopReason.ENDED if turn.is_terminal else StopReason.BLOCKED
                break
            if not (turn.is_runnable(clock()) and (first or turn.status in RUNNABLE_STATUSES)):
                stopped = StopReason.ENDED if turn.is_terminal else StopReason.BLOCKED
                break
            if (max_steps is not None and steps >= max_steps) or (
                deadline is not None and steps > 0 and time.monotonic() > deadline
            ):
                stopped = StopReason.BUDGET
                break
            if not may_continue():
                stopped = StopReason.STOPPED
                break
            first = False
            try:
                result = step(ctx, _fenced(turn, fence))
            except LeaseLostError as exc:
                logger.warning("turn %s moved on under a newer lease; leaving it", turn.id)
                stopped, error = StopReason.LEASE_LOST, exc
                break
            except Exception as exc:
                # Every save is atomic: the turn stays as last saved, and the caller decides
                # when it is tried again, unless it failed this way too often in a row.
                stopped, error = StopReason.FAILED, exc
                turn = step_failed(ctx, _fenced(turn, fence), exc)
                if turn.is_terminal:
                    stopped = StopReason.ENDED
                break
            turn = result.turn
            if isinstance(result.error, VersionConflictError):
                stopped = StopReason.CONFLICT
                break
            steps += 1
            if turn.status is AgentTurnStatus.WAITING_FOR_CHILD:
                turn = ctx.execution.children_waiting(turn)
    if turn.is_terminal and turn.parent_turn_id is not None:
        child_ended(ctx, turn)
    return AdvanceResult(turn=turn, steps=steps, stopped=stopped, error=error)


def run_until_blocked(ctx: RunnerContext, turn: AgentTurn) -> AgentTurn:
    """Step the turn in this thread until it waits or ends (see `AgentRunner.run_until_blocked`)."""
    scope = ctx.lease_scope
    if scope is None or not turn.is_runnable(ctx.clock()):
        return _raise_failure(step_until_stopped(ctx, turn))
    # Workers poll the store for READY and RUNNING turns: stepping here without the
    # lease could call the model or a tool twice, once here and once on a worker.
    with scope(turn.id) as held:
        if held is None:
            return ctx.turn_store.load(turn.id)
        # The snapshot passed in may predate a holder that worked on the turn while this
        # thread waited for the lease, or a cancel requested meanwhile (it keeps the
        # version): continue from the stored one, under our fence.
        current = ctx.turn_store.load(turn.id)
        return _raise_failure(step_until_stopped(ctx, current, fence=held.fence))


def _raise_failure(result: AdvanceResult) -> AgentTurn:
    """The turn of an in-thread run; a step's exception reaches the caller, as from any call."""
    if result.error is not None and result.stopped in (StopReason.FAILED, StopReason.LEASE_LOST):
        raise result.error
    return result.turn

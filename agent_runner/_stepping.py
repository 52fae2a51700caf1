"""The stepping core: advance one turn under a lease until it blocks or a budget runs out.

Every path that moves a turn forward comes through `advance`: `AgentRunner.run_until_blocked`
(and so `run` and `resume`), the embedded `AgentWorker`, and the Celery `step_turn` task.
The rules live here once:

- the first step may be a retry that has come due; after it only READY and RUNNING turns
  go on, so a retry scheduled during the run waits for its time instead of running at once
  (and a turn that keeps failing is not retried in a tight loop under one lease);
- a step starts only while the caller's lease is safe (`may_continue`), within the step and
  time budgets;
- every save carries the lease's fencing number, so a holder whose lease was taken over has
  its saves refused instead of overwriting newer work;
- a step that raises an unexpected exception is counted in the snapshot, and the turn ends
  FAILED after `AgentExecutionPolicy.max_step_failures` such steps in a row, so a poison turn
  (a bug, a model response that cannot be saved) is not retried, and billed, for ever;
- a cancel flag found on a turn that blocked (the cancel came while its last step ran) ends
  it here, since no poll would find a waiting turn again;
- a child turn that ended tells its parent once the loop is over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from agent_runner.errors import LeaseLostError, VersionConflictError
from agent_runner.snapshot import RUNNABLE_STATUSES, AgentTurn, AgentTurnStatus

if TYPE_CHECKING:
    from agent_runner.runner import AgentRunner

logger = logging.getLogger("agent_runner")


class StopReason(StrEnum):
    """Why `AgentRunner.advance` stopped stepping a turn."""

    BLOCKED = "blocked"
    """The turn waits for a person, child turns or its retry time."""
    ENDED = "ended"
    """The turn reached a terminal status."""
    BUDGET = "budget"
    """The step or time budget ran out; the turn is still runnable."""
    STOPPED = "stopped"
    """`may_continue` said no: the lease is no longer safely held, or the worker is stopping."""
    LEASE_LOST = "lease-lost"
    """A save was refused by the fence: another holder has taken the turn over."""
    CONFLICT = "conflict"
    """Someone else saved the turn first (a resume, a cancel); the result holds their snapshot."""
    FAILED = "failed"
    """A step raised; the turn stays as last saved (with the failure counted) and `error`
    holds the exception. When that failure was one too many, the turn has ended FAILED and
    the reason is ENDED instead, with `error` still set."""


@dataclass(frozen=True)
class AdvanceResult:
    """What one `AgentRunner.advance` call did.

    Attributes:
        turn: The newest snapshot known after the last step.
        steps: Steps that saved a new snapshot.
        stopped: Why stepping stopped.
        error: The exception behind FAILED and LEASE_LOST, else None.
    """

    turn: AgentTurn
    steps: int
    stopped: StopReason
    error: Exception | None = None


def _always() -> bool:
    return True


def _fenced(turn: AgentTurn, fence: int | None) -> AgentTurn:
    """`turn` to save under `fence`; after the first save it already carries it (no copy then)."""
    if fence is None or turn.lease_fence == fence:
        return turn
    return turn.model_copy(update={"lease_fence": fence})


def advance(
    runner: AgentRunner,
    turn: AgentTurn,
    *,
    fence: int | None = None,
    max_steps: int | None = None,
    deadline: float | None = None,
    may_continue: Callable[[], bool] = _always,
) -> AdvanceResult:
    """Step `turn` until it blocks or ends, or a budget or the lease runs out (see the module docstring)."""
    clock = runner.clock
    steps = 0
    first = True
    error: Exception | None = None
    with runner._driving(turn.id):
        while True:
            if turn.cancel_requested and not turn.is_terminal and not turn.is_runnable(clock()):
                turn = runner._cancel_quietly(turn.id) or turn
                stopped = StopReason.ENDED if turn.is_terminal else StopReason.BLOCKED
                break
            if not (turn.status in RUNNABLE_STATUSES or (first and turn.is_runnable(clock()))):
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
                result = runner.step(_fenced(turn, fence))
            except LeaseLostError as exc:
                logger.warning("turn %s moved on under a newer lease; leaving it", turn.id)
                stopped, error = StopReason.LEASE_LOST, exc
                break
            except Exception as exc:
                # Every save is atomic: the turn stays as last saved, and the caller decides
                # when it is tried again, unless it failed this way too often in a row.
                stopped, error = StopReason.FAILED, exc
                turn = runner._step_failed(_fenced(turn, fence), exc)
                if turn.is_terminal:
                    stopped = StopReason.ENDED
                break
            turn = result.turn
            if isinstance(result.error, VersionConflictError):
                stopped = StopReason.CONFLICT
                break
            steps += 1
            if turn.status is AgentTurnStatus.WAITING_FOR_CHILD:
                turn = runner._execution.children_waiting(turn)
    if turn.is_terminal and turn.parent_turn_id is not None:
        runner._children.child_ended(turn)
    return AdvanceResult(turn=turn, steps=steps, stopped=stopped, error=error)

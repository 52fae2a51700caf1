"""One delivery of a turn: lease, pick-up, the checks, `advance` under the fence, release, follow-up.

The Celery `step_turn` task and the embedded `AgentWorker` deliver turns the same way; what
differs between them (how the lease is held and renewed, the step budget, what happens next,
their telemetry) comes in as a `TurnHolder`. Every broker here delivers at least once, and a
worker's poll may find a turn another holder is on, so a delivery is idempotent:

1. Take the turn's lease. Held elsewhere: do nothing (that holder checks the turn again once it
   lets go, and a dead holder's lease expires into the sweeps or the next poll).
2. Pick the snapshot up: the store's cached one when it is safe (`pickup`), else a load. A
   version other than the delivered one (a stale or duplicate message), or a turn that waits,
   has ended, or is a retry or delayed start whose time has not come: do nothing. A waiting
   turn flagged for cancel is stepped, which ends it.
3. `advance` it within the holder's budget, each save stamped with the lease's fence, while the
   holder's `may_step` allows (a lost lease, a stopping worker).
4. Release the lease, then hand the holder's follow-up what was done.
"""

from __future__ import annotations

import logging
import time

from agent_runner._runtime import pickup, stepping
from agent_runner._runtime.context import RunnerContext
from agent_runner.errors import TurnNotFound, log_failure
from agent_runner.leasing import HeldLease, TurnHolder
from agent_runner.results import AdvanceResult, Delivery, DeliveryOutcome, StopReason
from agent_runner.snapshot import SCHEDULED_STATUSES, AgentTurn

logger = logging.getLogger("agent_runner.delivery")


def deliver(
    ctx: RunnerContext,
    turn_id: str,
    holder: TurnHolder,
    *,
    version: int | None = None,
    seen: pickup.Sighting | None = None,
) -> Delivery:
    """Deliver the turn to `holder` (see the module docstring); `version`: the only version to step (None: any)."""
    with holder.hold(turn_id) as held:
        if held is None:
            delivery = Delivery(turn_id, DeliveryOutcome.LEASE_HELD)
        else:
            delivery = _under_lease(ctx, turn_id, holder, held, version, seen)
    if holder.then is not None:
        holder.then(delivery)
    return delivery


def _under_lease(
    ctx: RunnerContext,
    turn_id: str,
    holder: TurnHolder,
    held: HeldLease,
    version: int | None,
    seen: pickup.Sighting | None,
) -> Delivery:
    now = ctx.clock()
    try:
        turn, from_cache = pickup.under_lease(ctx.turn_store, turn_id, seen, held.fence, now)
    except TurnNotFound:
        return Delivery(turn_id, DeliveryOutcome.NOT_FOUND)
    if version is not None and turn.version != version:
        return Delivery(turn_id, DeliveryOutcome.STALE, turn)
    if holder.picked_up is not None:
        holder.picked_up(turn)
    if not turn.is_runnable(now) and not (turn.cancel_requested and not turn.is_terminal):
        waiting = DeliveryOutcome.NOT_DUE if turn.status in SCHEDULED_STATUSES else DeliveryOutcome.NOT_RUNNABLE
        return Delivery(turn_id, waiting, turn)
    deadline = None if holder.seconds is None else time.monotonic() + holder.seconds

    def step(start: AgentTurn) -> AdvanceResult:
        return stepping.step_until_stopped(
            ctx,
            start,
            fence=held.fence,
            max_steps=holder.max_steps,
            deadline=deadline,
            may_continue=lambda: holder.may_step(held),
        )

    result = pickup.continue_after_stale(step(turn), from_cache, step)
    if result.stopped is StopReason.FAILED:
        # Every save is atomic: the turn stays as last saved, and the holder's follow-up
        # decides when it is tried again.
        log_failure(logger, result.error, "a step of turn %s failed; it stays as last saved", turn_id)
    return Delivery(turn_id, DeliveryOutcome.STEPPED, result.turn, result, lease_lost=held.lost)

"""The recovery budget: a turn whose workers keep dying on it ends instead of being taken over for ever.

Every lease acquisition hands out the next fence, and every save is stamped with the fence
of its holder. A holder that picks up a RUNNING turn therefore knows, without any save of
its own, whether a holder came between it and the last save: when the turn's `lease_fence`
is more than one below its own, the holders in between took the lease and saved nothing,
the mark of a process that died (a tool that kills it, an out-of-memory model answer) or
lost its lease mid-step. Such a pickup is a takeover: it is saved with TURN_RECOVERING and
counted in the snapshot (`recoveries`), and the save itself is recognized by the next
holder, so a turn whose every holder dies right after its pickup counts each of them.

The count restarts when the turn makes progress (its `steps` grow). Past the policy's
`max_recoveries` the turn ends FAILED with the usual close-out, its output so far kept as
`final_output`. The first death after progress is not seen (its holder saved that
progress); the count starts with the second.
"""

from __future__ import annotations

import logging

from agent_runner import event_payloads as payloads
from agent_runner._runtime.context import RunnerContext
from agent_runner._runtime.endings import finish
from agent_runner._runtime.saving import save
from agent_runner.messages import AiMessage, UserMessage
from agent_runner.snapshot import AgentTurn, AgentTurnStatus

logger = logging.getLogger("agent_runner")

RESEEDED_GAP = 1000
"""A fence gap larger than this is a reseeded counter (Redis seeds a lost one from its clock in
microseconds), not holders that died: a thousand acquisitions without a save do not happen."""


def is_takeover(turn: AgentTurn, fence: int) -> bool:
    """Whether the holder of `fence`, picking up `turn`, takes it over from holders that died without a save."""
    if turn.status is not AgentTurnStatus.RUNNING or turn.lease_fence is None or fence <= turn.lease_fence:
        return False
    if fence - turn.lease_fence > RESEEDED_GAP:
        # The lease backend lost its counters (a Redis flush) and seeded new fences from its
        # clock: the gap says nothing about holders that died, and the last one may live on.
        return False
    if turn.lease_fence < fence - 1:
        return True
    # The last holder saved, but only its own takeover: it died right after the pickup.
    return turn.lease_fence == turn.recovery_fence and turn.steps == turn.recovery_steps


def take_over(ctx: RunnerContext, turn: AgentTurn, fence: int) -> AgentTurn:
    """Record a takeover of `turn` by the holder of `fence`, or end the turn past the budget; return the saved snapshot.

    Raises:
        VersionConflictError, LeaseLostError: The turn moved on meanwhile; nothing was saved.
    """
    limit = ctx.policy.max_recoveries
    recoveries = (turn.recoveries if turn.steps == turn.recovery_steps else 0) + 1
    marked = turn.model_copy(
        update={
            "recoveries": recoveries,
            "recovery_fence": fence,
            "recovery_steps": turn.steps,
            "lease_fence": fence,
            "updated_at": ctx.clock(),
        }
    )
    if recoveries > limit:
        logger.error("turn %s was taken over %d times in a row without progress; ending it", turn.id, recoveries)
        reason = f"the turn's workers stopped {recoveries} times in a row without progress (recovery budget {limit})"
        # The close-out keeps what the turn produced so far as its output.
        kept = marked.model_copy(update={"final_output": partial_output(marked)})
        return finish(ctx, kept, AgentTurnStatus.FAILED, reason)
    logger.warning("turn %s taken over (%d of %d in a row without progress)", turn.id, recoveries, limit)
    return save(ctx, marked, turn.version, payloads.turn_recovering(recoveries, limit))


def partial_output(turn: AgentTurn) -> str | None:
    """The turn's output so far: the text of its model's last answer after the newest user message, if any."""
    for message in reversed(turn.messages):
        if isinstance(message, UserMessage):
            return None
        if isinstance(message, AiMessage) and message.content:
            return message.content
    return None

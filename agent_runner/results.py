"""What stepping a turn returns: `AgentStepResult` of one step, `AdvanceResult` and `StopReason` of a run of steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from agent_runner.messages import ToolMessage
from agent_runner.models import ChatResponse
from agent_runner.snapshot import AgentTurn


@dataclass(frozen=True)
class AgentStepResult:
    """What one step produced directly. Read `turn.status` to know whether the turn goes on.

    Attributes:
        response: The model response of this step (None when the model was not called).
        tool_messages: ToolMessages written by this step.
        error: The exception behind a retry or failure in this step, else None.
        turn: The snapshot after the step.
    """

    turn: AgentTurn
    response: ChatResponse | None = None
    tool_messages: list[ToolMessage] = field(default_factory=list)
    error: BaseException | None = None


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


class DeliveryOutcome(StrEnum):
    """What one delivery of a turn to a holder did (`AgentRunner.deliver`)."""

    STEPPED = "stepped"
    """The turn was advanced; `Delivery.result` says how far."""
    LEASE_HELD = "lease-held"
    """Someone else holds the turn's lease; that holder checks the turn again once it lets go."""
    STALE = "stale"
    """The stored version is not the one delivered: a duplicate or late delivery."""
    NOT_FOUND = "not-found"
    """No turn has this id."""
    NOT_RUNNABLE = "not-runnable"
    """The turn waits or has ended."""
    NOT_DUE = "not-due"
    """A retry or a delayed start whose time has not come."""
    REJECTED = "rejected"
    """The delivery's arguments did not fit (a forged or corrupted message); it was dropped unread."""


@dataclass(frozen=True)
class Delivery:
    """What one delivery of a turn did, handed to the holder's follow-up once the lease is released.

    Attributes:
        turn_id: The delivered turn.
        outcome: What happened.
        turn: The newest snapshot the delivery saw (None when it read none).
        result: The `advance` of a STEPPED delivery, else None.
        lease_lost: The lease was taken over while the turn was stepped.
    """

    turn_id: str
    outcome: DeliveryOutcome
    turn: AgentTurn | None = None
    result: AdvanceResult | None = None
    lease_lost: bool = False

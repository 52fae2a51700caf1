"""Shared model limits around one model call: ask the limiter first, and wait without a thread when it says no.

A call against a limited key (the `rate_limit_key` of a `LimitedChatModel`, named in the
runner's `ModelLimiter`) asks for capacity before it is sent. No capacity means the turn is saved
RETRY_SCHEDULED until the limiter's answer (plus a little jitter, so waiting turns do not
return as one wave), with a RETRY_SCHEDULED event naming the key and the reason; no retry
attempt is used and no thread waits. A provider's 429 on a limited key pauses the key for
every process and the turn waits the same way, up to `RetryPolicy.max_provider_limit_waits`
429s in a row; past them (and once the call has failed an attempt for any reason) a 429 is an
ordinary failed attempt, so a key the provider refuses for good (an exhausted quota answers
429 too) still ends its turns.

The runner gates the call through a `CallGate` (`ChatRequest.limits`), which a chat model
that calls other models (`FallbackChatModel`) uses for each of them, so each is counted and
paused under its own key.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agent_runner import event_payloads as payloads
from agent_runner import machine
from agent_runner._runtime.context import RunnerContext
from agent_runner._runtime.saving import save
from agent_runner.errors import RecoverableError, StoreError
from agent_runner.ids import new_id
from agent_runner.model_limits import LimitGrant, LimitReason, LimitWait, ModelLimiter, estimate_tokens
from agent_runner.policy import RetryPolicy
from agent_runner.results import AgentStepResult
from agent_runner.snapshot import AgentTurn
from agent_runner.suspensions import AgentSuspension
from agent_runner.usage import Usage

logger = logging.getLogger("agent_runner")

BOOKED_JITTER_S = 0.05
"""Most added to the due time of a call that holds a slot: it must never come back early, and late costs little."""
SPREAD_JITTER = 0.2
"""Fraction of the wait added at random to other waits (every slot taken, a pause), which many turns share."""
UNAVAILABLE_WAIT_S = 1.0
"""How long a call waits when the limiter's state could not be reached."""
_BOOKED = (LimitReason.RPM, LimitReason.TPM, LimitReason.SLOT)


@dataclass(frozen=True)
class Admission:
    """A call granted by the limiter, to settle when it returns."""

    limiter: ModelLimiter
    grant: LimitGrant


class LimitWaitError(Exception):
    """Raised through a chat model call that must wait for a shared limit: the runner saves the turn waiting."""

    def __init__(self, limit_wait: LimitWait) -> None:
        super().__init__(f"waiting for model limit {limit_wait.key!r}")
        self.limit_wait = limit_wait


@dataclass(frozen=True)
class Refusal:
    """A limited call that answered 429: its key is paused until `until`, the `waits`-th 429 in a row."""

    key: str
    until: datetime
    waits: int
    error: BaseException


class CallGate:
    """`ChatRequest.limits` of one step's model call: each model called is admitted, settled and paused under its own key.

    Made by `gate`; see `agent_runner.models.ModelCallGate` for the contract.
    """

    def __init__(
        self,
        ctx: RunnerContext,
        turn: AgentTurn,
        limiter: ModelLimiter,
        parts: list[Any],
        previous: AgentSuspension | None,
        retry: RetryPolicy,
    ) -> None:
        self._ctx, self._turn, self._limiter, self._parts = ctx, turn, limiter, parts
        self.previous, self._retry = previous, retry
        """The suspension the turn resumed from."""
        self._admitted: dict[int, Admission] = {}
        self._skipped: list[LimitWait] = []
        self.called = False
        """Whether a model was called in this step (a wait after that counts as a step)."""
        self.refusal: Refusal | None = None
        """The latest 429 met on a limited key, its key already paused."""

    def admit(self, model: object, *, fall_over_after: float | None = None) -> bool:
        """Ask `model`'s limit for capacity; False to skip it, `LimitWaitError` to wait (see `ModelCallGate.admit`)."""
        answer = admit(self._ctx, self._turn, model, self._limiter, self._parts, self.previous)
        if answer is None:
            return True
        if isinstance(answer, Admission):
            self._admitted[id(model)] = answer
            return True
        wait_s = (answer.until - self._ctx.clock()).total_seconds()
        if fall_over_after is not None and wait_s > fall_over_after:
            self._skipped.append(answer)
            return False
        # The soonest of the limits met (on a tie, the earlier model's, whose booking the turn then keeps).
        raise LimitWaitError(min([*self._skipped, answer], key=lambda waiting: waiting.until))

    def done(self, model: object, usage: Usage | None, error: BaseException | None) -> None:
        """Settle `model`'s call; a 429 on its key pauses the key in every process (see `ModelCallGate.done`)."""
        if not isinstance(error, LimitWaitError):
            self.called = True
        admission = self._admitted.pop(id(model), None)
        settle(admission, usage)
        if admission is None or not isinstance(error, RecoverableError) or not error.rate_limited:
            return
        key = admission.grant.key
        waits = provider_waits(self.previous, key) + 1
        delay = error.retry_after if error.retry_after is not None else self._retry.backoff(waits)
        until = self._ctx.clock() + timedelta(seconds=delay)
        try:
            admission.limiter.pause(key, until)
        except StoreError as failure:
            logger.warning("could not pause model limit %r for every process: %s", key, failure)
        self.refusal = Refusal(key, until, waits, error)


def gate(
    ctx: RunnerContext,
    turn: AgentTurn,
    messages: list[Any],
    tools: list[Any],
    previous: AgentSuspension | None,
    retry: RetryPolicy,
) -> CallGate | None:
    """The limits of one step's model call (`previous`: the suspension the turn resumed from); None without a limiter."""
    limiter = ctx.model_limiter
    if limiter is None:
        return None
    return CallGate(ctx, turn, limiter, _request_parts(messages, tools), previous, retry)


def admit(
    ctx: RunnerContext,
    turn: AgentTurn,
    model: object,
    limiter: ModelLimiter,
    parts: list[Any],
    previous: AgentSuspension | None,
) -> Admission | LimitWait | None:
    """Ask the limiter for capacity for one call of `model` for `turn` (counted for its tenant); None when it is not limited.

    `parts`: the request's text, to estimate its tokens. `previous`: the suspension the turn
    resumed from, whose booking (a slot kept for this call) is handed back.

    Raises:
        StoreError: The limiter's state refused the request for good (not merely unreachable).
    """
    # Read as attributes rather than by isinstance on the protocol, which costs far more per call.
    key = getattr(model, "rate_limit_key", None)
    if not isinstance(key, str) or limiter.limit_for(key) is None:
        return None
    output_allowance = getattr(model, "output_allowance", None)
    allowance = (output_allowance() if callable(output_allowance) else None) or limiter.default_output_tokens
    tokens = estimate_tokens(parts, allowance)
    booking = _previous(previous, key).get("limit_booking")
    try:
        held = booking if isinstance(booking, str) else None
        answer = limiter.acquire(key, tokens, new_id(), held, turn.tenant_id)
    except StoreError as exc:
        if not exc.retryable:
            raise
        # Never a call past the limit: without the shared state the call waits and asks again.
        logger.warning("the model limiter could not be reached for %r; the call waits: %s", key, exc)
        until = ctx.clock() + timedelta(seconds=UNAVAILABLE_WAIT_S)
        return LimitWait(key, until, LimitReason.UNAVAILABLE, booking if isinstance(booking, str) else None)
    if isinstance(answer, LimitWait):
        return answer
    return Admission(limiter, answer)


def settle(admission: Admission | None, usage: Usage | None) -> None:
    """The call returned (`usage`) or failed (None): count its tokens and free its slot; a failure is logged."""
    if admission is None:
        return
    try:
        if usage is None or not (usage.input_tokens or usage.output_tokens):
            admission.limiter.release(admission.grant)
        else:
            admission.limiter.settle(admission.grant, usage.input_tokens + usage.output_tokens)
    except StoreError as exc:
        # The slot expires by itself and the reservation stays counted: the limit errs on the safe side.
        logger.warning("could not settle a call against model limit %r: %s", admission.grant.key, exc)


def must_wait(
    ctx: RunnerContext, turn: AgentTurn, limits: CallGate | None, waiting: LimitWaitError, expected: int
) -> AgentStepResult:
    """Save the turn waiting for the limit `waiting` names, with the 429s in a row its key met so far."""
    limit_wait = waiting.limit_wait
    previous = limits.previous if limits is not None else None
    waits = provider_waits(previous, limit_wait.key)
    called = limits is not None and limits.called
    return wait(ctx, turn, limit_wait, expected, called=called, provider_waits=waits)


def wait(
    ctx: RunnerContext,
    turn: AgentTurn,
    limit_wait: LimitWait,
    expected: int,
    *,
    called: bool = False,
    provider_waits: int = 0,
    error: str | None = None,
) -> AgentStepResult:
    """Save the turn RETRY_SCHEDULED until the limiter's answer (no attempt used) and hand it on.

    `provider_waits`: the 429s in a row this call met, carried to the next wait.
    """
    now = ctx.clock()
    until = max(limit_wait.until, now)
    spread = BOOKED_JITTER_S if limit_wait.reason in _BOOKED else SPREAD_JITTER * (until - now).total_seconds()
    due = until + timedelta(seconds=random.uniform(0, max(BOOKED_JITTER_S, spread)))
    message = f"waiting for model limit {limit_wait.key!r} ({limit_wait.reason.value}) until {due.isoformat()}"
    if error is not None:
        message = f"{message} after {error}"
    metadata: dict[str, Any] = {
        "limit_key": limit_wait.key,
        "limit_reason": limit_wait.reason.value,
        "limit_booking": limit_wait.booking_id,
        "provider_waits": provider_waits,
    }
    waiting = machine.schedule_limit_wait(turn, message, due, metadata, now, called=called)
    event = payloads.retry_scheduled(waiting, message, limit_key=limit_wait.key, limit_reason=limit_wait.reason)
    saved = save(ctx, waiting, expected, event)
    ctx.execution.dispatch(saved)
    return AgentStepResult(turn=saved)


def provider_refused(
    ctx: RunnerContext, turn: AgentTurn, limits: CallGate | None, exc: Exception, expected: int, retry: RetryPolicy
) -> AgentStepResult | None:
    """The call failed with `exc`: when it was a 429 on a limited key (already paused), wait; None when it counts as a failed attempt.

    It waits without an attempt up to `max_provider_limit_waits` times in a row, and only
    while the call has no failed attempt yet: past the bound the call's attempts begin, and
    from then on each 429 is one of them, so the number of calls stays bounded.
    """
    refusal = limits.refusal if limits is not None else None
    if refusal is None or refusal.error is not exc:
        return None
    if refusal.waits > retry.max_provider_limit_waits or turn.attempt > 0:
        return None
    description = f"{type(exc).__name__}: {exc}"
    limit_wait = LimitWait(refusal.key, refusal.until, LimitReason.PROVIDER)
    return wait(ctx, turn, limit_wait, expected, called=True, provider_waits=refusal.waits, error=description)


def provider_waits(previous: AgentSuspension | None, key: str) -> int:
    """The 429s in a row that the call waiting in `previous` for `key` met."""
    count = _previous(previous, key).get("provider_waits", 0)
    return count if isinstance(count, int) else 0


def is_limit_wait(suspension: AgentSuspension | None) -> bool:
    """Whether `suspension` is a wait for a shared model limit (not a retry after a failure)."""
    return suspension is not None and suspension.metadata.get("reason") == machine.LIMIT_WAIT_REASON


def _previous(suspension: AgentSuspension | None, key: str) -> dict[str, Any]:
    # Only a wait for the same key carries over: the agent's model may have changed meanwhile.
    if suspension is None or not is_limit_wait(suspension) or suspension.metadata.get("limit_key") != key:
        return {}
    return suspension.metadata


def _request_parts(messages: list[Any], tools: list[Any]) -> list[Any]:
    parts: list[Any] = []
    for message in messages:
        parts.append(message.content or "")
        parts.extend(call.arguments for call in getattr(message, "tool_calls", ()))
    parts.extend(spec.model_dump(mode="json") for spec in tools)
    return parts

"""Execution limits, the retry schedule (which errors it retries, how long it waits) and close-out message templates."""

from __future__ import annotations

import math
import random
import string
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar, Protocol

from pydantic import Field, field_validator, model_validator

from agent_runner._base import PositionalModel
from agent_runner.errors import DefinitionError, RecoverableError
from agent_runner.limits import InputLimits

TEMPLATE_FIELDS = frozenset({"reason", "turn_id", "tool_call_id", "tool_name"})


DBAPI_TRANSIENT_ERRORS = ("OperationalError", "InterfaceError")
"""Names of the DB-API 2.0 exception classes that drivers raise for a lost or refused connection."""


def _default_retry_on() -> tuple[type[BaseException], ...]:
    return (ConnectionError, TimeoutError)


class RetryPolicy(PositionalModel):
    """Exponential backoff for recoverable model and tool errors.

    `max_attempts` counts every attempt, the first included: with 3, a call is tried
    three times before the turn fails. Times are in seconds.

    A call is retried when it raises `RecoverableError`, an instance of `retry_on` (by
    default connection errors and timeouts), or a DB-API 2.0 `OperationalError` or
    `InterfaceError` (a database driver's dropped connection: psycopg, SQLAlchemy,
    sqlite3, ...), so a tool whose own database connection was cut is retried on schedule
    instead of failing the turn. Anything else is deterministic.
    """

    _positional: ClassVar[tuple[str, ...]] = ("max_attempts", "initial_backoff", "multiplier", "max_backoff", "jitter")

    max_attempts: int = Field(default=3, ge=1)
    initial_backoff: float = Field(default=1.0, ge=0)
    multiplier: float = Field(default=2.0, ge=1)
    max_backoff: float = Field(default=60.0, ge=0)
    jitter: float = Field(default=0.1, ge=0, le=1)
    """Fraction of the backoff added or removed at random, so retries of many turns spread out."""
    retry_on: tuple[type[BaseException], ...] = Field(default_factory=_default_retry_on)
    """Exception types that mean "try again later" (besides `RecoverableError`)."""
    max_provider_limit_waits: int = Field(default=10, ge=0)
    """Rate-limit refusals (HTTP 429) in a row of a call against a limited model key that wait
    without using an attempt (the key is paused for every process meanwhile); past them a 429
    is an ordinary failed attempt, so a quota that is used up still ends the turn."""

    def is_transient(self, error: BaseException, extra: tuple[type[BaseException], ...] = ()) -> bool:
        """Whether `error` should be retried on this schedule (`extra`: a tool's own `retry_on`)."""
        if isinstance(error, (RecoverableError, *self.retry_on, *extra)):
            return True
        return any(kind.__name__ in DBAPI_TRANSIENT_ERRORS for kind in type(error).__mro__)

    def backoff(self, attempt: int, retry_after: float | None = None, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based).

        A `retry_after` asked for by the callee wins when it is longer than the backoff.
        """
        base = min(self.max_backoff, self.initial_backoff * self.multiplier ** max(0, attempt - 1))
        if self.jitter:
            base *= 1 + (rng or random).uniform(-self.jitter, self.jitter)
        delay = max(0.0, base)
        if retry_after is not None and retry_after > delay:
            delay = float(retry_after)
        return delay

    def delay_after(
        self, error: BaseException, attempt: int, extra: tuple[type[BaseException], ...] = ()
    ) -> float | None:
        """Seconds to wait after `error` ended attempt number `attempt`, or None when `error` is not transient.

        The wait the callee asked for (`RecoverableError.retry_after`) wins when it is longer
        than the backoff; `extra` is a tool's own `retry_on`.
        """
        if not self.is_transient(error, extra):
            return None
        return self.backoff(attempt, error.retry_after if isinstance(error, RecoverableError) else None)


def parse_retry_after(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """Return the wait a response asks for, in seconds, or None when it asks for none.

    Reads `retry-after-ms` (sent by OpenAI) and then `Retry-After`, which holds either
    seconds or an HTTP date. A date in the past means no wait (0.0); an unreadable value
    is ignored.
    """
    milliseconds = _non_negative_float(headers.get("retry-after-ms"))
    if milliseconds is not None:
        return milliseconds / 1000
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _non_negative_float(value)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        # RFC 9110 dates are always GMT; the parser leaves "-0000" dates naive.
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _non_negative_float(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _override(base: RetryPolicy, fields: Mapping[str, Any], agent_id: str) -> RetryPolicy:
    unknown = set(fields) - set(RetryPolicy.model_fields)
    if unknown:
        raise DefinitionError(
            f"retry override of agent {agent_id!r} names unknown fields {sorted(unknown)}; "
            f"known: {sorted(RetryPolicy.model_fields)}"
        )
    return RetryPolicy.model_validate({**dict(base), **fields})


class Budget(PositionalModel):
    """Spending limits of a turn, children included; exceeding one ends the turn with BUDGET_EXCEEDED."""

    _positional: ClassVar[tuple[str, ...]] = ("max_total_tokens", "max_cost")

    max_total_tokens: int | None = Field(default=None, ge=0)
    max_cost: float | None = Field(default=None, ge=0)


class FinalAnswer(PositionalModel):
    """Ask the model for a last answer, without tools, when a turn stops for its budget, iterations or steps.

    Instead of ending with only a close-out line, the turn makes one more model call with no
    tools offered, `instruction` sent after its history (not saved), and the model's text
    becomes the turn's `final_output` and its last assistant message. The terminal status
    stays the one of the limit (BUDGET_EXCEEDED, MAX_ITERATIONS_REACHED, MAX_STEPS_REACHED),
    so callers still know why it stopped. The call is one beyond `max_iterations` and
    `max_steps`; for the budget, `reserved_tokens` and `reserved_cost` are kept for it: the
    turn's own work stops that much below `Budget`'s limits. A final answer that fails (the
    model raises, a shared provider limit has no room) leaves the usual close-out.
    """

    _positional: ClassVar[tuple[str, ...]] = ("reserved_tokens", "reserved_cost", "instruction")

    reserved_tokens: int = Field(default=0, ge=0)
    """Tokens of `Budget.max_total_tokens` kept for the final answer."""
    reserved_cost: float = Field(default=0.0, ge=0)
    """Cost of `Budget.max_cost` kept for the final answer."""
    instruction: str = (
        "This turn has to stop now ({reason}). Do not call tools. Answer the user in a few sentences: "
        "what you did and found, and what is left to do."
    )
    """Sent as a user message after the history; `{reason}` is why the turn stops."""

    @field_validator("instruction")
    @classmethod
    def _instruction_template(cls, value: str) -> str:
        return _check_template(value, frozenset({"reason"}), "FinalAnswer.instruction")

    def prompt(self, reason: str) -> str:
        """The instruction for a turn that stops for `reason`."""
        return self.instruction.format_map({"reason": reason})


def _check_template(value: str, allowed: frozenset[str], what: str) -> str:
    names = {name for _, name, _, _ in string.Formatter().parse(value) if name}
    unknown = names - allowed
    if unknown:
        raise DefinitionError(f"{what} uses unknown placeholders {sorted(unknown)}; allowed: {sorted(allowed)}")
    return value


class RetryConfigured(Protocol):
    """What `AgentExecutionPolicy.retry_for` reads of an agent (an `Agent` is one)."""

    @property
    def id(self) -> str:
        """The agent's id, which `retry_overrides` is keyed by."""

    @property
    def retry(self) -> RetryPolicy | None:
        """The agent's own retry schedule (None: the policy's `retry`)."""


class AgentExecutionPolicy(PositionalModel):
    """Limits and texts that apply to every turn a runner executes.

    The templates close out a turn that ends abnormally (cancelled, failed, over budget,
    out of iterations or steps): one ToolMessage per unfinished tool call, then one
    assistant message. Placeholders: `{reason}`, `{turn_id}`, `{tool_call_id}`, `{tool_name}`.
    """

    _positional: ClassVar[tuple[str, ...]] = (
        "max_steps",
        "retry",
        "interrupted_tool_message_template",
        "interrupted_turn_message_template",
        "cancellation_reason",
    )

    max_steps: int = Field(default=200, ge=1)
    """Steps (model calls plus tool calls) a turn may take before MAX_STEPS_REACHED."""
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    interrupted_tool_message_template: str = "Tool call {tool_name} was not completed: {reason}"
    interrupted_turn_message_template: str = "This turn ended before it was finished: {reason}"
    cancellation_reason: str = "turn cancelled by caller"
    max_step_failures: int = Field(default=3, ge=1)
    """Consecutive steps that may raise an unexpected exception (a bug, a poison model response
    that cannot be saved) before the turn ends FAILED, instead of being retried for ever.
    Transient infrastructure errors (an unreachable store or lease backend) do not count."""
    max_recoveries: int = Field(default=3, ge=1)
    """Lease takeovers of a turn in a row without progress (each after a holder died, or lost its lease,
    without saving anything) after which the turn ends FAILED, keeping its output so far, instead
    of being taken over, and crashing its workers, for ever. See `agent_runner._runtime.recovery`."""
    limits: InputLimits = Field(default_factory=InputLimits)
    """Size and depth limits on caller input and model output."""
    deadline_reminder: float | None = Field(default=0.8, gt=0, lt=1)
    """Fraction of the time between a suspension and its deadline after which the
    DEADLINE_APPROACHING event is emitted, once (None: no reminder)."""
    retry_overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per agent id, `RetryPolicy` fields that override the agent's own policy (`Agent(retry=...)`,
    else `retry`), for example from the deployment's configuration: `{"support-agent":
    {"max_attempts": 5}}`. Fields not named keep the agent's values."""

    @field_validator("interrupted_tool_message_template")
    @classmethod
    def _tool_template(cls, value: str) -> str:
        return _check_template(value, TEMPLATE_FIELDS, "interrupted_tool_message_template")

    @field_validator("interrupted_turn_message_template")
    @classmethod
    def _turn_template(cls, value: str) -> str:
        return _check_template(value, TEMPLATE_FIELDS, "interrupted_turn_message_template")

    @model_validator(mode="after")
    def _non_empty_reason(self) -> AgentExecutionPolicy:
        if not self.cancellation_reason:
            raise DefinitionError("cancellation_reason must not be empty")
        return self

    @field_validator("retry_overrides")
    @classmethod
    def _known_retry_fields(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for agent_id, fields in value.items():
            _override(RetryPolicy(), fields, agent_id)  # every field valid on its own
        return value

    def retry_for(self, agent: RetryConfigured) -> RetryPolicy:
        """The retry schedule of `agent`'s calls: its overrides over `agent.retry`, else over `retry`."""
        base = agent.retry or self.retry
        fields = self.retry_overrides.get(agent.id)
        return base if not fields else _override(base, fields, agent.id)

    def render(self, template: str, **values: Any) -> str:
        """Fill a close-out template; missing placeholders render as empty strings."""
        return template.format_map({k: ("" if values.get(k) is None else values[k]) for k in TEMPLATE_FIELDS})

"""The error tree of the runner.

Every error the library raises derives from `AgentRunnerError`. Errors carry structured
attributes (`turn_id`, `expected_version`, ...) and a class-level `retryable` flag that
workers read to decide whether a delivery is worth retrying.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar


class AgentRunnerError(Exception):
    """Base class of every error raised by the runner, its stores and its workers."""

    retryable: ClassVar[bool] = False
    """Whether repeating the same operation later may succeed."""


def log_failure(logger: logging.Logger, error: BaseException | None, message: str, *args: object) -> None:
    """Log a failure that the caller recovers from (it tries again, or leaves the work to a sweep).

    A retryable error (a database connection the server dropped, a Redis that did not
    answer) is expected in a deployment and its message says everything: one WARNING line
    that ends with it, without a traceback. Anything else may be a bug: ERROR with the
    traceback.

    Args:
        logger: Where to log.
        error: The failure.
        message: What failed and what happens next, as a `%`-format string of `args`.
        *args: The values of `message`.
    """
    if isinstance(error, AgentRunnerError) and error.retryable:
        logger.warning(f"{message} ({type(error).__name__}: %s)", *args, error)
    else:
        logger.error(message, *args, exc_info=error)


class DefinitionError(AgentRunnerError):
    """An agent, tool, form or middleware was misconfigured by the application developer."""


class InputLimitError(AgentRunnerError):
    """Input refused before anything was saved: over a size or depth limit, or outside the allowed shape.

    Raised for caller input (messages, ids, form data, metadata) that breaks a limit of
    `InputLimits`; the HTTP API answers it with 422. Nothing was written.

    Attributes:
        field: What was refused (`"conversation_id"`, `"form data"`, ...).
        limit: What is allowed (`"262144 bytes"`, `"64 levels"`, ...).
        found: What was found instead (`"10485760 bytes"`, ...).
    """

    def __init__(self, field: str, limit: str, found: str, message: str | None = None) -> None:
        self.field = field
        self.limit = limit
        self.found = found
        super().__init__(message or f"{field} refused: found {found}, allowed {limit}")


class InvalidTextError(InputLimitError):
    """Text that no store can keep: a NUL character, or a lone surrogate (for example from a non-UTF-8 argument).

    Attributes:
        position: Index of the first such character in the string.
        character: The character itself.
    """

    def __init__(self, field: str, position: int, character: str) -> None:
        self.position = position
        self.character = character
        what = "a NUL character" if character == "\x00" else f"the lone surrogate U+{ord(character):04X}"
        super().__init__(
            field,
            "text without NUL characters or lone surrogates",
            f"{what} at position {position}",
            f"{field}: {what} at position {position} cannot be stored (send valid UTF-8 text without NUL characters)",
        )


class AgentNotFound(AgentRunnerError):
    """The agent loader has no agent with the requested id (and version)."""

    def __init__(self, agent_id: str, version: str | None = None) -> None:
        self.agent_id = agent_id
        self.version = version
        where = f"{agent_id!r}" if version is None else f"{agent_id!r} version {version!r}"
        super().__init__(f"no agent {where} is registered with the agent loader")


class TurnError(AgentRunnerError):
    """Base class of errors about one turn."""


class TurnNotFound(TurnError):
    """The turn store has no turn with this id."""

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        super().__init__(f"turn {turn_id!r} does not exist")


class InvalidTransitionError(TurnError):
    """A status change that the turn state machine does not allow."""

    def __init__(self, current: str, target: str, allowed: frozenset[str] | set[str] = frozenset()) -> None:
        self.current = current
        self.target = target
        self.allowed = frozenset(allowed)
        shown = ", ".join(sorted(self.allowed)) or "none"
        super().__init__(f"a turn in status {current!r} cannot move to {target!r} (allowed: {shown})")

    @classmethod
    def check(cls, current: str, target: str, allowed: frozenset[str] | set[str]) -> None:
        """Raise unless `target` is in `allowed`."""
        if target not in allowed:
            raise cls(current, target, allowed)


class SteeringRefusedError(TurnError):
    """A steering message for a turn that has ended and belongs to no conversation: there is nowhere for it to go."""

    def __init__(self, turn_id: str, status: str) -> None:
        self.turn_id = turn_id
        self.status = status
        super().__init__(f"turn {turn_id!r} has already ended ({status}) and has no conversation to take the message")


class InvalidResumeCommand(TurnError):
    """A resume command that does not fit the turn's current suspension.

    Raised for a terminal turn, a wrong command type, an unknown, stale or already-applied
    call id, and form data that fails the schema frozen in the suspension (listed in
    `errors`: readable strings that are `agent_runner.forms.FormDataError`s, each with the
    JSON Pointer of its field in `pointer`). The turn is left unchanged.
    """

    def __init__(self, message: str, *, turn_id: str | None = None, errors: Sequence[str] | None = None) -> None:
        self.turn_id = turn_id
        self.errors: list[str] = list(errors or [])
        super().__init__(message)


class FormProtocolError(TurnError):
    """A tool asked for a form again for a call whose form data was already submitted."""

    def __init__(self, turn_id: str, tool_call_id: str, form_key: str) -> None:
        self.turn_id = turn_id
        self.tool_call_id = tool_call_id
        self.form_key = form_key
        super().__init__(
            f"tool call {tool_call_id!r} of turn {turn_id!r} requested form {form_key!r} again after its data "
            "was submitted; a tool may request a form at most once per call"
        )


class ToolError(AgentRunnerError):
    """Raised by a tool with a message meant for the model; it becomes an error ToolMessage."""


class ToolArgumentsError(ToolError):
    """The model's arguments for a tool failed the tool's schema."""

    def __init__(self, tool_name: str, errors: list[str]) -> None:
        self.tool_name = tool_name
        self.errors = list(errors)
        super().__init__(f"invalid arguments for tool {tool_name!r}: " + "; ".join(errors))


class RecoverableError(AgentRunnerError):
    """A transient failure of a model or tool call: the turn is retried later.

    Args:
        message: What went wrong.
        retry_after: Seconds the callee asked us to wait (for example an HTTP Retry-After
            header); it overrides the retry policy's backoff when it is longer.
        rate_limited: The callee refused the call for a rate limit (HTTP 429): a model whose
            key is limited then pauses that key for every process (see `agent_runner.model_limits`).
    """

    retryable: ClassVar[bool] = True

    def __init__(
        self, message: str = "recoverable error", retry_after: float | None = None, *, rate_limited: bool = False
    ) -> None:
        self.retry_after = retry_after
        self.rate_limited = rate_limited
        super().__init__(message)


class StoreError(AgentRunnerError):
    """Base class of errors raised by turn stores, chat memories, leases and guards."""


class StoreUnavailableError(StoreError):
    """The backing service could not complete the operation (dropped connection, serialization failure).

    Nothing was written; the same operation may be repeated.
    """

    retryable: ClassVar[bool] = True


class VersionConflictError(StoreError):
    """A compare-and-swap save found a different version than the one expected."""

    def __init__(
        self, object_id: str, expected_version: int, actual_version: int | None, *, what: str = "turn"
    ) -> None:
        self.turn_id = object_id
        self.object_id = object_id
        self.expected_version = expected_version
        self.actual_version = actual_version
        found = "no stored version" if actual_version is None else f"version {actual_version}"
        super().__init__(f"{what} {object_id!r} was expected at version {expected_version} but the store has {found}")


class AgentConversationBusyException(StoreError):
    """The conversation already has a turn that has not finished.

    Answer the user with "busy" (HTTP 409) or queue the message in the inbox; a waiting
    turn must be resumed with its own command, not replaced by a new turn.
    """

    def __init__(self, conversation_id: str, active_turn_id: str, status: Any) -> None:
        self.conversation_id = conversation_id
        self.active_turn_id = active_turn_id
        self.status = status
        super().__init__(
            f"conversation {conversation_id!r} already has the active turn {active_turn_id!r} in status {str(status)!r}"
        )


class LeaseError(StoreError):
    """Base class of lease errors."""


class LeaseHeldError(LeaseError):
    """Another owner holds the lease of this turn."""

    retryable: ClassVar[bool] = True

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        super().__init__(f"the lease of turn {turn_id!r} is held by another worker")


class LeaseLostError(LeaseError):
    """The lease expired and another owner took it; this owner must stop writing."""

    def __init__(self, turn_id: str, fence: int | None = None) -> None:
        self.turn_id = turn_id
        self.fence = fence
        super().__init__(f"the lease of turn {turn_id!r} (fence {fence}) was lost to another worker")


class InvalidEventQueryError(AgentRunnerError):
    """A read of events that cannot be answered as asked.

    Raised when an `EventScope` is built with an empty id, or a read gives a cursor the
    feed did not issue (see `InvalidCursorError`). Nothing was read.
    """


class InvalidCursorError(InvalidEventQueryError):
    """An event cursor that is malformed or was not issued by this kind of feed."""

    def __init__(self, cursor: str, reason: str = "it is not a cursor this feed issued") -> None:
        self.cursor = cursor
        self.reason = reason
        shown = cursor if len(cursor) <= 80 else cursor[:77] + "..."
        super().__init__(f"invalid event cursor {shown!r}: {reason}")

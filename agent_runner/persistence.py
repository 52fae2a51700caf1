"""Protocols of the pluggable backends: turn store, agent loader, chat memory, lease, dispatcher.

The in-memory implementations live in `agent_runner.in_memory`; durable ones in the
`store` package. Every implementation must pass the contract tests in `tests/contract/`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agent_runner._base import utcnow
from agent_runner.messages import AnyMessage, ModelMessage
from agent_runner.snapshot import RUNNABLE_STATUSES, AgentTurn, AgentTurnStatus

if TYPE_CHECKING:
    from agent_runner.agent import Agent


@dataclass(frozen=True)
class TurnRef:
    """A light reference to a stored turn, returned by the queries workers poll."""

    turn_id: str
    version: int
    status: AgentTurnStatus
    updated_at: datetime
    next_retry_at: datetime | None = None

    def is_runnable(self, now: datetime | None = None) -> bool:
        """Whether a worker may step the turn now (the same rule as `AgentTurn.is_runnable`)."""
        if self.status in RUNNABLE_STATUSES:
            return True
        if self.status is AgentTurnStatus.RETRY_SCHEDULED:
            return self.next_retry_at is None or self.next_retry_at <= (now or utcnow())
        return False


@runtime_checkable
class AgentTurnStore(Protocol):
    """Durable home of turn snapshots. Every write is a compare-and-swap on `version`."""

    def load(self, turn_id: str) -> AgentTurn:
        """Return the stored snapshot.

        Raises:
            TurnNotFound: No turn has this id.
        """
        ...

    def get_ref(self, turn_id: str) -> TurnRef:
        """Return the stored turn's id, version, status and times, without its messages or state.

        For decisions that need only the header (is the turn runnable, has it moved on),
        this is cheaper than `load`, whose cost grows with the history.

        Raises:
            TurnNotFound: No turn has this id.
        """
        ...

    def save(self, turn: AgentTurn, expected_version: int) -> AgentTurn:
        """Store `turn` if the stored version equals `expected_version` (-1: create it).

        Returns the stored snapshot: `version` is `expected_version + 1` and
        `cancel_requested` is the stored flag or'ed with the new one (the flag is monotonic).

        Raises:
            VersionConflictError: The stored version differs, or the turn exists when creating.
            AgentConversationBusyException: Creating (or reactivating) a non-terminal turn of a
                conversation that already has another non-terminal turn.
            LeaseLostError: `turn.lease_fence` is lower than the fence of a newer save, so the
                writer's lease was taken over.
        """
        ...

    def find_active_turn(self, conversation_id: str) -> AgentTurn | None:
        """Return the conversation's non-terminal turn, or None."""
        ...

    def request_cancel(self, turn_id: str) -> AgentTurn:
        """Set the turn's cancel flag without changing its version; return the stored snapshot."""
        ...

    def list_turns(
        self,
        *,
        statuses: Sequence[AgentTurnStatus] | None = None,
        conversation_id: str | None = None,
        parent_turn_id: str | None = None,
        limit: int = 100,
    ) -> list[AgentTurn]:
        """Return turns matching every given filter, most recently updated first."""
        ...

    def list_runnable(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Return READY and RUNNING turns and RETRY_SCHEDULED turns due at `now`, oldest first."""
        ...

    def list_stale_running(self, updated_before: datetime, limit: int = 100) -> list[TurnRef]:
        """Return RUNNING turns whose last save is older than `updated_before`, oldest first."""
        ...

    def list_idle(
        self, statuses: Sequence[AgentTurnStatus], updated_before: datetime, limit: int = 100
    ) -> list[TurnRef]:
        """Return turns in one of `statuses` not saved since `updated_before`, oldest first (for sweeps)."""
        ...

    def list_due_retries(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Return RETRY_SCHEDULED turns due at `now`, earliest due first."""
        ...


@runtime_checkable
class AgentLoader(Protocol):
    """Finds agent definitions by id (and version), so any process can restore a turn."""

    def load(self, agent_id: str, version: str | None = None) -> Agent:
        """Return the agent; the newest registered version when `version` is None.

        Raises:
            AgentNotFound: The loader has no such agent.
        """
        ...


@runtime_checkable
class ChatMemory(Protocol):
    """The conversation as the product stores it: model messages plus page messages, in order."""

    conversation_id: str

    def get_messages(self, count: int) -> list[AnyMessage]:
        """Return the newest `count` messages of both kinds, oldest first."""
        ...

    def get_model_messages(self, count: int) -> list[ModelMessage]:
        """Return the newest `count` model-visible messages, oldest first.

        The window never starts with a ToolMessage whose AiMessage falls outside it.
        """
        ...

    def get(self, message_id: str) -> AnyMessage | None:
        """Return the message with this id, or None."""
        ...

    def append(self, messages: Sequence[AnyMessage]) -> None:
        """Append messages in order; a message whose id is already stored is skipped."""
        ...

    def update(self, message: AnyMessage, expected_version: int) -> AnyMessage:
        """Replace a page message if its stored version is `expected_version`; return it with version + 1.

        Raises:
            VersionConflictError: The stored version differs (someone else updated it first).
        """
        ...


ChatMemoryProvider = Callable[[str], ChatMemory]
"""Returns the ChatMemory of a conversation id."""


@dataclass(frozen=True)
class Lease:
    """Exclusive right of one owner to step one turn until it expires.

    `fence` strictly increases with every acquisition of the same turn; saves carry it so
    that a writer whose lease was taken over cannot overwrite newer work.
    """

    turn_id: str
    owner: str
    fence: int


@runtime_checkable
class TurnLease(Protocol):
    """Per-turn mutual exclusion across threads, processes or machines."""

    def acquire(self, turn_id: str, owner: str, ttl_ms: int) -> Lease | None:
        """Take the lease if it is free or expired; None when someone else holds it."""
        ...

    def renew(self, lease: Lease, ttl_ms: int) -> bool:
        """Extend the lease; False when it is no longer held by this owner."""
        ...

    def release(self, lease: Lease) -> bool:
        """Give the lease up; False when it was no longer held by this owner."""
        ...


@runtime_checkable
class TurnDispatcher(Protocol):
    """Hands a runnable turn to whatever executes turns (a Celery queue, a worker pool)."""

    def dispatch(self, turn: AgentTurn) -> None:
        """Arrange for the turn to be stepped; duplicates must be harmless."""
        ...


@runtime_checkable
class ConversationGuard(Protocol):
    """A fast, shared marker of the one active turn per conversation (for example in Redis).

    The turn store stays the truth: its unique index on active conversation turns is the
    backstop when the guard lost its data. The runner consults the guard before creating a
    conversation turn and repairs it from the store when the two disagree.
    """

    def claim(self, conversation_id: str, turn_id: str) -> str:
        """Mark `turn_id` active if the conversation has no holder; return the holder after the call."""
        ...

    def holder(self, conversation_id: str) -> str | None:
        """Return the turn id marked active, or None."""
        ...

    def replace(self, conversation_id: str, expected_holder: str, turn_id: str) -> bool:
        """Atomically move the mark from `expected_holder` (known to be terminal) to `turn_id`."""
        ...

    def release(self, conversation_id: str, turn_id: str) -> bool:
        """Clear the mark if `turn_id` holds it; False otherwise."""
        ...

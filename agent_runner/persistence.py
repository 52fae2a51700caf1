"""Protocols of the pluggable backends: turn store, event log, live events, agent loader, chat memory, lease, dispatcher.

The rules every implementation follows are in `agent_runner.store_rules`; the in-memory
implementations live in `agent_runner.in_memory`, durable ones in the
`store` package. Every implementation must pass the contract tests in `tests/contract/`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from agent_runner.errors import DefinitionError, InvalidCursorError, InvalidEventQueryError
from agent_runner.events import AgentEvent
from agent_runner.messages import AnyMessage, ModelMessage
from agent_runner.snapshot import AgentTurn, AgentTurnStatus, is_runnable

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
    cancel_requested: bool = False

    def is_runnable(self, now: datetime | None = None) -> bool:
        """Whether a worker may step the turn now (the same rule as `AgentTurn.is_runnable`)."""
        return is_runnable(self.status, self.next_retry_at, now)


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

    def save(self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent] = ()) -> AgentTurn:
        """Store `turn` if the stored version equals `expected_version` (-1: create it).

        Returns the stored snapshot: `version` is `expected_version + 1` and
        `cancel_requested` is the stored flag or'ed with the new one (the flag is monotonic).

        The durable ones among `events` (see `AgentEventType.is_durable`) are appended to the
        event log atomically with the snapshot: both are written or neither is. An event
        whose `event_id` is already stored is skipped, so a repeated save never duplicates
        one. Ephemeral events are not stored; they belong on a `LiveEventChannel`.

        Raises:
            VersionConflictError: The stored version differs, or the turn exists when creating.
            AgentConversationBusyException: Creating (or reactivating) a non-terminal turn of a
                conversation that already has another non-terminal turn.
            LeaseLostError: `turn.lease_fence` is lower than the fence of a newer save, so the
                writer's lease was taken over.
        """
        ...

    def find_active_turn(self, conversation_id: str, tenant_id: str | None = None) -> AgentTurn | None:
        """Return the non-terminal turn of the conversation `conversation_id` of `tenant_id`, or None."""
        ...

    def request_cancel(self, turn_id: str, reason: str | None = None) -> AgentTurn:
        """Set the turn's cancel flag without changing its version; return the stored snapshot.

        `reason` is kept as the snapshot's `cancel_reason` unless an earlier request gave
        one, and no save clears it (a save need not return it: `load` does). A store whose `request_cancel` takes only the turn id
        still works: its cancelled turns end with the policy's default reason.
        """
        ...

    def list_turns(
        self,
        *,
        statuses: Sequence[AgentTurnStatus] | None = None,
        conversation_id: str | None = None,
        parent_turn_id: str | None = None,
        limit: int = 100,
        tenant_id: str | None = None,
    ) -> list[AgentTurn]:
        """Return turns matching every given filter, most recently updated first.

        A conversation is named by `conversation_id` and `tenant_id` together: two tenants
        may use the same conversation id.
        """
        ...

    def list_runnable(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Return RUNNING turns, and READY and RETRY_SCHEDULED turns whose `next_retry_at` (if any) has come, oldest first."""
        ...

    def list_idle(
        self, statuses: Sequence[AgentTurnStatus], updated_before: datetime, limit: int = 100
    ) -> list[TurnRef]:
        """Return turns in one of `statuses` not saved since `updated_before`, oldest first (for sweeps).

        A READY turn started with a delay is idle from its start time on, not from its save:
        one whose start came after `updated_before` is not listed (turns waiting for a later
        start never crowd idle ones out of a sweep's batch).
        """
        ...

    def list_due_retries(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Return RETRY_SCHEDULED turns due at `now` and READY turns whose delayed start has come, earliest due first."""
        ...


@runtime_checkable
class DeadlineSource(Protocol):
    """A turn store that lists the waiting turns whose deadline reminder or deadline is due.

    `AgentRunner.apply_due_deadlines` reads its runner's store through it. The in-memory
    and the SQL turn stores implement it; a store that does not has no deadline sweep.
    """

    def list_due_timers(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Return waiting turns whose reminder or deadline is due at `now`, earliest first."""
        ...


@runtime_checkable
class CancelFlagSource(Protocol):
    """A turn store that reads the cancel flags of many turns in one call.

    Optional: while model answers stream, a runner watches the cancel flags of every turn
    it is streaming for; with this it reads them all in one query per interval, without
    it one `get_ref` per turn. The in-memory and the SQL turn stores implement it.
    """

    def cancel_requested_among(self, turn_ids: Collection[str]) -> set[str]:
        """Return the ids among `turn_ids` whose stored turn has `cancel_requested` set (unknown ids are left out)."""
        ...


@runtime_checkable
class ProjectingTurnStore(Protocol):
    """A turn store that can write a conversation turn's ChatMemory projection in the save itself.

    Optional: the runner projects a saved turn into ChatMemory itself when its store lacks
    this, or when `projects_into` says no for its chat memory provider. The SQL store
    implements it on PostgreSQL for a `SqlChatMemoryProvider` of the same database.
    """

    def projects_into(self, provider: ChatMemoryProvider) -> bool:
        """Whether `save_projected` writes into the ChatMemory that `provider` hands out."""
        ...

    def save_projected(self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent] = ()) -> AgentTurn:
        """`AgentTurnStore.save`, appending the turn's unprojected messages to its conversation's ChatMemory.

        Idempotent as `ChatMemory.append` is: a message id already there is skipped. It may
        also bring the page messages of unsynced page actions to their state, by
        compare-and-swap on their version as `ChatMemory.update` (a message changed since
        it was read is left alone). The returned snapshot's `projected_count` and the
        `synced` marks of its page actions tell how far the projection got (the marks are
        stored by the next save); the caller projects what remains.
        """
        ...


@runtime_checkable
class CachedSnapshots(Protocol):
    """A turn store that hands back the snapshot it last saved or read of a turn, without reading storage.

    Optional: a store without it is loaded each time. The runner asks for it where a load
    would cost a round trip and the snapshot's staleness is caught anyway: before a resume's
    save, and when a worker picks up a turn it has just taken the lease of (used only when
    its version is the one the dispatch or the poll saw moments before and no other lease
    holder came in between; see `agent_runner._runtime.pickup`). A save based on a stale cached snapshot is refused by the compare-and-swap
    like any other, and the runner loads the turn and goes on. The in-memory and the SQL
    turn stores implement it.
    """

    def cached_snapshot(self, turn_id: str) -> AgentTurn | None:
        """The newest snapshot of the turn this store saved or read, as it returned it; None when it kept none.

        Another process may have saved the turn since. A cancel request made through
        another store object, which leaves the version as it is, may be missing from it.
        """
        ...


@dataclass(frozen=True)
class SteeringMessage:
    """A user message accepted for a running turn, to join its history before its next model call.

    Attributes:
        turn_id: The turn it steers.
        message_id: The caller's id (unique per turn): accepting it again changes nothing,
            and the user message it becomes in the history has this id.
        text: The message text.
        accepted_at: When it was stored.
        sequence: Increases in the order the turn's messages were stored; they are applied in this order.
        forwarded: Whether the turn ended without applying it and it was handed on (see
            `SteeringQueue.take_unapplied_steering`).
    """

    turn_id: str
    message_id: str
    text: str
    accepted_at: datetime
    sequence: int
    forwarded: bool = False


@runtime_checkable
class SteeringQueue(Protocol):
    """A turn store that keeps the steering messages of its turns (`AgentRunner.steer`).

    Any process writes here without the turn's lease; the process that holds the lease
    reads them before each model call and records the ones it applied in the snapshot
    (`AgentTurn.steered_message_ids`), so a message is applied once, and none is lost when
    that process dies between the two. The in-memory and the SQL turn stores implement it.
    """

    def accept_steering(
        self, turn_id: str, message_id: str, text: str, accepted_at: datetime
    ) -> tuple[SteeringMessage, bool]:
        """Store a steering message of a stored turn; return the stored record and whether this call stored it.

        A `message_id` the turn already has is not stored again: its first record is returned.

        Raises:
            TurnNotFound: No turn has this id.
        """
        ...

    def steering_messages(self, turn_id: str) -> list[SteeringMessage]:
        """Return the turn's steering messages that were not forwarded, in the order they were accepted."""
        ...

    def take_unapplied_steering(self, turn_id: str, applied: Collection[str]) -> list[SteeringMessage]:
        """Mark the turn's steering messages whose id is not in `applied` as forwarded, and return them in order.

        For a turn that ended: of two callers at once, each message goes to one only.
        """
        ...


DEFAULT_EVENT_PAGE = 500
"""Events one read returns at most unless told otherwise."""

EventScopeKind = Literal["tree", "conversation"]
"""What an `EventScope` names: a turn tree (by its root turn's id) or a conversation."""


@dataclass(frozen=True, slots=True)
class ConversationKey:
    """A conversation as its tenant names it: the tenant (None without tenants) and its own conversation id.

    Two tenants may use the same conversation id: their conversations never meet, because
    everything kept per conversation (its active turn, ChatMemory, inbox, event log) is
    keyed by both. Build it once where a request names a conversation and carry it as it is.

    Raises:
        InvalidEventQueryError: The conversation id is empty or not a string, or the tenant is
            neither None nor a non-empty string.
    """

    conversation_id: str
    tenant_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.conversation_id, str) or not self.conversation_id:
            raise InvalidEventQueryError(f"conversation_id must be a non-empty string, got {self.conversation_id!r}")
        if self.tenant_id is not None and (not isinstance(self.tenant_id, str) or not self.tenant_id):
            raise InvalidEventQueryError(f"tenant_id must be None or a non-empty string, got {self.tenant_id!r}")

    def __str__(self) -> str:
        return self.conversation_id if self.tenant_id is None else f"{self.conversation_id} of tenant {self.tenant_id}"


@dataclass(frozen=True, slots=True)
class EventScope:
    """The events one read names: those of a turn tree, or those of a conversation.

    Build it with `EventScope.tree(root_turn_id)` or `EventScope.conversation(conversation_id,
    tenant_id)`; it is checked once, there, and every reader after that takes it as it is.
    It is hashable, so it can key what is kept per scope. A conversation scope carries its
    tenant: the same conversation id of two tenants names two scopes.

    Raises:
        InvalidEventQueryError: The id is empty (or not a string), `kind` is neither kind, or a
            tree scope names a tenant.
    """

    kind: EventScopeKind
    id: str
    tenant_id: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("tree", "conversation"):
            raise InvalidEventQueryError(f"an event scope is a 'tree' or a 'conversation', got {self.kind!r}")
        if not isinstance(self.id, str) or not self.id:
            name = "root_turn_id" if self.kind == "tree" else "conversation_id"
            raise InvalidEventQueryError(f"{name} must be a non-empty string to read events, got {self.id!r}")
        if self.tenant_id is not None:
            if self.kind == "tree":
                raise InvalidEventQueryError(f"a turn tree's scope names no tenant, got {self.tenant_id!r}")
            if not isinstance(self.tenant_id, str) or not self.tenant_id:
                raise InvalidEventQueryError(f"tenant_id must be None or a non-empty string, got {self.tenant_id!r}")

    @classmethod
    def tree(cls, root_turn_id: str) -> EventScope:
        """The events of a root turn and all its descendants."""
        return cls("tree", root_turn_id)

    @classmethod
    def conversation(cls, conversation_id: str, tenant_id: str | None = None) -> EventScope:
        """The events of a conversation's root turns and their descendants (`tenant_id`: the conversation's tenant)."""
        return cls("conversation", conversation_id, tenant_id)

    @classmethod
    def of_conversation(cls, key: ConversationKey) -> EventScope:
        """The events of the conversation `key`."""
        return cls("conversation", key.conversation_id, key.tenant_id)

    def __str__(self) -> str:
        if self.kind == "tree":
            return f"turn tree {self.id!r}"
        if self.tenant_id is None:
            return f"conversation {self.id!r}"
        return f"conversation {self.id!r} of tenant {self.tenant_id!r}"


@runtime_checkable
class EventLog(Protocol):
    """The durable, ordered log of the events a turn store saved with its snapshots.

    Read it per turn tree (a root turn and all its descendants) or per conversation (its
    root turns and their descendants). Each scope numbers its events in the order their
    saves committed, and each returned event carries a `cursor` that stands for its place
    in the scope it was read from (a cursor of one scope means nothing in another); reading
    `after` it returns exactly the events that follow it, each once, with no gaps, also
    while other saves (parallel child turns) commit concurrently. An event is readable as
    soon as its save has returned, whatever else runs on the database server, so a read
    right after a save sees its events.
    """

    def read_events(
        self, scope: EventScope, *, after: str | None = None, limit: int = DEFAULT_EVENT_PAGE
    ) -> list[AgentEvent]:
        """Return up to `limit` durable events of the scope after the cursor `after` (None: from the first), in order.

        Raises:
            InvalidCursorError: `after` is not a cursor this log issued.
        """
        ...


@runtime_checkable
class LiveEventChannel(Protocol):
    """A short-lived broadcast of events to subscribers in other processes.

    Runners publish ephemeral events (MODEL_DELTA, TOOL_PROGRESS) here, and their durable
    events again after the save, as a wake-up for subscribers waiting on the channel. An
    event is published to the stream of its turn tree (`root_turn_id`) and to the stream
    of its conversation (`conversation_id`; runners set the root's conversation on child
    events too). Events are kept for a bounded time and number, not for good.
    """

    def publish(self, event: AgentEvent) -> None:
        """Broadcast the event; never raises (a failure is logged and the event is lost)."""
        ...

    def read(self, scope: EventScope, *, after: str | None = None, limit: int = DEFAULT_EVENT_PAGE) -> list[AgentEvent]:
        """Return up to `limit` kept events of the scope published after the cursor `after`, oldest first.

        Each event carries its `cursor` in this channel.

        Raises:
            InvalidCursorError: `after` is not a cursor of this channel.
        """
        ...

    def wait(self, scope: EventScope, *, after: str | None = None, timeout: float) -> list[AgentEvent]:
        """Like `read`, but block up to `timeout` seconds until there is an event after `after`.

        Returns an empty list when the time ran out first.

        Raises:
            InvalidCursorError: `after` is not a cursor of this channel.
        """
        ...


_MAX_POSITION = 2**63 - 1


def format_position(*numbers: int) -> str:
    """Return the cursor text of a position made of non-negative integers (`"12"`, `"7.12"`)."""
    return ".".join(str(number) for number in numbers)


def parse_position(cursor: str, parts: int) -> tuple[int, ...]:
    """Return the `parts` integers of a cursor written by `format_position`.

    Raises:
        InvalidCursorError: The cursor has another shape, or a number out of range.
    """
    pieces = cursor.split(".")
    if len(pieces) != parts or not all(piece.isascii() and piece.isdigit() and len(piece) <= 19 for piece in pieces):
        raise InvalidCursorError(cursor, f"expected {parts} dot-separated non-negative integer(s)")
    numbers = tuple(int(piece) for piece in pieces)
    if any(number > _MAX_POSITION for number in numbers):
        raise InvalidCursorError(cursor, "a position is out of range")
    return numbers


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


ChatMemoryProvider = Callable[..., ChatMemory]
"""Returns the ChatMemory of a conversation: called with its id, and `tenant_id=` for a tenant's conversation.

A provider that serves no tenants may take the id alone: the runner passes `tenant_id`
only for the turns of a tenant.
"""


def chat_memory(provider: ChatMemoryProvider, conversation: ConversationKey) -> ChatMemory:
    """The ChatMemory `provider` keeps for `conversation`.

    Raises:
        DefinitionError: `conversation` has a tenant and `provider` takes no `tenant_id`.
    """
    if conversation.tenant_id is None:
        return provider(conversation.conversation_id)
    try:
        return provider(conversation.conversation_id, tenant_id=conversation.tenant_id)
    except TypeError:
        if _takes_tenant(provider):
            raise
        raise DefinitionError(
            f"the chat memory provider {provider!r} takes no tenant_id, so it cannot keep the conversations of "
            f"tenant {conversation.tenant_id!r} apart from others of the same id; use one that does "
            "(InMemoryChatMemoryProvider, store.SqlChatMemoryProvider)"
        ) from None


def _takes_tenant(provider: ChatMemoryProvider) -> bool:
    try:
        inspect.signature(provider).bind("conversation", tenant_id="tenant")
    except TypeError:
        return False
    except ValueError:  # no signature to read
        return True
    return True


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

    def claim(self, conversation: ConversationKey, turn_id: str) -> str:
        """Mark `turn_id` active if the conversation has no holder; return the holder after the call."""
        ...

    def holder(self, conversation: ConversationKey) -> str | None:
        """Return the turn id marked active, or None."""
        ...

    def replace(self, conversation: ConversationKey, expected_holder: str, turn_id: str) -> bool:
        """Atomically move the mark from `expected_holder` (known to be terminal) to `turn_id`."""
        ...

    def release(self, conversation: ConversationKey, turn_id: str) -> bool:
        """Clear the mark if `turn_id` holds it; False otherwise."""
        ...

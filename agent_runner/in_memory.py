"""In-process backends: turn store, chat memory and its provider, and the turn lease.

They are thread-safe and implement the same contracts as the durable backends in `store`,
so a program can move from one to the other without changing behaviour.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import datetime

from agent_runner.errors import (
    AgentConversationBusyException,
    LeaseLostError,
    StoreError,
    TurnNotFound,
    VersionConflictError,
)
from agent_runner.messages import AnyMessage, ModelMessage, ToolMessage
from agent_runner.persistence import Lease, TurnRef
from agent_runner.snapshot import AgentTurn, AgentTurnStatus


def _ref(turn: AgentTurn) -> TurnRef:
    return TurnRef(turn.id, turn.version, turn.status, turn.updated_at, turn.next_retry_at)


def stored_snapshot(turn: AgentTurn, current: AgentTurn | None, expected_version: int) -> AgentTurn:
    """Return what a store keeps for a successful save of `turn` over `current`.

    The version advances by one, the cancel flag never goes back to False and the lease
    fence never goes down. Every store applies this same rule.
    """
    cancel = turn.cancel_requested or (current is not None and current.cancel_requested)
    fence = turn.lease_fence
    if current is not None and current.lease_fence is not None and (fence is None or fence < current.lease_fence):
        fence = current.lease_fence
    update: dict[str, object] = {"version": expected_version + 1}
    if cancel != turn.cancel_requested:
        update["cancel_requested"] = cancel
    if fence != turn.lease_fence:
        update["lease_fence"] = fence
    return turn.model_copy(update=update)


class InMemoryAgentTurnStore:
    """A thread-safe `AgentTurnStore` in this process's memory.

    The one-active-turn-per-conversation rule is checked atomically with the save, so
    several runners sharing this store in one process cannot start two turns at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._turns: dict[str, AgentTurn] = {}
        self._active: dict[str, str] = {}

    def load(self, turn_id: str) -> AgentTurn:
        """Return the stored snapshot or raise `TurnNotFound`."""
        turn = self._turns.get(turn_id)
        if turn is None:
            raise TurnNotFound(turn_id)
        return turn

    def get_ref(self, turn_id: str) -> TurnRef:
        """Return the stored turn's reference (id, version, status, times) or raise `TurnNotFound`."""
        turn = self._turns.get(turn_id)
        if turn is None:
            raise TurnNotFound(turn_id)
        return _ref(turn)

    def save(self, turn: AgentTurn, expected_version: int) -> AgentTurn:
        """Compare-and-swap the snapshot; see `AgentTurnStore.save`."""
        with self._lock:
            current = self._turns.get(turn.id)
            actual = None if current is None else current.version
            if expected_version == -1 and current is not None:
                raise VersionConflictError(turn.id, expected_version, actual)
            if expected_version != -1 and actual != expected_version:
                raise VersionConflictError(turn.id, expected_version, actual)
            if (
                current is not None
                and current.lease_fence is not None
                and turn.lease_fence is not None
                and turn.lease_fence < current.lease_fence
            ):
                raise LeaseLostError(turn.id, turn.lease_fence)
            conversation = turn.conversation_id
            if conversation is not None and not turn.status.is_terminal:
                active_id = self._active.get(conversation)
                if active_id is not None and active_id != turn.id:
                    raise AgentConversationBusyException(conversation, active_id, self._turns[active_id].status)
            stored = stored_snapshot(turn, current, expected_version)
            self._turns[turn.id] = stored
            if conversation is not None:
                if not stored.status.is_terminal:
                    self._active[conversation] = turn.id
                elif self._active.get(conversation) == turn.id:
                    del self._active[conversation]
            return stored

    def find_active_turn(self, conversation_id: str) -> AgentTurn | None:
        """Return the conversation's non-terminal turn, or None."""
        with self._lock:
            turn_id = self._active.get(conversation_id)
            return None if turn_id is None else self._turns[turn_id]

    def request_cancel(self, turn_id: str) -> AgentTurn:
        """Set the monotonic cancel flag without a version change."""
        with self._lock:
            turn = self._turns.get(turn_id)
            if turn is None:
                raise TurnNotFound(turn_id)
            if not turn.cancel_requested:
                turn = turn.model_copy(update={"cancel_requested": True})
                self._turns[turn_id] = turn
            return turn

    def list_turns(
        self,
        *,
        statuses: Sequence[AgentTurnStatus] | None = None,
        conversation_id: str | None = None,
        parent_turn_id: str | None = None,
        limit: int = 100,
    ) -> list[AgentTurn]:
        """Return matching turns, most recently updated first."""
        with self._lock:
            turns = list(self._turns.values())
        wanted = None if statuses is None else set(statuses)
        found = [
            t
            for t in turns
            if (wanted is None or t.status in wanted)
            and (conversation_id is None or t.conversation_id == conversation_id)
            and (parent_turn_id is None or t.parent_turn_id == parent_turn_id)
        ]
        found.sort(key=lambda t: t.updated_at, reverse=True)
        return found[:limit]

    def list_runnable(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Return turns a worker may step now, least recently updated first."""
        with self._lock:
            turns = [t for t in self._turns.values() if t.is_runnable(now)]
        turns.sort(key=lambda t: t.updated_at)
        return [_ref(t) for t in turns[:limit]]

    def list_stale_running(self, updated_before: datetime, limit: int = 100) -> list[TurnRef]:
        """Return RUNNING turns not saved since `updated_before`."""
        return self.list_idle([AgentTurnStatus.RUNNING], updated_before, limit)

    def list_idle(
        self, statuses: Sequence[AgentTurnStatus], updated_before: datetime, limit: int = 100
    ) -> list[TurnRef]:
        """Return turns in one of `statuses` not saved since `updated_before`, oldest first."""
        wanted = set(statuses)
        with self._lock:
            turns = [t for t in self._turns.values() if t.status in wanted and t.updated_at < updated_before]
        turns.sort(key=lambda t: t.updated_at)
        return [_ref(t) for t in turns[:limit]]

    def list_due_retries(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Return RETRY_SCHEDULED turns due at `now`, earliest due first."""
        with self._lock:
            turns = [
                t
                for t in self._turns.values()
                if t.status is AgentTurnStatus.RETRY_SCHEDULED and (t.next_retry_at is None or t.next_retry_at <= now)
            ]
        turns.sort(key=lambda t: t.next_retry_at or t.updated_at)
        return [_ref(t) for t in turns[:limit]]


def model_window(messages: Sequence[AnyMessage], count: int) -> list[ModelMessage]:
    """Return the newest `count` model-visible messages, oldest first, without a leading orphan ToolMessage."""
    window: list[ModelMessage] = []
    if count <= 0:
        return window
    for message in reversed(messages):
        if message.model_visible:
            window.append(message)  # type: ignore[arg-type]  # model_visible implies a model message
            if len(window) == count:
                break
    window.reverse()
    start = 0
    while start < len(window) and isinstance(window[start], ToolMessage):
        start += 1
    return window[start:]


class InMemoryChatMemory:
    """A thread-safe `ChatMemory` of one conversation, in this process's memory."""

    def __init__(self, conversation_id: str) -> None:
        self.conversation_id = conversation_id
        self._lock = threading.Lock()
        self._messages: list[AnyMessage] = []
        self._index: dict[str, int] = {}

    def get_messages(self, count: int) -> list[AnyMessage]:
        """Return the newest `count` messages, oldest first."""
        with self._lock:
            return list(self._messages[-count:]) if count > 0 else []

    def get_model_messages(self, count: int) -> list[ModelMessage]:
        """Return the newest `count` model-visible messages, oldest first."""
        with self._lock:
            return model_window(self._messages, count)

    def get(self, message_id: str) -> AnyMessage | None:
        """Return the message with this id, or None."""
        with self._lock:
            position = self._index.get(message_id)
            return None if position is None else self._messages[position]

    def append(self, messages: Sequence[AnyMessage]) -> None:
        """Append messages whose ids are not stored yet, in order."""
        with self._lock:
            for message in messages:
                if message.id not in self._index:
                    self._index[message.id] = len(self._messages)
                    self._messages.append(message)

    def update(self, message: AnyMessage, expected_version: int) -> AnyMessage:
        """Compare-and-swap a page message on its version."""
        with self._lock:
            position = self._index.get(message.id)
            if position is None:
                raise StoreError(f"message {message.id!r} is not in conversation {self.conversation_id!r}")
            stored = self._messages[position]
            if stored.model_visible or stored.role != message.role:
                raise StoreError(f"message {message.id!r} is a {stored.role!r} message; only page messages change")
            actual: int = stored.version  # type: ignore[union-attr]  # page messages have a version
            if actual != expected_version:
                raise VersionConflictError(message.id, expected_version, actual, what="message")
            updated = message.model_copy(update={"version": expected_version + 1})
            self._messages[position] = updated
            return updated


class InMemoryChatMemoryProvider:
    """A `ChatMemoryProvider` that keeps one `InMemoryChatMemory` per conversation id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._memories: dict[str, InMemoryChatMemory] = {}

    def __call__(self, conversation_id: str) -> InMemoryChatMemory:
        """Return the conversation's memory, creating it on first use."""
        with self._lock:
            memory = self._memories.get(conversation_id)
            if memory is None:
                memory = self._memories[conversation_id] = InMemoryChatMemory(conversation_id)
            return memory


class InMemoryTurnLease:
    """A `TurnLease` for threads of one process; fences increase per turn."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[str, int, float]] = {}
        self._fences: dict[str, int] = {}

    def acquire(self, turn_id: str, owner: str, ttl_ms: int) -> Lease | None:
        """Take the lease if free or expired."""
        now = time.monotonic()
        with self._lock:
            held = self._held.get(turn_id)
            if held is not None and held[2] > now and held[0] != owner:
                return None
            fence = self._fences.get(turn_id, 0) + 1
            self._fences[turn_id] = fence
            self._held[turn_id] = (owner, fence, now + ttl_ms / 1000)
            return Lease(turn_id, owner, fence)

    def renew(self, lease: Lease, ttl_ms: int) -> bool:
        """Extend the lease if this owner still holds it."""
        now = time.monotonic()
        with self._lock:
            held = self._held.get(lease.turn_id)
            if held is None or held[0] != lease.owner or held[1] != lease.fence or held[2] <= now:
                return False
            self._held[lease.turn_id] = (lease.owner, lease.fence, now + ttl_ms / 1000)
            return True

    def release(self, lease: Lease) -> bool:
        """Free the lease if this owner still holds it."""
        with self._lock:
            held = self._held.get(lease.turn_id)
            if held is None or held[0] != lease.owner or held[1] != lease.fence:
                return False
            del self._held[lease.turn_id]
            return True

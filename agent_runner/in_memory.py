"""In-process backends: turn store with its event log, live events, chat memory and its provider, and the turn lease.

They are thread-safe and implement the same contracts as the durable backends in `store`,
applying the same rules (`agent_runner.store_rules`), so a program can move from one to
the other without changing behaviour.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from agent_runner.errors import (
    AgentConversationBusyException,
    StoreError,
    TurnNotFound,
    VersionConflictError,
)
from agent_runner.events import AgentEvent
from agent_runner.ids import utcnow
from agent_runner.messages import AnyMessage, ModelMessage
from agent_runner.persistence import (
    DEFAULT_EVENT_PAGE,
    ConversationKey,
    EventScope,
    Lease,
    SteeringMessage,
    TurnRef,
    format_position,
    parse_position,
)
from agent_runner.snapshot import AgentTurn, AgentTurnStatus
from agent_runner.store_rules import (
    check_fence,
    event_scopes,
    kept_events,
    live_scopes,
    model_window,
    prunable,
    stored_snapshot,
)

logger = logging.getLogger(__name__)


def _is_due(turn: AgentTurn, now: datetime) -> bool:
    """A due retry, or a READY turn whose delayed start has come (READY without a start time is not scheduled)."""
    if turn.status is AgentTurnStatus.READY:
        return turn.next_retry_at is not None and turn.next_retry_at <= now
    return turn.status is AgentTurnStatus.RETRY_SCHEDULED and turn.is_runnable(now)


def _ref(turn: AgentTurn) -> TurnRef:
    return TurnRef(turn.id, turn.version, turn.status, turn.updated_at, turn.next_retry_at, turn.cancel_requested)


def _read_start(after: str | None) -> int:
    """The position a read of events starts after (0: from the first)."""
    return 0 if after is None else parse_position(after, 1)[0]


@dataclass(slots=True)
class _ScopeLog:
    """One scope of the event log: its events with their positions, in order, and the last position handed out."""

    last_position: int = 0
    entries: list[tuple[int, AgentEvent]] = field(default_factory=list)


class InMemoryAgentTurnStore:
    """A thread-safe `AgentTurnStore` and `EventLog` in this process's memory.

    The one-active-turn-per-conversation rule is checked atomically with the save, so
    several runners sharing this store in one process cannot start two turns at once.
    As in the SQL store, each turn tree and each conversation numbers its events 1, 2,
    3, ... in the order of their saves (which are serialized here), and an event's cursor
    is its position in the scope it was read from.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._turns: dict[str, AgentTurn] = {}
        self._active: dict[ConversationKey, str] = {}
        # The event log, per scope (a conversation's outlives pruning, so no position is used twice).
        self._logs: dict[EventScope, _ScopeLog] = {}
        self._event_ids: set[str] = set()
        self._steering: dict[str, list[SteeringMessage]] = {}

    def load(self, turn_id: str) -> AgentTurn:
        """Return the stored snapshot or raise `TurnNotFound`."""
        turn = self._turns.get(turn_id)
        if turn is None:
            raise TurnNotFound(turn_id)
        return turn

    def cached_snapshot(self, turn_id: str) -> AgentTurn | None:
        """The stored snapshot, or None (see `CachedSnapshots`): in memory, what is stored is at hand."""
        return self._turns.get(turn_id)

    def get_ref(self, turn_id: str) -> TurnRef:
        """Return the stored turn's reference (id, version, status, times) or raise `TurnNotFound`."""
        turn = self._turns.get(turn_id)
        if turn is None:
            raise TurnNotFound(turn_id)
        return _ref(turn)

    def cancel_requested_among(self, turn_ids: Collection[str]) -> set[str]:
        """Return the ids among `turn_ids` of stored turns whose cancel is requested; see `CancelFlagSource`."""
        with self._lock:
            return {i for i in turn_ids if (turn := self._turns.get(i)) is not None and turn.cancel_requested}

    def save(self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent] = ()) -> AgentTurn:
        """Compare-and-swap the snapshot and append its durable events; see `AgentTurnStore.save`."""
        with self._lock:
            current = self._turns.get(turn.id)
            actual = None if current is None else current.version
            if expected_version == -1 and current is not None:
                raise VersionConflictError(turn.id, expected_version, actual)
            if expected_version != -1 and actual != expected_version:
                raise VersionConflictError(turn.id, expected_version, actual)
            if current is not None:
                check_fence(turn, current.lease_fence)
            conversation = (
                None if turn.conversation_id is None else ConversationKey(turn.conversation_id, turn.tenant_id)
            )
            if conversation is not None and not turn.status.is_terminal:
                active_id = self._active.get(conversation)
                if active_id is not None and active_id != turn.id:
                    raise AgentConversationBusyException(
                        conversation.conversation_id, active_id, self._turns[active_id].status
                    )
            stored = stored_snapshot(turn, current, expected_version)
            self._turns[turn.id] = stored
            if conversation is not None:
                if not stored.status.is_terminal:
                    self._active[conversation] = turn.id
                elif self._active.get(conversation) == turn.id:
                    del self._active[conversation]
            if events:
                self._append_events(stored, events)
            return stored

    def _append_events(self, turn: AgentTurn, events: Sequence[AgentEvent]) -> None:
        root = self._turns.get(turn.root_turn_id)
        root_conversation = None if root is None else root.conversation_id
        for kept in kept_events(turn, events, root_conversation):
            if kept.event_id in self._event_ids:
                continue
            self._event_ids.add(kept.event_id)
            for scope in event_scopes(turn.root_turn_id, kept.conversation_id, kept.tenant_id):
                log = self._logs.get(scope)
                if log is None:
                    log = self._logs[scope] = _ScopeLog()
                log.last_position += 1
                copy = kept.model_copy(update={"cursor": format_position(log.last_position)})
                log.entries.append((log.last_position, copy))

    def read_events(
        self, scope: EventScope, *, after: str | None = None, limit: int = DEFAULT_EVENT_PAGE
    ) -> list[AgentEvent]:
        """Return up to `limit` durable events of a turn tree or a conversation after `after`; see `EventLog`."""
        start = _read_start(after)
        if limit <= 0:
            return []
        with self._lock:
            log = self._logs.get(scope)
            stored = [] if log is None else log.entries
            index = bisect_right(stored, start, key=lambda entry: entry[0])
            return [event for _, event in stored[index : index + limit]]

    def prune(self, older_than: timedelta, *, batch_size: int = 500) -> int:
        """Remove the turn trees that ended more than `older_than` ago, with their events; return how many turns.

        A tree goes only when every turn in it is terminal and none was saved since the
        limit; a tree with an active turn stays whole. `batch_size` exists for parity with
        the SQL store: here one pass under the lock removes everything due.
        """
        if older_than < timedelta(0):
            raise ValueError(f"older_than must not be negative, got {older_than!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")
        cutoff = utcnow() - older_than
        with self._lock:
            roots = prunable(self._turns.values(), cutoff)
            doomed = [t.id for t in self._turns.values() if t.root_turn_id in roots]
            for turn_id in doomed:
                del self._turns[turn_id]
                self._steering.pop(turn_id, None)
            for scope, log in list(self._logs.items()):
                self._event_ids.difference_update(e.event_id for _, e in log.entries if e.root_turn_id in roots)
                # As in the SQL store: a pruned tree's counter goes with it, a conversation's stays.
                if scope.kind == "tree" and scope.id in roots:
                    del self._logs[scope]
                else:
                    log.entries = [(p, e) for p, e in log.entries if e.root_turn_id not in roots]
            return len(doomed)

    def find_active_turn(self, conversation_id: str, tenant_id: str | None = None) -> AgentTurn | None:
        """Return the non-terminal turn of the conversation `conversation_id` of `tenant_id`, or None."""
        with self._lock:
            turn_id = self._active.get(ConversationKey(conversation_id, tenant_id))
            return None if turn_id is None else self._turns[turn_id]

    def request_cancel(self, turn_id: str, reason: str | None = None) -> AgentTurn:
        """Set the monotonic cancel flag, and the first reason given, without a version change."""
        with self._lock:
            turn = self._turns.get(turn_id)
            if turn is None:
                raise TurnNotFound(turn_id)
            update: dict[str, object] = {"cancel_requested": True}
            if turn.cancel_reason is None and reason:
                update["cancel_reason"] = reason
            if any(getattr(turn, name) != value for name, value in update.items()):
                turn = turn.model_copy(update=update)
                self._turns[turn_id] = turn
            return turn

    def accept_steering(
        self, turn_id: str, message_id: str, text: str, accepted_at: datetime
    ) -> tuple[SteeringMessage, bool]:
        """Store a steering message unless the turn has its id already; see `SteeringQueue`."""
        with self._lock:
            if turn_id not in self._turns:
                raise TurnNotFound(turn_id)
            queue = self._steering.setdefault(turn_id, [])
            stored = next((m for m in queue if m.message_id == message_id), None)
            if stored is not None:
                return stored, False
            message = SteeringMessage(turn_id, message_id, text, accepted_at, len(queue) + 1)
            queue.append(message)
            return message, True

    def steering_messages(self, turn_id: str) -> list[SteeringMessage]:
        """The turn's steering messages not forwarded, in order; see `SteeringQueue`."""
        with self._lock:
            return [m for m in self._steering.get(turn_id, ()) if not m.forwarded]

    def take_unapplied_steering(self, turn_id: str, applied: Collection[str]) -> list[SteeringMessage]:
        """Mark and return the turn's steering messages neither applied nor forwarded; see `SteeringQueue`."""
        with self._lock:
            queue = self._steering.get(turn_id, [])
            taken = [m for m in queue if not m.forwarded and m.message_id not in applied]
            self._steering[turn_id] = [replace(m, forwarded=True) if m in taken else m for m in queue]
            return taken

    def list_turns(
        self,
        *,
        statuses: Sequence[AgentTurnStatus] | None = None,
        conversation_id: str | None = None,
        parent_turn_id: str | None = None,
        limit: int = 100,
        tenant_id: str | None = None,
    ) -> list[AgentTurn]:
        """Return matching turns, most recently updated first (see `AgentTurnStore.list_turns`)."""
        with self._lock:
            turns = list(self._turns.values())
        wanted = None if statuses is None else set(statuses)
        found = [
            t
            for t in turns
            if (wanted is None or t.status in wanted)
            and (conversation_id is None or t.conversation_id == conversation_id)
            and (tenant_id is None or t.tenant_id == tenant_id)
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

    def list_idle(
        self, statuses: Sequence[AgentTurnStatus], updated_before: datetime, limit: int = 100
    ) -> list[TurnRef]:
        """Return turns in one of `statuses` idle since `updated_before`, oldest first; see `AgentTurnStore`."""
        wanted = set(statuses)
        with self._lock:
            turns = [
                t
                for t in self._turns.values()
                if t.status in wanted
                and t.updated_at < updated_before
                and (t.starts_at or t.updated_at) < updated_before
            ]
        turns.sort(key=lambda t: t.updated_at)
        return [_ref(t) for t in turns[:limit]]

    def list_due_retries(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Return RETRY_SCHEDULED turns due at `now` and READY turns whose delayed start has come, earliest due first."""
        with self._lock:
            turns = [t for t in self._turns.values() if _is_due(t, now)]
        turns.sort(key=lambda t: t.next_retry_at or t.updated_at)
        return [_ref(t) for t in turns[:limit]]

    def list_due_timers(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Return waiting turns whose deadline reminder or deadline is due at `now`, earliest first."""
        with self._lock:
            due = [(t.wake_at, t) for t in self._turns.values() if t.wake_at is not None and t.wake_at <= now]
        due.sort(key=lambda item: (item[0], item[1].id))
        return [_ref(t) for _, t in due[:limit]]


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
    """A `ChatMemoryProvider` that keeps one `InMemoryChatMemory` per conversation (id and tenant)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._memories: dict[ConversationKey, InMemoryChatMemory] = {}

    def __call__(self, conversation_id: str, tenant_id: str | None = None) -> InMemoryChatMemory:
        """Return the memory of the conversation `conversation_id` of `tenant_id`, creating it on first use."""
        key = ConversationKey(conversation_id, tenant_id)
        with self._lock:
            memory = self._memories.get(key)
            if memory is None:
                memory = self._memories[key] = InMemoryChatMemory(conversation_id)
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


class InMemoryLiveEvents:
    """A `LiveEventChannel` for subscribers in this process (the embedded mode).

    Each scope (turn tree, conversation) keeps its newest `max_events_per_scope` events, each
    for at least `retention_s` seconds after it was published unless that bound pushes it
    out. A cursor is the event's publication number in this channel; it means nothing to
    another channel or process. Thread-safe; `wait` sleeps on a condition that `publish`
    signals.

    Args:
        retention_s: Seconds an event is kept at least (bounded by `max_events_per_scope`).
        max_events_per_scope: Most events kept per turn tree and per conversation.
        clock: Monotonic seconds; tests pass a fake one.

    Raises:
        ValueError: `retention_s` or `max_events_per_scope` is not positive.
    """

    def __init__(
        self,
        retention_s: float = 300.0,
        max_events_per_scope: int = 10_000,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if retention_s <= 0:
            raise ValueError(f"retention_s must be positive, got {retention_s!r}")
        if max_events_per_scope < 1:
            raise ValueError(f"max_events_per_scope must be at least 1, got {max_events_per_scope!r}")
        self.retention_s = retention_s
        self.max_events_per_scope = max_events_per_scope
        self._clock = clock
        self._changed = threading.Condition()
        self._published = 0
        self._scopes: dict[EventScope, deque[tuple[int, float, AgentEvent]]] = {}
        self._next_sweep = clock() + retention_s

    def publish(self, event: AgentEvent) -> None:
        """Keep the event in its tree's and conversation's scopes and wake the waiters; never raises."""
        try:
            with self._changed:
                now = self._clock()
                self._published += 1
                number = self._published
                kept = event.model_copy(update={"cursor": format_position(number)})
                for scope in live_scopes(event):
                    entries = self._scopes.get(scope)
                    if entries is None:
                        entries = self._scopes[scope] = deque(maxlen=self.max_events_per_scope)
                    entries.append((number, now, kept))
                if now >= self._next_sweep:
                    self._sweep(now)
                self._changed.notify_all()
        except Exception:
            logger.exception("publishing live event %s of turn %s failed; it is lost", event.type, event.turn_id)

    def read(self, scope: EventScope, *, after: str | None = None, limit: int = DEFAULT_EVENT_PAGE) -> list[AgentEvent]:
        """Return up to `limit` kept events of the scope published after `after`; see `LiveEventChannel`."""
        start = _read_start(after)
        with self._changed:
            return self._after(scope, start, limit)

    def wait(self, scope: EventScope, *, after: str | None = None, timeout: float) -> list[AgentEvent]:
        """Return the kept events after `after`, waiting up to `timeout` seconds for one; see `LiveEventChannel`."""
        start = _read_start(after)
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._changed:
            while True:
                found = self._after(scope, start, DEFAULT_EVENT_PAGE)
                remaining = deadline - time.monotonic()
                if found or remaining <= 0:
                    return found
                self._changed.wait(remaining)

    def _after(self, scope: EventScope, start: int, limit: int) -> list[AgentEvent]:
        entries = self._scopes.get(scope)
        if not entries or limit <= 0:
            return []
        self._expire(scope, entries, self._clock())
        found: list[AgentEvent] = []
        for number, _, event in entries:
            if number > start:
                found.append(event)
                if len(found) == limit:
                    break
        return found

    def _expire(self, scope: EventScope, entries: deque[tuple[int, float, AgentEvent]], now: float) -> None:
        horizon = now - self.retention_s
        while entries and entries[0][1] < horizon:
            entries.popleft()
        if not entries:
            del self._scopes[scope]

    def _sweep(self, now: float) -> None:
        # Scopes of finished turns get no more reads or publishes; drop what has expired.
        for scope, entries in list(self._scopes.items()):
            self._expire(scope, entries, now)
        self._next_sweep = now + self.retention_s

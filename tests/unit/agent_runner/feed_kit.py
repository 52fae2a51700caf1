"""A turn tree in an in-memory store with a runner's habits, and an event log that counts its reads."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_runner import AgentEvent, AgentEventType, AgentTurn, EventScope, InMemoryAgentTurnStore, InMemoryLiveEvents

E = AgentEventType
T0 = datetime(2030, 1, 1, tzinfo=UTC)


class Tree:
    """A turn tree in an in-memory store, with a runner's habits: save durable events, then publish them."""

    def __init__(self, store: InMemoryAgentTurnStore, live: InMemoryLiveEvents, root: str = "r-1") -> None:
        self.store = store
        self.live = live
        self.root = root
        self.turns: dict[str, AgentTurn] = {}
        self.clock = T0
        self.save(root)

    def tick(self) -> datetime:
        self.clock += timedelta(milliseconds=1)
        return self.clock

    def save(self, turn_id: str, *types: E) -> list[AgentEvent]:
        """Save the turn's next version with one durable event per type (TURN_STARTED when creating)."""
        current = self.turns.get(turn_id)
        if current is None:
            parent = None if turn_id == self.root else self.root
            current = AgentTurn(
                id=turn_id,
                agent_id="a",
                root_turn_id=self.root,
                parent_turn_id=parent,
                conversation_id="c-1" if parent is None else None,
            )
            types = types or (E.TURN_STARTED,)
        version = current.version + 1
        events = [
            AgentEvent(
                event_id=f"{turn_id}:{version}:{n}",
                type=t,
                turn_id=turn_id,
                root_turn_id=self.root,
                conversation_id="c-1",
                timestamp=self.tick(),
            )
            for n, t in enumerate(types)
        ]
        self.turns[turn_id] = self.store.save(current, version - 1, events)
        for published in events:
            self.live.publish(published)
        return events

    def delta(self, turn_id: str, text: str = "x", type: E = E.MODEL_DELTA) -> AgentEvent:
        published = AgentEvent(
            type=type,
            turn_id=turn_id,
            root_turn_id=self.root,
            conversation_id="c-1",
            timestamp=self.tick(),
            data={"text": text},
        )
        self.live.publish(published)
        return published


class CountingLog:
    """An event log that counts its reads, and can hold back the newest events for a while.

    `hide` keeps events with these ids unreadable, as PostgreSQL does with an event
    committed after a transaction that is still open.
    """

    def __init__(self, store: InMemoryAgentTurnStore) -> None:
        self.store = store
        self.reads = 0
        self.hide: set[str] = set()
        self.lock = threading.Lock()

    def read_events(self, scope: EventScope, **query: Any) -> list[AgentEvent]:
        with self.lock:
            self.reads += 1
            hidden = set(self.hide)
        events = self.store.read_events(scope, **query)
        for index, event in enumerate(events):
            if event.event_id in hidden:
                return events[:index]  # a prefix of the log, never a gap
        return events

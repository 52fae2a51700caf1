"""Lifecycle events of turns.

The runner delivers every event synchronously to listeners in its own process. Beyond the
process, durable events (every type but MODEL_DELTA and TOOL_PROGRESS) are written to the
turn store together with the save that caused them, and ephemeral ones go through a live
channel; `agent_runner.feed.EventFeed` merges the two for subscribers.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import Field

from agent_runner._base import FrozenModel
from agent_runner.ids import new_id, utcnow


class AgentEventType(StrEnum):
    """What happened."""

    TURN_STARTED = "TURN_STARTED"
    TURN_RUNNING = "TURN_RUNNING"
    """A runner took a READY turn and is stepping it: it is no longer queued."""
    TURN_SUSPENDED = "TURN_SUSPENDED"
    TURN_RESUMED = "TURN_RESUMED"
    RETRY_SCHEDULED = "RETRY_SCHEDULED"
    MODEL_DELTA = "MODEL_DELTA"
    MODEL_RESPONSE = "MODEL_RESPONSE"
    TOOL_STARTED = "TOOL_STARTED"
    TOOL_PROGRESS = "TOOL_PROGRESS"
    TOOL_COMPLETED = "TOOL_COMPLETED"
    TURN_COMPLETED = "TURN_COMPLETED"
    TURN_FAILED = "TURN_FAILED"
    TURN_CANCELLED = "TURN_CANCELLED"
    MAX_ITERATIONS_REACHED = "MAX_ITERATIONS_REACHED"
    MAX_STEPS_REACHED = "MAX_STEPS_REACHED"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    CHAT_MEMORY_ERROR = "CHAT_MEMORY_ERROR"
    """Projecting a saved turn into ChatMemory failed; the turn is fine and projection is retried."""
    DEADLINE_APPROACHING = "DEADLINE_APPROACHING"
    """A waiting approval or form is most of the way to its deadline (emitted once, for reminders).

    `data` holds `correlation_id`, `suspension_type`, `deadline` and `on_timeout`."""
    MESSAGE_QUEUED = "MESSAGE_QUEUED"
    """A user message was queued behind a busy conversation (a message event: its turn does not exist yet).

    `turn_id` (and `root_turn_id`) is the id the turn started from it will have, whose
    TURN_STARTED names the message in `queued_message_id`."""
    MESSAGE_FAILED = "MESSAGE_FAILED"
    """A queued message was given up on: its turn will never start (a message event, filed like MESSAGE_QUEUED)."""
    TURN_QUEUED = "TURN_QUEUED"
    """A new turn waits for fair admission between tenants before its first step is sent (live only).

    `data` holds `place` (in its tenant's line, 1 = next) and `tenant_waiting`."""
    TURN_RECOVERING = "TURN_RECOVERING"
    """A worker took the turn over from one that died (or lost its lease) without saving anything.

    `data` holds `recoveries` (takeovers in a row without progress, this one included) and
    `max_recoveries` (past it, the turn ends FAILED)."""
    STEERING_ACCEPTED = "STEERING_ACCEPTED"
    """A steering message for the turn was stored (live only: any process accepts one, without a save).

    `data` holds `message_id` and `text`; the message joins the history before the turn's next model call."""
    STEERING_APPLIED = "STEERING_APPLIED"
    """Steering messages joined the turn's history as user messages, saved before the model call that reads them.

    `data` holds `message_ids`, in the order they were applied."""
    STEERING_NOT_APPLIED = "STEERING_NOT_APPLIED"
    """The turn ended before applying steering messages (live only: the turn's last save came first).

    `data` holds `message_ids`, `reason` and `next_turn_id`: the conversation's turn that took them, or
    null when none could (a cancelled turn, or one outside a conversation)."""

    @property
    def is_terminal(self) -> bool:
        """Whether the event marks the end of a turn."""
        return self in TERMINAL_EVENT_TYPES

    @property
    def is_durable(self) -> bool:
        """Whether events of this type are stored with the save that caused them.

        Only the types of `EPHEMERAL_EVENT_TYPES` are ephemeral: they stream
        through the live channel and are not kept beyond its retention. A client that missed
        deltas resynchronizes from MODEL_RESPONSE, which carries the whole text.
        """
        return self not in EPHEMERAL_EVENT_TYPES


TERMINAL_EVENT_TYPES = frozenset(
    {
        AgentEventType.TURN_COMPLETED,
        AgentEventType.TURN_FAILED,
        AgentEventType.TURN_CANCELLED,
        AgentEventType.MAX_ITERATIONS_REACHED,
        AgentEventType.MAX_STEPS_REACHED,
        AgentEventType.BUDGET_EXCEEDED,
    }
)

EPHEMERAL_EVENT_TYPES = frozenset(
    {
        AgentEventType.MODEL_DELTA,
        AgentEventType.TOOL_PROGRESS,
        AgentEventType.CHAT_MEMORY_ERROR,
        AgentEventType.TURN_QUEUED,
        AgentEventType.STEERING_ACCEPTED,
        AgentEventType.STEERING_NOT_APPLIED,
    }
)
"""Event types that go only through the live channel.

CHAT_MEMORY_ERROR reports a projection that failed after the snapshot was saved, so there is
no save to write it with; it is an operator's signal, live only, like the deltas. TURN_QUEUED
is decided by the admission after the turn was saved, so it has no save either; the turn's
TURN_RUNNING marks the end of the wait in the log. STEERING_ACCEPTED is written by any process
without the turn's lease and STEERING_NOT_APPLIED after its last save; the steering messages
themselves are durable in the turn store, and STEERING_APPLIED is saved with the history they join."""

MESSAGE_EVENT_TYPES = frozenset({AgentEventType.MESSAGE_QUEUED, AgentEventType.MESSAGE_FAILED})
"""Event types of a queued message rather than of a turn: written by the inbox, not by a runner's save.

They are filed under the id of the turn the message starts as, and are read in their
conversation's feed only (not in the turn tree's). Their `data` has no turn `status` or `version`."""

DURABLE_EVENT_TYPES = frozenset(AgentEventType) - EPHEMERAL_EVENT_TYPES
"""Event types written to the turn store atomically with the save that caused them."""


class AgentEvent(FrozenModel):
    """One lifecycle event of a turn."""

    event_id: str = Field(default_factory=new_id)
    type: AgentEventType
    turn_id: str
    root_turn_id: str | None = None
    conversation_id: str | None = None
    tenant_id: str | None = None
    """The tenant of the event's turn (None without tenants): with `conversation_id`, it names the conversation."""
    timestamp: datetime = Field(default_factory=utcnow)
    data: dict[str, Any] = Field(default_factory=dict)
    cursor: str | None = None
    """The event's position in the feed it was read from (opaque; resume with `after=cursor`).

    None on events that come straight from a runner."""


AgentEventListener = Callable[[AgentEvent], None]
"""A function called with every event; it should return quickly and must not drive the runner."""

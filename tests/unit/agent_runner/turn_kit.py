"""Shared building blocks of the agent_runner unit tests: recording store, fake clock, event log, checks."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import ValidationError

from agent_runner import (
    Agent,
    AgentEvent,
    AgentEventType,
    AgentFormDefinition,
    AgentRunner,
    AgentToolContext,
    AgentTurn,
    AgentTurnStatus,
    AgentUserInputTool,
    AiMessage,
    AnyMessage,
    ChatMemoryProvider,
    InMemoryAgentLoader,
    InMemoryAgentTurnStore,
    ScriptedChatModel,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    tool,
)
from agent_runner.event_payloads import payload_of
from agent_runner.persistence import TurnRef

TICKET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "affected_system": {"type": "string", "minLength": 1},
        "impact_scope": {"enum": ["ONE_USER", "ALL_USERS"]},
    },
    "required": ["affected_system", "impact_scope"],
    "additionalProperties": False,
}
TICKET_FORM = AgentFormDefinition(
    key="support_ticket_details", description="Details of the incident to report", schema=TICKET_SCHEMA
)
VALID_TICKET = {"affected_system": "login", "impact_scope": "ALL_USERS"}

START = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)


class RecordingStore(InMemoryAgentTurnStore):
    """An in-memory turn store that keeps every snapshot it saved, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.saved: list[AgentTurn] = []
        self._record = threading.Lock()

    def save(self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent] = ()) -> AgentTurn:
        stored = super().save(turn, expected_version, events)
        with self._record:
            self.saved.append(stored)
        return stored

    def saves_of(self, turn_id: str) -> list[AgentTurn]:
        with self._record:
            return [t for t in self.saved if t.id == turn_id]


class CountingPolls(InMemoryAgentTurnStore):
    """An in-memory store that counts the polls of the workers on it (`list_runnable` calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.polls = 0

    def list_runnable(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        self.polls += 1
        return super().list_runnable(now, limit)


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, now: datetime = START) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def poll_until_settled(
    runner: AgentRunner, clock: FakeClock, turn: AgentTurn, check: Callable[[AgentTurn], None]
) -> tuple[AgentTurn, list[float]]:
    """Move `clock` to each due poll of a turn that waits for work elsewhere and step it; the waits seen.

    `check` is called on each waiting snapshot; stepping before a poll is due must do nothing.
    """
    delays = []
    while turn.status is AgentTurnStatus.RETRY_SCHEDULED:
        check(turn)
        assert turn.next_retry_at is not None
        delays.append((turn.next_retry_at - clock()).total_seconds())
        assert runner.run_until_blocked(turn).status is AgentTurnStatus.RETRY_SCHEDULED, "not due yet: nothing runs"
        clock.advance(delays[-1])
        turn = runner.run_until_blocked(runner.restore(turn.id))
    return turn, delays


MISSHAPEN_EVENTS: list[tuple[AgentEvent, str]] = []
"""Events an `EventLog` received whose data does not validate against their payload model.

The runner swallows what a listener raises, so the log records them here instead and the
`_events_have_their_payload_shape` fixture fails the test that emitted them."""


class EventLog:
    """An event listener that keeps what it receives and checks each event's data against its payload model."""

    def __init__(self) -> None:
        self.events: list[AgentEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: AgentEvent) -> None:
        try:
            payload_of(event)
        except ValidationError as exc:
            MISSHAPEN_EVENTS.append((event, str(exc)))
        with self._lock:
            self.events.append(event)

    def types(self, turn_id: str | None = None) -> list[AgentEventType]:
        return [e.type for e in self.events if turn_id is None or e.turn_id == turn_id]

    def of_type(self, event_type: AgentEventType) -> list[AgentEvent]:
        return [e for e in self.events if e.type is event_type]


def protocol_violations(messages: Sequence[AnyMessage], pending_ids: Collection[str] = ()) -> list[str]:
    """Describe every break of the tool-call protocol in a model-visible history.

    Each assistant tool call must be answered by exactly one ToolMessage before the next
    user or assistant message; only the calls in `pending_ids` (of the last assistant
    message) may still be unanswered at the end.
    """
    problems: list[str] = []
    open_calls: dict[str, str] = {}
    seen_calls: set[str] = set()
    for index, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            if message.tool_call_id not in open_calls:
                problems.append(f"#{index}: ToolMessage for {message.tool_call_id!r} answers no open call")
            else:
                del open_calls[message.tool_call_id]
            continue
        if open_calls:
            problems.append(f"#{index}: {message.role} message while {sorted(open_calls)} are unanswered")
            open_calls.clear()
        if isinstance(message, AiMessage):
            for call in message.tool_calls:
                if call.id in seen_calls:
                    problems.append(f"#{index}: tool call id {call.id!r} used twice")
                seen_calls.add(call.id)
                open_calls[call.id] = call.name
        elif not isinstance(message, UserMessage | SystemMessage):
            problems.append(f"#{index}: {type(message).__name__} is not a model message")
    missing = set(open_calls) - set(pending_ids)
    if missing:
        problems.append(f"calls {sorted(missing)} were never answered")
    stray = set(pending_ids) - set(open_calls)
    if stray:
        problems.append(f"pending calls {sorted(stray)} are answered or unknown")
    return problems


def tool_messages(turn: AgentTurn) -> list[ToolMessage]:
    """The ToolMessages of a turn, in order."""
    return [m for m in turn.messages if isinstance(m, ToolMessage)]


def ai_messages(turn: AgentTurn) -> list[AiMessage]:
    """The assistant messages of a turn, in order."""
    return [m for m in turn.messages if isinstance(m, AiMessage)]


@dataclass
class TicketScenario:
    """The support-ticket agent: a form, then an approved ticket creation, then a final answer."""

    runner: AgentRunner
    store: RecordingStore
    loader: InMemoryAgentLoader
    model: ScriptedChatModel
    agent: Agent
    events: EventLog
    ticket_keys: list[str] = field(default_factory=list)
    """Idempotency keys of the ticket creations that ran."""
    ticket_arguments: list[dict[str, str]] = field(default_factory=list)


def ticket_scenario(chat_memory_provider: ChatMemoryProvider | None = None) -> TicketScenario:
    """Build the support-ticket agent on a recording store; nothing runs yet."""
    keys: list[str] = []
    arguments: list[dict[str, str]] = []

    @tool(requires_approval=True)
    def create_ticket(affected_system: str, impact_scope: Literal["ONE_USER", "ALL_USERS"]) -> str:
        """Create an incident ticket."""
        keys.append(AgentToolContext.current().get_idempotency_key())
        arguments.append({"affected_system": affected_system, "impact_scope": impact_scope})
        return "T-1"

    model = ScriptedChatModel(
        [
            AiMessage(
                tool_calls=[ToolCall(id="c1", name="request_user_input", arguments={"formKey": TICKET_FORM.key})]
            ),
            AiMessage(tool_calls=[ToolCall(id="c2", name="create_ticket", arguments=VALID_TICKET)]),
            AiMessage(content="Ticket T-1 created."),
        ]
    )
    agent = Agent(
        id="support-agent",
        instructions="Help with incidents.",
        chat_model=model,
        tools=[AgentUserInputTool(forms=[TICKET_FORM]), create_ticket],
    )
    store = RecordingStore()
    loader = InMemoryAgentLoader([agent])
    runner = AgentRunner(turn_store=store, agent_loader=loader, chat_memory_provider=chat_memory_provider)
    events = EventLog()
    runner.add_event_listener(events)
    return TicketScenario(runner, store, loader, model, agent, events, keys, arguments)

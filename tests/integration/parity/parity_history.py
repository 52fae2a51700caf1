"""The saved history of a turn tree, read back from the stores and written so two runs can be compared.

Everything a run leaves behind goes in: the turns' final states, their model-visible
messages, their page actions, the conversation's ChatMemory timeline, the durable events
read with `read_events(EventScope.tree(...))`, and the side effects the tools made. Ids that are
random on every run are replaced: the root turn becomes `T`, its children `T.1`, `T.2` (in
the order of the calls that created them), also inside message ids, page message ids and
texts. Timestamps are left out. Whatever cannot be right on any path (an event stored
twice, a tool call answered twice) is listed in `problems`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

from agent_runner import (
    AgentActionMessage,
    AgentEvent,
    AgentFormMessage,
    AgentTurn,
    AiMessage,
    AnyMessage,
    ChatMemoryProvider,
    PageAction,
    SystemMessage,
    ToolMessage,
    UserMessage,
)
from agent_runner.persistence import EventScope
from store import SqlAgentTurnStore
from tests.helpers.jsonl import read_jsonl
from tests.integration.embedded_worker.embedded_fleet import history_problems
from tests.integration.parity.parity_agents import Signals

EVENT_PAGE = 500


@dataclass(frozen=True)
class SavedHistory:
    """What a run of one scenario saved, with random ids replaced (see the module docstring)."""

    turns: dict[str, str]
    """Each turn of the tree: agent, final status, version, steps, and error if any."""
    messages: dict[str, list[str]]
    """Each turn's model-visible messages, one line each."""
    page_actions: dict[str, list[str]]
    """Each turn's page actions: status, who decided, and why."""
    timeline: list[str]
    """The conversation's ChatMemory, oldest first: model messages and page messages with their state."""
    events: dict[str, list[str]]
    """Each turn's durable events in the order the log returns them, as `v<version of their save> <type>`."""
    effects: list[str]
    """Each side effect: the attempts that made it and how many idempotency keys they used."""
    problems: list[str]
    """Broken invariants: duplicated or missing events, unanswered or twice-answered tool calls."""


def read_history(
    turn_store: SqlAgentTurnStore, memories: ChatMemoryProvider, signals: Signals, root_turn_id: str
) -> SavedHistory:
    """Read the saved history of the turn tree rooted at `root_turn_id` (a conversation turn)."""
    problems: list[str] = []
    tree = _tree(turn_store, turn_store.load(root_turn_id), "T", problems)
    names = {turn.id: name for name, turn in tree.items()}
    root = tree["T"]
    assert root.conversation_id is not None, "the parity scenarios run in a conversation"

    def plain(text: str) -> str:
        for turn_id, name in sorted(names.items(), key=lambda item: -len(item[0])):
            text = text.replace(turn_id, name)
        return text

    events = _read_events(turn_store, root_turn_id)
    problems += [plain(problem) for problem in _event_problems(events, names)]
    for name, turn in tree.items():
        problems += [f"{name}: {plain(problem)}" for problem in history_problems(turn)]
    per_turn: dict[str, list[str]] = defaultdict(list)
    for event in events:
        per_turn[names.get(event.turn_id, event.turn_id)].append(f"v{event.data.get('version')} {event.type}")
    return SavedHistory(
        turns={name: plain(_turn_line(turn)) for name, turn in tree.items()},
        messages={name: [plain(_message_line(m)) for m in turn.messages] for name, turn in tree.items()},
        page_actions={
            name: [plain(_action_line(action)) for action in turn.page_actions]
            for name, turn in tree.items()
            if turn.page_actions
        },
        timeline=[plain(_message_line(m)) for m in memories(root.conversation_id).get_messages(1000)],
        events=dict(per_turn),
        effects=_effect_lines(signals, names),
        problems=problems,
    )


def _tree(turn_store: SqlAgentTurnStore, turn: AgentTurn, name: str, problems: list[str]) -> dict[str, AgentTurn]:
    """The turn and its descendants by placeholder; children found by link and by parent id must agree."""
    tree = {name: turn}
    linked = [link.child_turn_id for link in turn.children]
    stored = {child.id for child in turn_store.list_turns(parent_turn_id=turn.id, limit=1000)}
    if set(linked) != stored or len(linked) != len(stored):
        problems.append(f"{name}: links to children {linked}, but the store holds children {sorted(stored)}")
    for index, child_id in enumerate(linked, start=1):
        tree.update(_tree(turn_store, turn_store.load(child_id), f"{name}.{index}", problems))
    return tree


def _read_events(turn_store: SqlAgentTurnStore, root_turn_id: str) -> list[AgentEvent]:
    events: list[AgentEvent] = []
    cursor: str | None = None
    while page := turn_store.read_events(EventScope.tree(root_turn_id), after=cursor, limit=EVENT_PAGE):
        events += page
        cursor = page[-1].cursor
    return events


def _event_problems(events: list[AgentEvent], names: dict[str, str]) -> list[str]:
    """Events stored twice, outside the tree, or with gaps in the events of one save."""
    problems: list[str] = []
    seen: set[str] = set()
    by_save: dict[tuple[str, int], list[int]] = defaultdict(list)
    for event in events:
        if event.event_id in seen:
            problems.append(f"event {event.event_id} ({event.type}) was read twice")
        seen.add(event.event_id)
        if event.turn_id not in names:
            problems.append(f"event {event.event_id} belongs to turn {event.turn_id}, outside the tree")
        # Event ids are `<turn id>:<version of the save>:<position in the save>`.
        turn_id, version, index = event.event_id.rsplit(":", 2)
        if turn_id != event.turn_id or int(version) != event.data.get("version"):
            problems.append(f"event {event.event_id} does not name its turn and save")
        by_save[(turn_id, int(version))].append(int(index))
    for (saved_turn, saved_version), indexes in by_save.items():
        if sorted(indexes) != list(range(len(indexes))):
            problems.append(f"the save of {saved_turn} to version {saved_version} has events {sorted(indexes)}")
    return problems


def _turn_line(turn: AgentTurn) -> str:
    line = f"{turn.agent_id} {turn.status} v{turn.version} steps={turn.steps}"
    return f"{line} error={turn.error!r}" if turn.error else line


def _message_line(message: AnyMessage) -> str:
    match message:
        case UserMessage() | SystemMessage():
            return f"{message.id} {message.role}: {message.content}"
        case AiMessage():
            parts = [f"{message.id} assistant"]
            if message.content is not None:
                parts.append(f": {message.content}")
            if message.tool_calls:
                calls = "; ".join(
                    f"{call.id} {call.name}({json.dumps(call.arguments, sort_keys=True)})"
                    for call in message.tool_calls
                )
                parts.append(f" calls {calls}")
            return "".join(parts)
        case ToolMessage():
            error = " (error)" if message.is_error else ""
            return f"{message.id} tool {message.tool_call_id} {message.tool_name}{error}: {message.content}"
        case AgentActionMessage():
            return (
                f"{message.id} approval {message.action_id} {message.tool_name} v{message.version} {_decided(message)}"
            )
        case AgentFormMessage():
            return f"{message.id} form {message.action_id} {message.form_key} v{message.version} {_decided(message)}"
    raise AssertionError(f"unexpected message {message!r}")


def _decided(message: AgentActionMessage | AgentFormMessage) -> str:
    line = f"{message.status} by {message.decided_by}"
    return f"{line}: {message.reason}" if message.reason else line


def _action_line(action: PageAction) -> str:
    # `synced` is left out: it marks what a runner knows it projected, and a worker that
    # reloads the turn between two steps (a Celery task's step budget) knows less than one
    # that goes on from the snapshot in hand. The timeline shows what ChatMemory really holds.
    decision = action.decision
    line = f"{action.message_id} {action.kind} {action.action_id} {action.status} by {decision.get('decided_by')}"
    return f"{line}: {decision['reason']}" if decision.get("reason") else line


def _effect_lines(signals: Signals, names: dict[str, str]) -> list[str]:
    """Side effects of the tree's tool calls, by effect: the attempts that made it, and their keys."""
    attempts: dict[str, list[int]] = defaultdict(list)
    keys: dict[str, set[str]] = defaultdict(set)
    for record in read_jsonl(signals.effects):
        if record["key"].split(":", 1)[0] in names:
            attempts[record["effect"]].append(record["attempt"])
            keys[record["effect"]].add(record["key"])
    return [
        f"{effect}: made by attempts {attempts[effect]} under {len(keys[effect])} idempotency key(s)"
        for effect in sorted(attempts)
    ]

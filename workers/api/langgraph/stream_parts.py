"""The stream of a run: the events of its turn tree, from the event feed, as LangGraph stream parts.

Each `AgentEvent` of the tree becomes zero or more parts, in the stream modes asked for:

- `values`: the thread's messages after a model answer, a tool result, the start and the
  end of the turn (`{"messages": [...]}`), and `{"__interrupt__": [...]}` when it waits;
- `updates`: `{"model": {"messages": [ai]}}`, `{"tools": {"messages": [tool]}}` and
  `{"__interrupt__": [...]}`;
- `messages-tuple`: `[message chunk, metadata]`: each piece of streamed text as an
  `AIMessageChunk` (and at the answer the part its deltas did not bring), a whole answer
  that streamed no deltas, each tool message;
- `messages`: `messages/metadata` once per message, `messages/partial` with the answer so
  far at each delta, `messages/complete` with each whole AI or tool message;
- `custom`: the data a tool reports with `report_progress`;
- `events` and `debug`: see `workers.api.langgraph.run_events`.

The text of model calls, their tool calls and the tool results come from the steps of
`workers.api.protocols.steps`, the translation the other chat protocols use too: a model
call re-run after its worker died streams its text once, and a client that missed deltas
still gets the whole text.

Child turns (sub-agents) appear only with `stream_subgraphs`, under the namespace
`<agent id>:<turn id>` (`event: values|helper:<turn id>`). A run ends when its turn ends
(`event: error` first when it failed) or waits for a person; then `event: end`.

The SSE id of an event's last part is the feed cursor of that event, so a client that
reconnects with `Last-Event-ID` (`join_stream(last_event_id=...)`) gets exactly the parts
of the events after it: nothing is missed and nothing repeated. An event's parts are sent
in one write. States are rebuilt from the turn's stored messages up to the message each
event names, so a replay shows the same values as the live stream did.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from anyio import CancelScope
from anyio.to_thread import run_sync

from agent_runner import (
    AgentEvent,
    AgentEventType,
    AgentRunnerError,
    AgentTurn,
    AiMessage,
    AnyMessage,
    SuspensionType,
    ToolMessage,
    TurnNotFound,
)
from agent_runner.ids import utcnow
from agent_runner.snapshot import WAITING_FOR_A_PERSON
from workers.api.event_streams import KEEPALIVE_S, follow_tree
from workers.api.langgraph.mapping import (
    build_interrupt,
    langchain_message,
    langchain_messages,
    message_chunk,
)
from workers.api.langgraph.run_events import MODEL_NODE, TOOLS_NODE, DebugSteps, next_node, run_event
from workers.api.protocols import steps
from workers.api.protocols.steps import TurnContent, TurnTranslator
from workers.api.runtime import Runtime
from workers.views import ArgumentMask, catalog_mask, find_agent

E = AgentEventType

logger = logging.getLogger("workers.api")

SUPPORTED_MODES = ("values", "updates", "messages-tuple", "messages", "custom", "events", "debug")

DISCONNECT_REASON = "the client left the run's stream (on_disconnect=cancel)"

SETTLED_S = 1.0
"""How long a run must have waited for a person before a stream that read no interrupt ends on it."""

HISTORY_MESSAGES = 10_000

_PERSON = frozenset(t.value for t in SuspensionType if t.waits_for_a_person)


def sse(event: str, data: Any, event_id: str | None = None) -> str:
    """One server-sent event."""
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class RunTranslator:
    """Turns the events of one run's turn tree into LangGraph stream parts (called on a worker thread).

    Text, tool calls and tool results come from the protocol-neutral steps of each turn
    (`workers.api.protocols.steps`, one `TurnTranslator` per turn of the tree); the states
    (`values`, `updates`) and interrupts are read from the turn at the message each event names.

    Args:
        runtime: The server's backends.
        root: The run's turn.
        thread_id: The thread as the client knows it.
        modes: The stream modes asked for.
        subgraphs: Whether child turns are streamed (under their namespaces).
    """

    def __init__(self, runtime: Runtime, root: AgentTurn, thread_id: str, modes: list[str], subgraphs: bool) -> None:
        self.runtime = runtime
        self.root_id = root.id
        self.thread_id = thread_id
        self.modes = set(modes)
        self.subgraphs = subgraphs
        self.mask: ArgumentMask = catalog_mask(runtime.agent_loader)
        self.content = TurnContent(runtime.turn_store.load, self.mask)
        self._older: list[AnyMessage] = []
        if root.conversation_id is not None:
            # What the conversation held before this turn: the history up to the turn's first
            # message. Messages the turn added after `root` was read (a worker may be steps
            # ahead of it) are projected after that one, so they are cut off with it.
            own = {m.id for m in root.messages}
            history = runtime.memories(root.conversation_id, root.tenant_id).get_model_messages(HISTORY_MESSAGES)
            first = next((index for index, m in enumerate(history) if m.id in own), len(history))
            self._older = list(history[:first])
        self._steps: dict[str, TurnTranslator] = {}
        self._upto: dict[str, int] = {}
        self._streaming: set[str] = set()
        """Turns whose current model call streamed text from its deltas."""
        self._model_call: dict[str, str] = {}
        """The run id of each turn's current model call (`<turn>:model-<n>`)."""
        self._partial: dict[str, str] = {}
        self._named: set[str] = set()
        self.debug = DebugSteps(thread_id)
        self.waiting = False
        """The root turn waits for a person: the run is over for now."""
        self.failed = False

    def _turn(self, turn_id: str, *, fresh: bool) -> AgentTurn:
        turn = self.content.turn(turn_id, fresh=fresh)
        if turn is None:
            raise TurnNotFound(turn_id)
        return turn

    def settled_since_before(self, seconds: float) -> bool:
        """Whether the root turn has ended, or waited for a person, for more than `seconds`.

        A stream that joins after the interrupt or the end went out reads no such event; it
        ends on this. The margin leaves time for the save's events, committed with the status
        read here, to reach the stream through its own reads first.
        """
        ref = self.runtime.turn_store.get_ref(self.root_id)
        if not ref.status.is_terminal and ref.status not in WAITING_FOR_A_PERSON:
            return False
        return (utcnow() - ref.updated_at).total_seconds() > seconds

    def _namespace(self, event: AgentEvent) -> str | None:
        """'' for the root, `<agent>:<turn>` for a child turn, None when children are not streamed."""
        if event.turn_id == self.root_id:
            return ""
        if not self.subgraphs:
            return None
        try:
            agent_id = self._turn(event.turn_id, fresh=False).agent_id
        except TurnNotFound:
            return None
        return f"{agent_id}:{event.turn_id}"

    def _values(self, turn: AgentTurn, upto: int) -> dict[str, Any]:
        older = self._older if turn.id == self.root_id else []
        return {"messages": langchain_messages([*older, *turn.messages[: upto + 1]], self.mask)}

    def _metadata(self, event: AgentEvent) -> dict[str, Any]:
        node = TOOLS_NODE if event.type is E.TOOL_COMPLETED else MODEL_NODE
        return {"run_id": event.turn_id, "thread_id": self.thread_id, "langgraph_node": node}

    def _parents(self, turn_id: str) -> list[str]:
        """The turns enclosing `turn_id` and the turn itself, outermost first (up to the run's turn)."""
        lineage = [turn_id]
        while lineage[0] != self.root_id:
            turn = self.content.turn(lineage[0])
            if turn is None or turn.parent_turn_id is None:
                break
            lineage.insert(0, turn.parent_turn_id)
        return lineage

    def _event(self, event: AgentEvent, kind: str, name: str, run_id: str, data: dict[str, Any]) -> tuple[str, Any]:
        parents = self._parents(event.turn_id)
        if run_id == event.turn_id:
            parents = parents[:-1]
        return ("events", run_event(kind, name, run_id, data, self._metadata(event), parents))

    def parts(self, event: AgentEvent) -> list[tuple[str, Any]]:
        """The `(event name without namespace, data)` parts of one event, with the namespace applied."""
        namespace = self._namespace(event)
        if namespace is None:
            return []
        found = self._parts(event, namespace)
        return [(f"{name}|{namespace}" if namespace else name, data) for name, data in found]

    def _steps_of(self, event: AgentEvent) -> list[steps.Step]:
        translator = self._steps.get(event.turn_id)
        if translator is None:
            translator = self._steps[event.turn_id] = TurnTranslator(event.turn_id, self.content)
        return translator.translate(event)

    def _parts(self, event: AgentEvent, namespace: str) -> list[tuple[str, Any]]:
        parts: list[tuple[str, Any]] = []
        modes = self.modes
        if event.type is E.MODEL_DELTA:
            return self._text(event, self._steps_of(event), streaming=True)
        if event.type is E.TOOL_PROGRESS:
            progress = event.data.get("progress")
            if "custom" in modes:
                parts.append(("custom", progress))
            if "events" in modes:
                name, call = str(event.data.get("tool_name")), str(event.data.get("tool_call_id"))
                parts.append(self._event(event, "on_custom_event", name, call, {"data": progress}))
            return parts
        if event.type not in (E.TURN_STARTED, E.MODEL_RESPONSE, E.TOOL_COMPLETED, E.TURN_SUSPENDED) and not (
            event.type.is_terminal
        ):
            self._steps_of(event)  # keeps the turn's translator in step (a resume, say)
            return parts
        try:
            turn = self._turn(event.turn_id, fresh=True)
        except TurnNotFound:
            return parts
        found = self._steps_of(event)  # after the fresh read, so the steps find what the event names
        position = self._position(turn, event)
        if position is None:
            return parts
        self._upto[event.turn_id] = position
        if event.type is E.TURN_SUSPENDED:
            return self._suspended(turn, event, namespace)
        values = self._values(turn, position)
        if "values" in modes:
            parts.append(("values", values))
        message = turn.messages[position] if position < len(turn.messages) else None
        if event.type is E.TURN_STARTED:
            parts.extend(self._started(event, namespace, values, message))
        elif event.type is E.MODEL_RESPONSE and message is not None:
            parts.extend(self._text(event, found, streaming=event.turn_id in self._streaming))
            parts.extend(self._message_parts(event, message))
            parts.extend(self._answered(event, namespace, values, message, found))
        elif event.type is E.TOOL_COMPLETED and message is not None:
            parts.extend(self._message_parts(event, message))
            parts.extend(self._tool_ended(event, namespace, values, message, found))
        if event.type.is_terminal:
            parts.extend(self._ended(event, turn, namespace, values))
        return parts

    # --- Text and messages ---

    def _text(self, event: AgentEvent, found: list[steps.Step], *, streaming: bool) -> list[tuple[str, Any]]:
        """The parts of the model text steps of an event.

        Deltas go out as chunks (`messages-tuple`) and as the answer so far (`messages`);
        the part of the answer its deltas did not bring comes at the response as a chunk,
        unless no delta did (then the whole message is sent, see `_message_parts`).
        """
        parts: list[tuple[str, Any]] = []
        for step in found:
            if isinstance(step, steps.StepStarted):
                parts.extend(self._model_started(event, step.name))
            if not isinstance(step, steps.TextDelta):
                continue
            if "events" in self.modes:
                call = self._model_call.get(event.turn_id, event.turn_id)
                chunk = {"chunk": message_chunk(step.text_id, step.delta)}
                parts.append(self._event(event, "on_chat_model_stream", MODEL_NODE, call, chunk))
            if not streaming:
                continue
            self._streaming.add(event.turn_id)
            if "messages-tuple" in self.modes:
                parts.append(("messages", [message_chunk(step.text_id, step.delta), self._metadata(event)]))
            if "messages" in self.modes and event.type is E.MODEL_DELTA:
                so_far = self._partial[step.text_id] = self._partial.get(step.text_id, "") + step.delta
                parts.extend(self._announced(step.text_id, event))
                parts.append(("messages/partial", [{**message_chunk(step.text_id, so_far), "type": "ai"}]))
        return parts

    def _message_parts(self, event: AgentEvent, message: AnyMessage) -> list[tuple[str, Any]]:
        """The parts of a new AI or tool message in the `updates`, `messages-tuple` and `messages` modes."""
        shown = langchain_message(message, self.mask)
        if shown is None:
            return []
        parts: list[tuple[str, Any]] = []
        if "updates" in self.modes:
            node = MODEL_NODE if event.type is E.MODEL_RESPONSE else TOOLS_NODE
            parts.append(("updates", {node: {"messages": [shown]}}))
        streamed = event.type is E.MODEL_RESPONSE and event.turn_id in self._streaming
        if "messages-tuple" in self.modes and not streamed:
            parts.append(("messages", [shown, self._metadata(event)]))
        if "messages" in self.modes:
            parts.extend(self._announced(str(shown["id"]), event))
            parts.append(("messages/complete", [shown]))
        return parts

    def _announced(self, message_id: str, event: AgentEvent) -> list[tuple[str, Any]]:
        """The `messages/metadata` part of a message the `messages` mode has not named yet."""
        if message_id in self._named:
            return []
        self._named.add(message_id)
        return [("messages/metadata", {message_id: {"metadata": self._metadata(event)}})]

    # --- The `events` and `debug` modes ---

    def _started(
        self, event: AgentEvent, namespace: str, values: dict[str, Any], message: AnyMessage | None
    ) -> list[tuple[str, Any]]:
        parts: list[tuple[str, Any]] = []
        if "events" in self.modes:
            shown = None if message is None else langchain_message(message, self.mask)
            data = {"input": {"messages": [] if shown is None else [shown]}}
            name = self._turn(event.turn_id, fresh=False).agent_id
            parts.append(self._event(event, "on_chain_start", name, event.turn_id, data))
        if "debug" in self.modes:
            parts.append(("debug", self.debug.checkpoint(event, namespace, values, next_nodes=[MODEL_NODE])))
        return parts

    def _model_started(self, event: AgentEvent, step_name: str) -> list[tuple[str, Any]]:
        call = self._model_call[event.turn_id] = f"{event.turn_id}:{step_name}"
        parts: list[tuple[str, Any]] = []
        if "events" in self.modes:
            parts.append(self._event(event, "on_chat_model_start", MODEL_NODE, call, {"input": {}}))
        if "debug" in self.modes:
            turn = self._turn(event.turn_id, fresh=False)
            task_input = self._values(turn, self._upto.get(event.turn_id, len(turn.messages) - 1))
            parts.append(("debug", self.debug.task(event, call, MODEL_NODE, task_input)))
        return parts

    def _answered(
        self, event: AgentEvent, namespace: str, values: dict[str, Any], message: AnyMessage, found: list[steps.Step]
    ) -> list[tuple[str, Any]]:
        """The `events` and `debug` parts of a model answer and of the tool calls it made."""
        self._streaming.discard(event.turn_id)
        call = self._model_call.pop(event.turn_id, event.turn_id)
        shown = langchain_message(message, self.mask)
        calls = [step for step in found if isinstance(step, steps.ToolCallAvailable)]
        parts: list[tuple[str, Any]] = []
        if "events" in self.modes:
            parts.append(self._event(event, "on_chat_model_end", MODEL_NODE, call, {"output": shown}))
            for tool in calls:
                data = {"input": tool.arguments}
                parts.append(self._event(event, "on_tool_start", tool.name, tool.call_id, data))
        if "debug" in self.modes:
            debug = self.debug
            parts.extend(("debug", part) for part in debug.task_result(event, call, [["messages", [shown]]]))
            next_nodes = [TOOLS_NODE] if calls else []
            parts.append(("debug", debug.checkpoint(event, namespace, values, next_nodes=next_nodes)))
            for tool in calls:
                task_input = {"name": tool.name, "args": tool.arguments, "id": tool.call_id}
                parts.append(("debug", debug.task(event, tool.call_id, TOOLS_NODE, task_input)))
        return parts

    def _tool_ended(
        self, event: AgentEvent, namespace: str, values: dict[str, Any], message: AnyMessage, found: list[steps.Step]
    ) -> list[tuple[str, Any]]:
        """The `events` and `debug` parts of a tool result."""
        shown = langchain_message(message, self.mask)
        parts: list[tuple[str, Any]] = []
        for result in (step for step in found if isinstance(step, steps.ToolResult)):
            if "events" in self.modes:
                data = {"output": shown}
                parts.append(self._event(event, "on_tool_end", result.name, result.call_id, data))
            if "debug" in self.modes:
                outcome = [["messages", [shown]]]
                parts.extend(("debug", part) for part in self.debug.task_result(event, result.call_id, outcome))
                next_nodes = [MODEL_NODE]
                parts.append(("debug", self.debug.checkpoint(event, namespace, values, next_nodes=next_nodes)))
        return parts

    def _ended(
        self, event: AgentEvent, turn: AgentTurn, namespace: str, values: dict[str, Any]
    ) -> list[tuple[str, Any]]:
        parts: list[tuple[str, Any]] = []
        completed = event.type is E.TURN_COMPLETED
        error = None if completed else turn.error or event.type.value
        if "events" in self.modes and completed:
            parts.append(self._event(event, "on_chain_end", turn.agent_id, event.turn_id, {"output": values}))
        if "debug" in self.modes and error is not None:
            # A completed turn's last checkpoint went out with its answer.
            parts.extend(("debug", part) for part in self.debug.failed(event, error))
            node = next_node(turn)
            checkpoint = self.debug.checkpoint(event, namespace, values, next_nodes=[node], error=error)
            parts.append(("debug", checkpoint))
        if event.turn_id == self.root_id and error is not None:
            self.failed = True
            parts.append(("error", {"error": event.type.value, "message": error}))
        return parts

    # --- States and interrupts ---

    def _position(self, turn: AgentTurn, event: AgentEvent) -> int | None:
        """Index of the last message of the state after `event` in `turn.messages`."""
        messages = turn.messages
        if event.type is E.MODEL_RESPONSE:
            wanted = event.data.get("message_id")
            return next((i for i, m in enumerate(messages) if isinstance(m, AiMessage) and m.id == wanted), None)
        if event.type is E.TOOL_COMPLETED:
            call = event.data.get("tool_call_id")
            newest_first = range(len(messages) - 1, -1, -1)
            return next(
                (i for i in newest_first if isinstance(m := messages[i], ToolMessage) and m.tool_call_id == call), None
            )
        if event.type is E.TURN_STARTED:
            return next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "user"), None)
        if event.type.is_terminal:
            return len(messages) - 1
        return self._upto.get(turn.id, len(messages) - 1)

    def _suspended(self, turn: AgentTurn, event: AgentEvent, namespace: str) -> list[tuple[str, Any]]:
        data = event.data
        if data.get("suspension_type") not in _PERSON:
            return []
        suspension = turn.suspension
        agent = find_agent(self.runtime.agent_loader, turn)
        form = None
        form_key = data.get("form_key")
        if form_key is not None and agent is not None and agent.user_input_tool is not None:
            form = next((f for f in agent.user_input_tool.forms if f.key == form_key), None)
        if suspension is not None and suspension.correlation_id == data.get("correlation_id"):
            form = suspension.form or form  # the schema frozen in the suspension wins
        interrupt = build_interrupt(
            turn,
            agent,
            suspension_type=SuspensionType(data["suspension_type"]),
            correlation_id=data.get("correlation_id"),
            message=str(data.get("message") or ""),
            form=form,
        )
        if event.turn_id == self.root_id:
            self.waiting = (
                turn.status in WAITING_FOR_A_PERSON
                and suspension is not None
                and suspension.correlation_id == data.get("correlation_id")
            )
        parts: list[tuple[str, Any]] = []
        if "values" in self.modes:
            parts.append(("values", {"__interrupt__": [interrupt]}))
        if "updates" in self.modes:
            parts.append(("updates", {"__interrupt__": [interrupt]}))
        if "debug" in self.modes:
            node = next_node(turn)
            values = self._values(turn, self._upto[turn.id])
            checkpoint = self.debug.checkpoint(event, namespace, values, next_nodes=[node], interrupts=[interrupt])
            parts.append(("debug", checkpoint))
        return parts


async def run_stream(
    runtime: Runtime,
    translator: RunTranslator,
    after: str | None,
    *,
    metadata: dict[str, Any] | None,
    cancel_on_disconnect: bool = False,
) -> AsyncIterator[str]:
    """The SSE text of a run's stream from the cursor `after` (see the module docstring).

    `metadata` (the `metadata` part) is sent first when given: on a new stream, not on a
    reconnect. The first read happens on the first `anext`, so a bad cursor raises there.
    With `cancel_on_disconnect`, a client that goes away before the end cancels the run.
    """
    # Quiet spells are short so that a stream joining a settled run ends soon; heartbeats
    # still go out only every KEEPALIVE_S.
    batches = aiter(follow_tree(runtime, translator.root_id, after, quiet_after=SETTLED_S))
    opened = ended = False
    try:
        first = await anext(batches)
        opened = True
        yield ": stream open\n\n"
        if metadata is not None:
            yield sse("metadata", metadata)
        batch: list[AgentEvent] | None = first
        last_sent = time.monotonic()
        while batch is not None:
            if batch:
                yield await run_sync(_render, translator, batch)
                last_sent = time.monotonic()
                if translator.waiting or translator.failed:
                    break
            elif await run_sync(translator.settled_since_before, SETTLED_S):
                break  # joined after the interrupt or the end went out: nothing more comes
            elif time.monotonic() - last_sent >= KEEPALIVE_S:
                yield ": heartbeat\n\n"
                last_sent = time.monotonic()
            batch = await anext(batches, None)
        ended = True
        yield sse("end", None)
    finally:
        close = getattr(batches, "aclose", None)
        if close is not None:
            await close()
        if cancel_on_disconnect and opened and not ended:
            # The response is being torn down (the client left): finish the cancel anyway.
            with CancelScope(shield=True):
                await run_sync(_cancel_left_run, runtime, translator.root_id)


def _cancel_left_run(runtime: Runtime, turn_id: str) -> None:
    try:
        if not runtime.turn_store.get_ref(turn_id).status.is_terminal:
            runtime.runner.cancel(turn_id, DISCONNECT_REASON)
    except AgentRunnerError as exc:
        logger.warning("could not cancel run %s after its client left: %s", turn_id, exc)


def _render(translator: RunTranslator, batch: list[AgentEvent]) -> str:
    texts: list[str] = []
    for event in batch:
        parts = translator.parts(event)
        for index, (name, data) in enumerate(parts):
            texts.append(sse(name, data, event.cursor if index == len(parts) - 1 else None))
        if translator.waiting or translator.failed:
            break
    return "".join(texts)

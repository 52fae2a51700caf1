"""From the runner's events to protocol-neutral steps: what a chat client needs to draw a turn.

Every client protocol (the AI SDK's UI message stream, AG-UI, the Agent Protocol) shows the
same things: text that streams in, tool calls with their arguments and results, a call
waiting for approval, a form to fill in, model steps, a worker taking the turn over after
another died ("recovering"), and how the turn ended. A
`TurnTranslator` turns the events of one turn tree (in feed order, from the event log and
the live channel) into those steps; each protocol module only writes them in its own words.

Events carry what happened, not everything a client shows: a MODEL_RESPONSE names its
message and the tools it called, a TOOL_COMPLETED the call. The arguments and results come
from the turn's snapshot through a `TurnContent`, read once and again only when it lacks
what an event refers to (messages are only ever appended, so what one read found stays
true).

Text: MODEL_DELTA events stream a model call's text, MODEL_RESPONSE carries all of it. The
translator sends each delta that extends the text already sent, and at the response the
part not sent yet, so a client that missed deltas (it came late, or they expired) still
gets the whole text, and one that saw a model call re-run after its worker died (the same
text streamed again) gets it once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent_runner import AgentEvent, AgentEventType, AgentTurn, AiMessage, ToolMessage, TurnNotFound
from agent_runner.suspensions import ResumeType, SuspensionType

# --- Steps --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepStarted:
    """A model step began (one model call and the tool calls it made)."""

    name: str


@dataclass(frozen=True)
class StepFinished:
    """The model step `name` ended."""

    name: str


@dataclass(frozen=True)
class TextStarted:
    """Assistant text begins; `text_id` names it in the deltas and the end."""

    text_id: str


@dataclass(frozen=True)
class TextDelta:
    """More assistant text."""

    text_id: str
    delta: str


@dataclass(frozen=True)
class TextEnded:
    """The assistant text `text_id` is complete."""

    text_id: str


@dataclass(frozen=True)
class ToolCallStarted:
    """The model called a tool; its arguments follow.

    `message_id` names the model call's assistant message in the stream: the same id as
    its text, so clients keep the text and the calls of one model call together.
    """

    call_id: str
    name: str
    message_id: str


@dataclass(frozen=True)
class ToolCallArgs:
    """A piece of the call's arguments as JSON text."""

    call_id: str
    delta: str


@dataclass(frozen=True)
class ToolCallAvailable:
    """The call's arguments are complete (masked where the tool marks them sensitive)."""

    call_id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    """The call's result: the ToolMessage the model reads."""

    call_id: str
    name: str
    content: str
    is_error: bool
    message_id: str


@dataclass(frozen=True)
class ApprovalRequested:
    """The call waits for a person to approve or reject it."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    message: str


@dataclass(frozen=True)
class ApprovalAnswered:
    """A person approved or rejected the call."""

    call_id: str
    approved: bool
    reason: str | None


@dataclass(frozen=True)
class FormRequested:
    """The turn waits for a form: data valid against `schema` answers the call `call_id`."""

    call_id: str
    key: str
    description: str
    schema: dict[str, Any]
    message: str


@dataclass(frozen=True)
class QuestionAsked:
    """The turn waits for a plain-text answer: the user's next message."""

    message: str


@dataclass(frozen=True)
class TurnFinished:
    """The turn ended without failing (`status` COMPLETED, CANCELLED or a limit) or waits for a person."""

    turn_id: str
    status: str
    usage: dict[str, Any]
    final_output: str | None
    waiting: bool
    """The turn is not over: it waits for the approval, form or answer sent just before."""


@dataclass(frozen=True)
class TurnFailed:
    """The turn failed."""

    turn_id: str
    status: str
    error: str
    usage: dict[str, Any]


@dataclass(frozen=True)
class Recovering:
    """A worker took the turn over from one that died without saving anything; the work goes on.

    `recoveries` counts such takeovers in a row; past `max_recoveries` the turn fails.
    """

    recoveries: int
    max_recoveries: int


Step = (
    StepStarted
    | StepFinished
    | TextStarted
    | TextDelta
    | TextEnded
    | ToolCallStarted
    | ToolCallArgs
    | ToolCallAvailable
    | ToolResult
    | ApprovalRequested
    | ApprovalAnswered
    | FormRequested
    | QuestionAsked
    | TurnFinished
    | TurnFailed
    | Recovering
)
"""One protocol-neutral step of a turn."""


def ends_stream(step: Step) -> bool:
    """Whether a client's stream of the turn ends after `step` (the turn ended, or waits for a person)."""
    return isinstance(step, TurnFinished | TurnFailed)


# --- Turn content -------------------------------------------------------------------------------


class TurnContent:
    """The messages of the turns of one tree, read from their snapshots when an event needs them.

    Args:
        load: Reads a turn's snapshot (the turn store's `load`).
        mask: The arguments of a call as they may be shown.
    """

    def __init__(self, load: Callable[[str], AgentTurn], mask: Callable[[Any], dict[str, Any]]) -> None:
        self.load = load
        self.mask = mask
        self._turns: dict[str, AgentTurn] = {}

    def turn(self, turn_id: str, *, fresh: bool = False) -> AgentTurn | None:
        """The turn's snapshot (read again when `fresh`); None when it is gone."""
        if fresh or turn_id not in self._turns:
            try:
                self._turns[turn_id] = self.load(turn_id)
            except TurnNotFound:
                return None
        return self._turns[turn_id]

    def ai_message(self, turn_id: str, message_id: str) -> AiMessage | None:
        """The model message `message_id` of the turn."""
        return self._message(turn_id, AiMessage, lambda m: m.id == message_id)

    def tool_message(self, turn_id: str, call_id: str) -> ToolMessage | None:
        """The result of the call `call_id` in the turn, once written."""
        return self._message(turn_id, ToolMessage, lambda m: m.tool_call_id == call_id)

    def _message(self, turn_id: str, kind: type[_M], match: Callable[[_M], bool]) -> _M | None:
        """The newest message of `kind` that `match`es, in the snapshot read before or else in a fresh one."""
        for fresh in (False, True):
            turn = self.turn(turn_id, fresh=fresh)
            found = None if turn is None else _find(turn, kind, match)
            if found is not None:
                return found
        return None

    def call(self, turn_id: str, call_id: str) -> tuple[str, dict[str, Any]] | None:
        """The name and masked arguments of the call `call_id` of the turn."""
        for fresh in (False, True):
            turn = self.turn(turn_id, fresh=fresh)
            if turn is None:
                return None
            for message in turn.messages:
                if isinstance(message, AiMessage):
                    for call in message.tool_calls:
                        if call.id == call_id:
                            return call.name, self.mask(call)
        return None


def _find(turn: AgentTurn, kind: type[_M], match: Callable[[_M], bool]) -> _M | None:
    return next((m for m in reversed(turn.messages) if isinstance(m, kind) and match(m)), None)


_M = TypeVar("_M", AiMessage, ToolMessage)

_TOOL_DECISIONS = frozenset(t.value for t in SuspensionType if t.is_tool_decision)
"""`suspension_type` of TURN_SUSPENDED events that ask a person about a tool call."""


# --- Translation --------------------------------------------------------------------------------


@dataclass
class _ModelCall:
    """The text of the model call streaming now: what the client was sent, and the current attempt's text."""

    text_id: str
    step: str
    sent: str = ""
    attempt: tuple[Any, Any] | None = None
    attempt_text: str = ""
    text_open: bool = False


@dataclass
class TurnTranslator:
    """Turns the events of one turn tree, in feed order, into `Step`s.

    Only the root turn's events are shown: a sub-agent's work reaches the client as the
    result of its delegation call. The translator may start anywhere in the turn's events
    (a client continuing after a decision); `reopen` then tells a client that missed the
    start of the text streaming now what it was.

    Args:
        root_turn_id: The turn whose events are translated.
        content: Where arguments and results are read.
    """

    root_turn_id: str
    content: TurnContent
    _call: _ModelCall | None = None
    _steps: int = 0
    _open_step: str | None = None
    _shown_calls: set[str] = field(default_factory=set)
    _finished: bool = False

    def translate(self, event: AgentEvent) -> list[Step]:
        """The steps of one event (none for events a client does not show)."""
        if event.turn_id != self.root_turn_id or self._finished:
            return []
        kind = event.type
        data = event.data
        if kind is AgentEventType.MODEL_DELTA:
            return self._delta(data)
        if kind is AgentEventType.MODEL_RESPONSE:
            return self._response(data)
        if kind is AgentEventType.TOOL_COMPLETED:
            return self._tool_result(str(data.get("tool_call_id")))
        if kind is AgentEventType.TURN_RESUMED:
            return self._resumed(data)
        if kind is AgentEventType.TURN_SUSPENDED:
            return self._suspended(data)
        if kind is AgentEventType.TURN_RECOVERING:
            return [Recovering(int(data.get("recoveries") or 0), int(data.get("max_recoveries") or 0))]
        if kind.is_terminal:
            return self._ended(event)
        return []

    def reopen(self) -> list[Step]:
        """Steps that show the model call streaming now as if from its start (for a client joining mid-call)."""
        call = self._call
        if call is None or not call.text_open:
            return []
        return [StepStarted(call.step), TextStarted(call.text_id), TextDelta(call.text_id, call.sent)]

    def close(self) -> list[Step]:
        """Steps that close what is open when a stream stops before the turn ends (a dropped follow)."""
        out: list[Step] = []
        call = self._call
        if call is not None and call.text_open:
            out.append(TextEnded(call.text_id))
            call.text_open = False
        if self._open_step is not None:
            out.append(StepFinished(self._open_step))
            self._open_step = None
        return out

    # --- Model calls ---

    def _start_call(self, version: Any) -> list[Step]:
        out = self._finish_step()
        self._steps += 1
        name = f"model-{self._steps}"
        self._call = _ModelCall(text_id=f"{self.root_turn_id}:text:{version}", step=name)
        self._open_step = name
        out.append(StepStarted(name))
        return out

    def _delta(self, data: dict[str, Any]) -> list[Step]:
        text = str(data.get("delta") or "")
        out: list[Step] = []
        if self._call is None:
            out.extend(self._start_call(data.get("version")))
        call = self._call
        assert call is not None
        attempt = (data.get("version"), data.get("lease_fence"))
        if call.attempt != attempt:
            # A new attempt of the same call (a retry, or a re-run after its worker died)
            # streams its text from the start again.
            call.attempt, call.attempt_text = attempt, ""
        call.attempt_text += text
        if call.attempt_text.startswith(call.sent) and len(call.attempt_text) > len(call.sent):
            out.extend(self._send_text(call, call.attempt_text[len(call.sent) :]))
        return out

    def _send_text(self, call: _ModelCall, text: str) -> list[Step]:
        out: list[Step] = []
        if not call.text_open:
            call.text_open = True
            out.append(TextStarted(call.text_id))
        call.sent += text
        out.append(TextDelta(call.text_id, text))
        return out

    def _response(self, data: dict[str, Any]) -> list[Step]:
        out: list[Step] = []
        version = data.get("version")
        if self._call is None:
            out.extend(self._start_call(version - 1 if isinstance(version, int) else version))
        call = self._call
        assert call is not None
        content = data.get("content")
        if isinstance(content, str) and content.startswith(call.sent) and len(content) > len(call.sent):
            out.extend(self._send_text(call, content[len(call.sent) :]))
        if call.text_open:
            out.append(TextEnded(call.text_id))
            call.text_open = False
        message_id = str(data.get("message_id") or "")
        if data.get("tool_calls"):
            message = self.content.ai_message(self.root_turn_id, message_id)
            for tool_call in [] if message is None else message.tool_calls:
                arguments = self.content.mask(tool_call)
                self._shown_calls.add(tool_call.id)
                out.append(ToolCallStarted(tool_call.id, tool_call.name, call.text_id))
                out.append(ToolCallArgs(tool_call.id, json.dumps(arguments, separators=(",", ":"))))
                out.append(ToolCallAvailable(tool_call.id, tool_call.name, arguments))
        self._call = None
        return out

    def _finish_step(self) -> list[Step]:
        if self._open_step is None:
            return []
        name, self._open_step = self._open_step, None
        return [StepFinished(name)]

    # --- Tools and decisions ---

    def _tool_result(self, call_id: str) -> list[Step]:
        message = self.content.tool_message(self.root_turn_id, call_id)
        if message is None:
            return []
        return [ToolResult(call_id, message.tool_name, message.content, message.is_error, message.id)]

    def _resumed(self, data: dict[str, Any]) -> list[Step]:
        command = data.get("command")
        call_id = data.get("tool_call_id")
        if not isinstance(call_id, str):
            return []
        if command == ResumeType.APPROVE_TOOL:
            # An approval's reason is recorded in the decision's metadata (the model never reads it).
            metadata = data.get("metadata")
            reason = metadata.get("reason") if isinstance(metadata, dict) else None
            return [ApprovalAnswered(call_id, True, _text_or_none(data.get("reason") or reason))]
        if command == ResumeType.REJECT_TOOL:
            answered: list[Step] = [ApprovalAnswered(call_id, False, _text_or_none(data.get("reason")))]
            return answered + self._tool_result(call_id)
        if command in (ResumeType.USER_INPUT, ResumeType.DEADLINE, ResumeType.TOOL_RESULT):
            # A submitted `request_user_input` form (or a deadline's default) is the call's
            # result at once; a form a tool asked for is followed by the tool's own result.
            return self._tool_result(call_id)
        return []

    def _suspended(self, data: dict[str, Any]) -> list[Step]:
        kind = data.get("suspension_type")
        call_id = data.get("correlation_id")
        message = str(data.get("message") or "")
        # An unknown outcome reaches chat clients as an approval: approving retries the call, rejecting fails it.
        if kind in _TOOL_DECISIONS and isinstance(call_id, str):
            found = self.content.call(self.root_turn_id, call_id)
            name, arguments = found if found is not None else ("", {})
            return [*self._finish_step(), ApprovalRequested(call_id, name, arguments, message), self._waiting(data)]
        if kind == "USER_INPUT":
            turn = self.content.turn(self.root_turn_id, fresh=True)
            suspension = None if turn is None else turn.suspension
            if suspension is not None and suspension.form is not None and isinstance(call_id, str):
                form = suspension.form
                requested: Step = FormRequested(call_id, form.key, form.description, form.schema, message)
            else:
                requested = QuestionAsked(message)
            return [*self._finish_step(), requested, self._waiting(data)]
        return []

    def _waiting(self, data: dict[str, Any]) -> TurnFinished:
        return TurnFinished(self.root_turn_id, str(data.get("status") or ""), self._usage(), None, waiting=True)

    def _ended(self, event: AgentEvent) -> list[Step]:
        self._finished = True
        out = self.close()
        status = str(event.data.get("status") or event.type.value)
        if event.type is AgentEventType.TURN_FAILED:
            error = str(event.data.get("error") or "the turn failed")
            return [*out, TurnFailed(self.root_turn_id, status, error, self._usage())]
        final = _text_or_none(event.data.get("final_output"))
        return [*out, TurnFinished(self.root_turn_id, status, self._usage(), final, waiting=False)]

    def _usage(self) -> dict[str, Any]:
        turn = self.content.turn(self.root_turn_id, fresh=True)
        return {} if turn is None else turn.usage.model_dump(mode="json")


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None

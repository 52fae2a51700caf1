"""AG-UI: `POST /v1/agents/{agent_id}/ag-ui` runs a turn for an AG-UI client (`HttpAgent`) and streams AG-UI events.

The body is a `RunAgentInput`: `threadId` is the conversation, `runId` the client's name for
this run (echoed in RUN_STARTED and RUN_FINISHED), `messages` the thread as the client has
it. What the run does depends on the input:

- `resume` entries answer the interrupts the previous run finished with (AG-UI's interrupt
  outcome): for a call waiting for approval `{"interruptId": <call id>, "status":
  "resolved", "payload": {"approved": true}}` (or `false`, with an optional `"reason"`;
  `"status": "cancelled"` rejects it), for a form the form data as `payload` (checked
  against the frozen schema; 422 with a detail per field), `"status": "cancelled"` on a
  form stops the turn;
- a last user message not seen before starts a turn (or answers the active turn's
  plain-text question); a busy conversation is refused (409, `if_busy=reject`), unless
  `forwardedProps` holds `{"ifBusy": "steer"}`: the message then joins the active turn
  before its next model call, and the run streams that turn from there on;
- otherwise the client is reconnecting: it gets MESSAGES_SNAPSHOT of the conversation,
  then the active turn from where it is (the text streaming now again from its start).

Events: RUN_STARTED, STEP_STARTED/STEP_FINISHED per model call, TEXT_MESSAGE_START/
CONTENT/END, TOOL_CALL_START/ARGS/END/RESULT, then RUN_FINISHED (outcome `success`,
`interrupt` with the approval or form the turn waits for, or `cancelled`) or RUN_ERROR.
`forwardedProps` (but its `ifBusy`), `state`, `tools` and `context` are accepted and not used: the agent's
tools and instructions live on the server. Aborting the request does not stop the turn;
`POST /v1/agents/{agent_id}/ag-ui/{thread_id}/stop` does. See docs/ag-ui.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from agent_runner import AgentTurn, AiMessage, ToolMessage, UserMessage
from agent_runner.feed import FeedPosition
from workers.api import service
from workers.api.auth import RuntimeDep, TenantDep, get_tenant
from workers.api.bodies import ID_PATTERN, CancelRequest, Identifier
from workers.api.errors import InvalidRequestError
from workers.api.event_streams import KEEPALIVE_S
from workers.api.openapi import error_responses as _errors
from workers.api.openapi import event_stream_response
from workers.api.protocols import chat, steps
from workers.api.routes import (
    ConversationId,
    IdempotencyKey,
    _key_fingerprint,
    _view,
)
from workers.api.runtime import Runtime
from workers.api.tenancy import Tenant
from workers.views import catalog_mask

CHANNEL = "ag-ui"
STOP_REASON = "stopped by the user"
SNAPSHOT_MESSAGES = 200
"""Most messages of the conversation a reconnecting client gets in MESSAGES_SNAPSHOT."""
QUESTION_INTERRUPT = "question"
"""The interrupt id of a plain-text question (it concerns no tool call)."""

APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["approved"],
}
"""What the payload answering an approval interrupt looks like."""

AgentId = Annotated[str, Path(pattern=ID_PATTERN, max_length=128, description="The agent (see GET /v1/agents).")]

router = APIRouter(prefix="/v1", tags=["ag-ui"], dependencies=[Depends(get_tenant)])


class ResumeEntry(BaseModel):
    """An answer to one interrupt of the previous run."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    interrupt_id: str = Field(alias="interruptId", max_length=256)
    status: Literal["resolved", "cancelled"]
    payload: Any = None


class InputMessage(BaseModel):
    """A message of the thread as the client has it (only the id, role and text of the last one are read)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(max_length=256)
    role: Literal["developer", "system", "assistant", "user", "tool", "activity", "reasoning"]
    content: Any = None


class RunAgentInput(BaseModel):
    """AG-UI's `RunAgentInput`."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    thread_id: Identifier = Field(alias="threadId", description="The conversation.")
    run_id: str = Field(alias="runId", min_length=1, max_length=128, description="The client's id of this run.")
    messages: list[InputMessage] = Field(default_factory=list, max_length=10_000)
    resume: list[ResumeEntry] | None = None
    state: Any = None
    tools: list[Any] | None = None
    context: list[Any] | None = None
    forwarded_props: Any = Field(default=None, alias="forwardedProps")


# --- Requests -------------------------------------------------------------------------------


def _resume(runtime: Runtime, tenant: Tenant, agent_id: str, body: RunAgentInput, ids: chat.RequestIds) -> chat.Started:
    turn = chat.active_turn(runtime, tenant, agent_id, body.thread_id)
    suspension = None if turn is None else turn.suspension
    if turn is None or suspension is None:
        raise chat.NothingToAnswerError(body.thread_id, "no turn waits for an answer")
    wanted = suspension.correlation_id or QUESTION_INTERRUPT
    assert body.resume is not None
    number, entry = next(((n, e) for n, e in enumerate(body.resume) if e.interrupt_id == wanted), (-1, None))
    if entry is None:
        raise chat.NothingToAnswerError(
            body.thread_id, f"turn {turn.id!r} waits for interrupt {wanted!r}; no entry answers it"
        )
    path = f"/resume/{number}/payload"
    payload = entry.payload
    if suspension.correlation_id is None:
        if not isinstance(payload, str) or not payload.strip():
            raise InvalidRequestError("the answer to a question must be a non-empty string", path=path)
        return chat.decide(runtime, tenant, turn, chat.Decision(wanted, "input", content=payload), CHANNEL, ids)
    if suspension.form is not None:
        if entry.status == "cancelled":
            after = chat.feed_position(runtime, turn.id)  # before the cancel, so the run shows it
            return chat.Started(service.cancel_turn(runtime, tenant, turn.id, CancelRequest(reason=STOP_REASON)), after)
        if not isinstance(payload, dict):
            raise InvalidRequestError("the form data must be a JSON object", path=path)
        return chat.decide(runtime, tenant, turn, chat.Decision(wanted, "form", data=payload), CHANNEL, ids)
    approved, reason = _approval(payload, path)
    if entry.status == "cancelled":
        approved = False
    decision = chat.Decision(wanted, "approve" if approved else "reject", reason=reason)
    return chat.decide(runtime, tenant, turn, decision, CHANNEL, ids)


def _approval(payload: Any, path: str) -> tuple[bool, str | None]:
    if isinstance(payload, bool):
        return payload, None
    if payload is None:
        return False, None
    if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
        raise InvalidRequestError('an approval is answered with {"approved": true|false, "reason"?: "..."}', path=path)
    reason = payload.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise InvalidRequestError("the reason must be a string", path=f"{path}/reason")
    return payload["approved"], reason or None


def _user_text(body: RunAgentInput, index: int) -> str:
    content = body.messages[index].content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        content = "".join(t for t in texts if isinstance(t, str))
    if not isinstance(content, str) or not content.strip():
        raise InvalidRequestError("the user message has no text", path=f"/messages/{index}/content")
    return content


def _act(
    runtime: Runtime, tenant: Tenant, agent_id: str, body: RunAgentInput, ids: chat.RequestIds
) -> chat.Started | None:
    """Start or resume a turn; None when the input asks for nothing new (a reconnect)."""
    runtime.agent_loader.load(agent_id)
    if body.resume:
        return _resume(runtime, tenant, agent_id, body, ids)
    users = [n for n, m in enumerate(body.messages) if m.role == "user"]
    if not users:
        return None
    last = users[-1]
    if _is_stored(runtime, tenant, body.thread_id, body.messages[last].id):
        return None
    message_id = chat.stored_message_id(tenant, body.thread_id, body.messages[last].id)
    text = _user_text(body, last)
    props = body.forwarded_props if isinstance(body.forwarded_props, dict) else {}
    steer = chat.steers(props.get(chat.IF_BUSY_FIELD), f"/forwardedProps/{chat.IF_BUSY_FIELD}")
    return chat.send_message(runtime, tenant, agent_id, body.thread_id, text, message_id, CHANNEL, ids, steer=steer)


def _is_stored(runtime: Runtime, tenant: Tenant, conversation_id: str, client_message_id: str) -> bool:
    """Whether the conversation holds the client's message: sent before, or shown by a MESSAGES_SNAPSHOT."""
    stored = chat.stored_message_id(tenant, conversation_id, client_message_id)
    memory = runtime.memories.of(tenant.reaches(conversation_id))
    return any(m.id in (stored, client_message_id) for m in memory.get_messages(SNAPSHOT_MESSAGES))


# --- Events ---------------------------------------------------------------------------------


def _now_ms() -> int:
    return int(time.time() * 1000)


class _Events:
    """Writes one run's AG-UI events, in SSE."""

    def __init__(self, body: RunAgentInput) -> None:
        self.thread_id = body.thread_id
        self.run_id = body.run_id
        self.interrupts: list[dict[str, Any]] = []

    def sse(self, event: dict[str, Any], cursor: str | None = None) -> str:
        head = f"id: {cursor}\n" if cursor else ""
        event = {**event, "timestamp": _now_ms()}
        return f"{head}data: {json.dumps(event, separators=(',', ':'))}\n\n"

    def started(self) -> dict[str, Any]:
        return {"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id}

    def finished(self, outcome: dict[str, Any], result: Any = None) -> dict[str, Any]:
        event = {"type": "RUN_FINISHED", "threadId": self.thread_id, "runId": self.run_id, "outcome": outcome}
        return event if result is None else {**event, "result": result}

    def events(self, step: steps.Step) -> list[dict[str, Any]]:
        match step:
            case steps.StepStarted(name=name):
                return [{"type": "STEP_STARTED", "stepName": name}]
            case steps.StepFinished(name=name):
                return [{"type": "STEP_FINISHED", "stepName": name}]
            case steps.TextStarted(text_id=text_id):
                return [{"type": "TEXT_MESSAGE_START", "messageId": text_id, "role": "assistant"}]
            case steps.TextDelta(text_id=text_id, delta=delta):
                return [{"type": "TEXT_MESSAGE_CONTENT", "messageId": text_id, "delta": delta}]
            case steps.TextEnded(text_id=text_id):
                return [{"type": "TEXT_MESSAGE_END", "messageId": text_id}]
            case steps.ToolCallStarted(call_id=call_id, name=name, message_id=message_id):
                return [
                    {
                        "type": "TOOL_CALL_START",
                        "toolCallId": call_id,
                        "toolCallName": name,
                        "parentMessageId": message_id,
                    }
                ]
            case steps.ToolCallArgs(call_id=call_id, delta=delta):
                return [{"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": delta}]
            case steps.ToolCallAvailable(call_id=call_id):
                return [{"type": "TOOL_CALL_END", "toolCallId": call_id}]
            case steps.ToolResult(call_id=call_id, content=content, message_id=message_id):
                return [
                    {
                        "type": "TOOL_CALL_RESULT",
                        "messageId": message_id,
                        "toolCallId": call_id,
                        "content": content,
                        "role": "tool",
                    }
                ]
        return self._ends(step)

    def _ends(self, step: steps.Step) -> list[dict[str, Any]]:
        match step:
            case steps.ApprovalRequested(call_id=call_id, name=name, arguments=arguments, message=message):
                self.interrupts.append(
                    {
                        "id": call_id,
                        "reason": "tool_approval",
                        "message": message or f"approve the call of {name}?",
                        "toolCallId": call_id,
                        "responseSchema": APPROVAL_SCHEMA,
                        "metadata": {"toolName": name, "arguments": arguments},
                    }
                )
            case steps.FormRequested(call_id=call_id, key=key, description=description, schema=schema, message=message):
                self.interrupts.append(
                    {
                        "id": call_id,
                        "reason": "form",
                        "message": message or description,
                        "toolCallId": call_id,
                        "responseSchema": schema,
                        "metadata": {"formKey": key, "description": description},
                    }
                )
            case steps.QuestionAsked(message=message):
                self.interrupts.append(
                    {"id": QUESTION_INTERRUPT, "reason": "user_input", "message": message or "your answer?"}
                )
            case steps.TurnFinished(waiting=True):
                return [self.finished({"type": "interrupt", "interrupts": self.interrupts})]
            case steps.TurnFinished(status="COMPLETED", final_output=final):
                return [self.finished({"type": "success"}, final)]
            case steps.TurnFinished(status="CANCELLED"):
                return [self.finished({"type": "cancelled"})]
            case steps.TurnFinished(status=status):
                return [{"type": "RUN_ERROR", "message": f"the turn ended with {status}", "code": status}]
            case steps.TurnFailed(status=status, error=error):
                return [{"type": "RUN_ERROR", "message": error, "code": status}]
            case steps.Recovering(recoveries=recoveries, max_recoveries=most):
                return [
                    {"type": "CUSTOM", "name": "recovering", "value": {"recoveries": recoveries, "maxRecoveries": most}}
                ]
        return []


def snapshot_messages(runtime: Runtime, tenant: Tenant, conversation_id: str) -> list[dict[str, Any]]:
    """The conversation's model messages as AG-UI messages (arguments masked), oldest first."""
    memory = runtime.memories.of(tenant.reaches(conversation_id))
    mask = catalog_mask(runtime.agent_loader)
    out: list[dict[str, Any]] = []
    for message in memory.get_messages(SNAPSHOT_MESSAGES):
        if isinstance(message, UserMessage):
            out.append({"id": message.id, "role": "user", "content": message.content})
        elif isinstance(message, AiMessage):
            item: dict[str, Any] = {"id": message.id, "role": "assistant"}
            if message.content:
                item["content"] = message.content
            if message.tool_calls:
                item["toolCalls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": json.dumps(mask(call), separators=(",", ":"))},
                    }
                    for call in message.tool_calls
                ]
            out.append(item)
        elif isinstance(message, ToolMessage):
            tool: dict[str, Any] = {
                "id": message.id,
                "role": "tool",
                "toolCallId": message.tool_call_id,
                "content": message.content,
            }
            out.append({**tool, "error": message.content} if message.is_error else tool)
    return out


async def _run(
    runtime: Runtime, tenant: Tenant, body: RunAgentInput, started: chat.Started | None
) -> AsyncIterator[str]:
    writer = _Events(body)
    yield writer.sse(writer.started())
    if started is None:
        # A reconnect: what the conversation holds, then its active turn from where it is.
        messages = await run_in_threadpool(snapshot_messages, runtime, tenant, body.thread_id)
        yield writer.sse({"type": "MESSAGES_SNAPSHOT", "messages": messages})
        thread = tenant.reaches(body.thread_id)
        turn = await run_in_threadpool(runtime.turn_store.find_active_turn, thread.conversation_id, thread.tenant_id)
        if turn is None or not tenant.owns(turn):
            yield writer.sse(writer.finished({"type": "success"}))
            return
        translator = steps.TurnTranslator(turn.id, chat.turn_content(runtime, turn))
        primed = await run_in_threadpool(chat.prime, runtime, translator)
        if primed.ending:
            # The turn already waits for a person (or just ended): say so, there is nothing to follow.
            yield "".join(writer.sse(e) for step in primed.ending for e in writer.events(step))
            return
        yield "".join(writer.sse(e) for step in translator.reopen() for e in writer.events(step))
        after: FeedPosition | None = primed.after
    else:
        turn = started.turn
        translator = steps.TurnTranslator(turn.id, chat.turn_content(runtime, turn))
        after = started.after
    async for batch in chat.stream_steps(runtime, translator, after, quiet_after=KEEPALIVE_S):
        if not batch:
            yield ": keep-alive\n\n"
            continue
        yield "".join(writer.sse(event, cursor) for step, cursor in batch for event in writer.events(step))


# --- Routes ---------------------------------------------------------------------------------


@router.post(
    "/agents/{agent_id}/ag-ui",
    summary="AG-UI run",
    response_class=StreamingResponse,
    responses={
        **event_stream_response("`text/event-stream` of AG-UI events (`data: {...}` each)."),
        **_errors(401, 404, 409, 413, 422, 503),
    },
)
async def ag_ui_run(
    request: Request,
    agent_id: AgentId,
    body: RunAgentInput,
    runtime: RuntimeDep,
    tenant: TenantDep,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Start a turn from a new user message, answer the interrupts in `resume`, or reconnect; stream AG-UI events."""
    reconnect = await run_in_threadpool(_is_reconnect, runtime, tenant, agent_id, body)
    started: chat.Started | None = None
    if not reconnect:
        outcome = await chat.act_once(
            runtime,
            tenant,
            body.thread_id,
            idempotency_key,
            _key_fingerprint(request, body, idempotency_key),
            lambda ids: _require(_act(runtime, tenant, agent_id, body, ids)),
        )
        if isinstance(outcome, JSONResponse):
            return outcome
        started = outcome
    return StreamingResponse(
        _run(runtime, tenant, body, started),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _is_reconnect(runtime: Runtime, tenant: Tenant, agent_id: str, body: RunAgentInput) -> bool:
    """Whether the input asks for nothing new: no resume entries, and its last user message is stored already."""
    runtime.agent_loader.load(agent_id)
    tenant.reaches(body.thread_id)  # a thread out of the token's reach is a 404 before anything streams
    if body.resume:
        return False
    users = [m for m in body.messages if m.role == "user"]
    if not users:
        return True
    return _is_stored(runtime, tenant, body.thread_id, users[-1].id)


def _require(started: chat.Started | None) -> chat.Started:
    if started is None:
        raise InvalidRequestError("the input has no new user message and no resume entries", path="/messages")
    return started


@router.post(
    "/agents/{agent_id}/ag-ui/{thread_id}/stop",
    summary="AG-UI: stop the thread's active turn",
    responses={204: {"description": "Nothing was active."}, **_errors(401, 404, 409, 422, 503)},
)
async def ag_ui_stop(agent_id: AgentId, thread_id: ConversationId, runtime: RuntimeDep, tenant: TenantDep) -> Response:
    """Cancel the thread's active turn (202 with the turn view); a run following it finishes with outcome `cancelled`."""
    turn: AgentTurn | None = await run_in_threadpool(chat.stop, runtime, tenant, agent_id, thread_id, STOP_REASON)
    if turn is None:
        return Response(status_code=204)
    return JSONResponse(await run_in_threadpool(_view, runtime, tenant, turn), status_code=202)

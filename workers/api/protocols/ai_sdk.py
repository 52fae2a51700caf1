"""The AI SDK's UI message stream: `useChat` with `DefaultChatTransport` talks to a turn of this server.

`POST /v1/agents/{agent_id}/ai-sdk/chat` is the transport's `api`. It takes the body the
transport sends (`id` = the conversation, `messages`, `trigger`) and acts on the last
message: a user message starts a turn (or answers the question the active turn asked); an
assistant message whose tool part was answered (`addToolApprovalResponse`, or
`addToolOutput` for a form) resumes the waiting turn. The answer is the turn as UI message
chunks (`x-vercel-ai-ui-message-stream: v1`, SSE, `data: [DONE]` last), from the event
log, until the turn ends or waits for a person.

`GET .../ai-sdk/chat/{chat_id}/stream` (what `useChat({resume: true})` calls) replays the
conversation's active turn from its start, which the transport treats as a replay (its
first `start` chunk resets the message), then follows it; 204 when nothing is active.
`POST .../ai-sdk/chat/{chat_id}/stop` cancels the active turn: aborting the fetch (the
transport's `stop()`) only closes the connection, and the durable turn goes on.
`GET .../ai-sdk/chat/{chat_id}/messages` is the conversation as UI messages (see
`ui_messages`), what a reloaded page passes to `useChat({messages, resume: true})`.

Clients of `ai` 6 (what `npm install ai` gives on Node.js 20) and `ai` 7 read the same
chunks but one: `ai` 6 refuses `tool-approval-response`. A request that shows it comes from
`ai` 7 (see `reads_approval_responses`) gets decisions as those chunks; any other learns
them from the calls' outcomes.

See docs/ai-sdk.md for the chunks and a complete example.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from agent_runner import AgentTurn
from workers.api import service
from workers.api.auth import RuntimeDep, TenantDep, get_tenant
from workers.api.bodies import ID_PATTERN, Identifier, UIMessageView
from workers.api.errors import InvalidRequestError
from workers.api.event_streams import KEEPALIVE_S
from workers.api.openapi import error_responses as _errors
from workers.api.openapi import event_stream_response
from workers.api.protocols import chat, steps, ui_messages
from workers.api.routes import (
    ConversationId,
    IdempotencyKey,
    _key_fingerprint,
    _view,
)
from workers.api.runtime import Runtime
from workers.api.tenancy import Tenant
from workers.views import catalog_mask

CHANNEL = "ai-sdk"
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
    "x-vercel-ai-ui-message-stream": "v1",
}
"""The headers of a UI message stream (the transport checks none, but proxies and the SDK's tools read them)."""

STOP_REASON = "stopped by the user"

AgentId = Annotated[str, Path(pattern=ID_PATTERN, max_length=128, description="The agent (see GET /v1/agents).")]

router = APIRouter(prefix="/v1", tags=["ai-sdk"], dependencies=[Depends(get_tenant)])


class UIMessage(BaseModel):
    """A message of `useChat` (only what the server reads is checked; other fields are kept as sent)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(max_length=256)
    role: Literal["system", "user", "assistant"]
    parts: list[dict[str, Any]] = Field(max_length=1000)


class ChatRequest(BaseModel):
    """The body `DefaultChatTransport` sends (plus whatever the app adds with the transport's `body`)."""

    model_config = ConfigDict(extra="allow")

    id: Identifier = Field(description="The chat id: the conversation of the turns.")
    messages: list[UIMessage] = Field(min_length=1, description="The chat's messages; the last one is acted on.")
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = Field(default=None, max_length=256)


# --- Requests -------------------------------------------------------------------------------


def _user_text(body: ChatRequest) -> str:
    last = body.messages[-1]
    index = len(body.messages) - 1
    texts = [p.get("text") for p in last.parts if p.get("type") == "text"]
    if any(not isinstance(t, str) for t in texts):
        raise InvalidRequestError("a text part has no text", path=f"/messages/{index}/parts")
    text = "".join(t for t in texts if isinstance(t, str))
    if not text.strip():
        raise InvalidRequestError("the user message has no text", path=f"/messages/{index}/parts")
    return text


def _decision(body: ChatRequest, turn: AgentTurn) -> chat.Decision:
    """The answer, in the last assistant message, to the call the turn waits for."""
    suspension = turn.suspension
    call_id = None if suspension is None else suspension.correlation_id
    if suspension is None or call_id is None:
        raise chat.NothingToAnswerError(body.id, f"turn {turn.id!r} does not wait for a tool call to be answered")
    index = len(body.messages) - 1
    for number, part in enumerate(body.messages[-1].parts):
        kind = part.get("type")
        if not (isinstance(kind, str) and (kind.startswith("tool-") or kind == "dynamic-tool")):
            continue
        if part.get("toolCallId") != call_id:
            continue
        path = f"/messages/{index}/parts/{number}"
        state = part.get("state")
        if state == "approval-responded":
            approval = part.get("approval")
            if not isinstance(approval, dict) or not isinstance(approval.get("approved"), bool):
                raise InvalidRequestError("the approval has no `approved` boolean", path=f"{path}/approval")
            reason = approval.get("reason")
            reason = reason if isinstance(reason, str) and reason else None
            return chat.Decision(call_id, "approve" if approval["approved"] else "reject", reason=reason)
        if state == "output-available" and suspension.form is not None:
            output = part.get("output")
            if not isinstance(output, dict):
                raise InvalidRequestError("the form data must be a JSON object", path=f"{path}/output")
            return chat.Decision(call_id, "form", data=output)
        if state == "output-error" and suspension.form is not None:
            # `addToolOutput({state: "output-error", errorText})`: the person declined the form.
            error = part.get("errorText")
            return chat.Decision(call_id, "reject", reason=error if isinstance(error, str) and error else None)
        raise chat.NothingToAnswerError(
            body.id, f"the part of call {call_id!r} is in state {state!r}, which answers nothing the turn waits for"
        )
    raise chat.NothingToAnswerError(
        body.id, f"turn {turn.id!r} waits for call {call_id!r}, and the last message does not answer it"
    )


def reads_approval_responses(body: ChatRequest) -> bool:
    """Whether the client that sent `body` reads `tool-approval-response` chunks (`ai` 7 does; `ai` 6 refuses them).

    The two versions send the same bodies but for one trace: `ai` 7 keeps the `reason` of a
    `tool-approval-request` chunk as the approval's `requestReason` (and sends it back),
    where `ai` 6 drops it. A request that shows no approval made from this server's chunks
    is answered in the words both versions read.
    """
    for message in body.messages:
        for part in message.parts:
            approval = part.get("approval")
            if isinstance(approval, dict) and "requestReason" in approval:
                return True
    return False


def _act(runtime: Runtime, tenant: Tenant, agent_id: str, body: ChatRequest, ids: chat.RequestIds) -> chat.Started:
    if body.trigger == "regenerate-message":
        raise InvalidRequestError(
            "regenerating is not supported: a turn's answer is durable; send a new message instead", path="/trigger"
        )
    last = body.messages[-1]
    if last.role == "user":
        text = _user_text(body)
        message_id = chat.stored_message_id(tenant, body.id, last.id)
        steer = chat.steers((body.model_extra or {}).get(chat.IF_BUSY_FIELD), f"/{chat.IF_BUSY_FIELD}")
        return chat.send_message(runtime, tenant, agent_id, body.id, text, message_id, CHANNEL, ids, steer=steer)
    if last.role != "assistant":
        raise InvalidRequestError("the last message must be a user or an assistant message", path="/messages")
    runtime.agent_loader.load(agent_id)
    turn = chat.active_turn(runtime, tenant, agent_id, body.id)
    if turn is None:
        raise chat.NothingToAnswerError(body.id, "no turn is active, so there is nothing to answer")
    return chat.decide(runtime, tenant, turn, _decision(body, turn), CHANNEL, ids)


# --- Chunks ---------------------------------------------------------------------------------


class _Chunks:
    """Writes the steps of one turn as UI message chunks, in SSE.

    Args:
        tenant: Who asks (the conversation id is shown as they know it).
        turn: The turn streamed.
        approval_responses: Whether decisions are shown as `tool-approval-response` chunks,
            which only `ai` 7 reads (see `reads_approval_responses`). Without them a
            client learns a decision from the call's outcome (`tool-output-available`, or
            `tool-output-denied` for a rejection), which every version reads.
    """

    def __init__(self, tenant: Tenant, turn: AgentTurn, *, approval_responses: bool) -> None:
        self.turn = turn
        self.conversation_id = turn.conversation_id
        self.approval_responses = approval_responses
        self.denied: set[str] = set()

    def sse(self, chunk: dict[str, Any], cursor: str | None = None) -> str:
        head = f"id: {cursor}\n" if cursor else ""
        return f"{head}data: {json.dumps(chunk, separators=(',', ':'))}\n\n"

    def start(self) -> str:
        metadata = {"turnId": self.turn.id, "conversationId": self.conversation_id}
        return self.sse({"type": "start", "messageId": self.turn.id, "messageMetadata": metadata})

    def chunks(self, step: steps.Step) -> list[dict[str, Any]]:
        match step:
            case steps.StepStarted():
                return [{"type": "start-step"}]
            case steps.StepFinished():
                return [{"type": "finish-step"}]
            case steps.TextStarted(text_id=text_id):
                return [{"type": "text-start", "id": text_id}]
            case steps.TextDelta(text_id=text_id, delta=delta):
                return [{"type": "text-delta", "id": text_id, "delta": delta}]
            case steps.TextEnded(text_id=text_id):
                return [{"type": "text-end", "id": text_id}]
            case steps.TurnFinished():
                return [{"type": "finish", "finishReason": _finish_reason(step), "messageMetadata": self._meta(step)}]
            case steps.TurnFailed(error=error):
                return [
                    {"type": "error", "errorText": error},
                    {"type": "finish", "finishReason": "error", "messageMetadata": self._meta(step)},
                ]
        return self._tool_chunks(step)

    def _tool_chunks(self, step: steps.Step) -> list[dict[str, Any]]:
        match step:
            case steps.ToolCallStarted(call_id=call_id, name=name):
                return [{"type": "tool-input-start", "toolCallId": call_id, "toolName": name}]
            case steps.ToolCallArgs(call_id=call_id, delta=delta):
                return [{"type": "tool-input-delta", "toolCallId": call_id, "inputTextDelta": delta}]
            case steps.ToolCallAvailable(call_id=call_id, name=name, arguments=arguments):
                return [{"type": "tool-input-available", "toolCallId": call_id, "toolName": name, "input": arguments}]
            case steps.ToolResult(call_id=call_id, content=content, is_error=is_error):
                if call_id in self.denied:
                    return [{"type": "tool-output-denied", "toolCallId": call_id}]
                if is_error:
                    return [{"type": "tool-output-error", "toolCallId": call_id, "errorText": content}]
                return [
                    {"type": "tool-output-available", "toolCallId": call_id, "output": ui_messages.tool_output(content)}
                ]
            case steps.ApprovalRequested(call_id=call_id, name=name, message=message):
                # `reason` becomes the approval's `requestReason` in `ai` 7, which tells its requests apart.
                reason = message or f"{name} needs approval"
                return [
                    {"type": "tool-approval-request", "approvalId": call_id, "toolCallId": call_id, "reason": reason}
                ]
            case steps.ApprovalAnswered(call_id=call_id, approved=approved, reason=reason):
                if not approved:
                    self.denied.add(call_id)
                if not self.approval_responses:
                    return []
                answer: dict[str, Any] = {"type": "tool-approval-response", "approvalId": call_id, "approved": approved}
                return [answer if reason is None else {**answer, "reason": reason}]
            case steps.FormRequested(call_id=call_id, key=key, description=description, schema=schema, message=message):
                form = {"toolCallId": call_id, "key": key, "description": description, "schema": schema}
                return [{"type": "data-form", "id": call_id, "data": {**form, "message": message}}]
            case steps.QuestionAsked(message=message):
                return [{"type": "data-question", "data": {"message": message}}]
            case steps.Recovering(recoveries=recoveries, max_recoveries=most):
                # Transient: a status to show while it lasts, not a part of the message.
                data = {"recoveries": recoveries, "maxRecoveries": most}
                return [{"type": "data-recovering", "data": data, "transient": True}]
        return []

    def _meta(self, step: steps.TurnFinished | steps.TurnFailed) -> dict[str, Any]:
        return {
            "turnId": self.turn.id,
            "conversationId": self.conversation_id,
            "status": step.status,
            "usage": step.usage,
        }


def _finish_reason(step: steps.TurnFinished) -> str:
    if step.waiting:
        return "tool-calls"
    return "stop" if step.status == "COMPLETED" else "other"


async def _body(
    runtime: Runtime, tenant: Tenant, started: chat.Started, approval_responses: bool
) -> AsyncIterator[str]:
    turn = started.turn
    writer = _Chunks(tenant, turn, approval_responses=approval_responses)
    translator = steps.TurnTranslator(turn.id, chat.turn_content(runtime, turn))
    yield writer.start()
    ended = False
    async for batch in chat.stream_steps(runtime, translator, started.after, quiet_after=KEEPALIVE_S):
        if not batch:
            yield ": keep-alive\n\n"
            continue
        out = []
        for step, cursor in batch:
            for chunk in writer.chunks(step):
                out.append(writer.sse(chunk, cursor))
            ended = ended or isinstance(step, steps.TurnFinished | steps.TurnFailed)
        yield "".join(out)
    if ended:
        yield "data: [DONE]\n\n"


def _stream(
    runtime: Runtime, tenant: Tenant, started: chat.Started, *, approval_responses: bool = False
) -> StreamingResponse:
    body = _body(runtime, tenant, started, approval_responses)
    return StreamingResponse(body, media_type="text/event-stream", headers=HEADERS)


_STREAM_RESPONSE = event_stream_response(
    "`text/event-stream` of UI message chunks (`data: {...}` each, `data: [DONE]` last)."
)


# --- Routes ---------------------------------------------------------------------------------


@router.post(
    "/agents/{agent_id}/ai-sdk/chat",
    summary="AI SDK chat (useChat)",
    response_class=StreamingResponse,
    responses={**_STREAM_RESPONSE, **_errors(401, 404, 409, 413, 422, 503)},
)
async def ai_sdk_chat(
    request: Request,
    agent_id: AgentId,
    body: ChatRequest,
    runtime: RuntimeDep,
    tenant: TenantDep,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Start a turn from the new user message, or apply the approval or form in the last message; stream the turn.

    A busy conversation (a turn is active and not asking a question) answers 409, as
    `if_busy=reject` does, unless the body holds `"ifBusy": "steer"` (the transport's
    `body` option): the message then joins the active turn before its next model call, and
    the stream continues that turn. Form data failing the frozen schema answers 422 with a detail
    per field; nothing changes.
    """
    started = await chat.act_once(
        runtime,
        tenant,
        body.id,
        idempotency_key,
        _key_fingerprint(request, body, idempotency_key),
        lambda ids: _act(runtime, tenant, agent_id, body, ids),
    )
    if isinstance(started, JSONResponse):
        return started
    return _stream(runtime, tenant, started, approval_responses=reads_approval_responses(body))


@router.get(
    "/agents/{agent_id}/ai-sdk/chat/{chat_id}/stream",
    summary="AI SDK chat: reconnect to the active turn",
    response_class=StreamingResponse,
    responses={
        **_STREAM_RESPONSE,
        204: {"description": "The conversation has no active turn."},
        **_errors(401, 404, 422, 503),
    },
)
async def ai_sdk_chat_stream(
    agent_id: AgentId, chat_id: ConversationId, runtime: RuntimeDep, tenant: TenantDep
) -> Response:
    """The conversation's active turn from its start (a replay the transport knows to reset on), then live.

    A reconnect has no body to tell the client's version by, so decisions are shown only by
    the calls' outcomes, which every version reads.
    """
    await run_in_threadpool(runtime.agent_loader.load, agent_id)
    turn = await run_in_threadpool(chat.active_turn, runtime, tenant, agent_id, chat_id)
    if turn is None:
        return Response(status_code=204)
    return _stream(runtime, tenant, chat.Started(turn, None))


@router.post(
    "/agents/{agent_id}/ai-sdk/chat/{chat_id}/stop",
    summary="AI SDK chat: stop the active turn",
    responses={204: {"description": "Nothing was active."}, **_errors(401, 404, 409, 422, 503)},
)
async def ai_sdk_chat_stop(
    agent_id: AgentId, chat_id: ConversationId, runtime: RuntimeDep, tenant: TenantDep
) -> Response:
    """Cancel the conversation's active turn (202 with the turn view); the stream following it ends with `finish`."""
    turn = await run_in_threadpool(chat.stop, runtime, tenant, agent_id, chat_id, STOP_REASON)
    if turn is None:
        return Response(status_code=204)
    return JSONResponse(await run_in_threadpool(_view, runtime, tenant, turn), status_code=202)


@router.get(
    "/agents/{agent_id}/ai-sdk/chat/{chat_id}/messages",
    summary="AI SDK chat: the conversation as UI messages",
    response_model=list[UIMessageView],
    responses=_errors(401, 404, 422, 503),
)
def ai_sdk_chat_messages(
    agent_id: AgentId,
    chat_id: ConversationId,
    runtime: RuntimeDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=500, description="At most this many of the newest stored messages.")] = 100,
) -> JSONResponse:
    """The conversation as `useChat` shows it, oldest first: pass it to `useChat({id, messages, resume: true})` on load.

    Tool calls are tool parts in their current state: an approval waiting is
    `approval-requested`, a form waiting `input-available` with its `data-form` part. An
    assistant message's id is its turn's id when known, as in the stream, so the resumed
    stream of the active turn replaces that message rather than adding a second one.
    """
    runtime.agent_loader.load(agent_id)
    found = service.conversation_messages(runtime, tenant, chat_id, limit=limit, before=None)
    active = chat.active_turn(runtime, tenant, agent_id, chat_id)
    mask = catalog_mask(runtime.agent_loader)
    return JSONResponse(ui_messages.ui_messages(found, mask, active=active, conversation_id=chat_id))

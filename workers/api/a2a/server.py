"""The A2A routes: `POST /a2a/{agent_id}` (JSON-RPC) and the agent card at `GET /a2a/{agent_id}/.well-known/agent-card.json`.

Served over the same runner, tenants and event log as `/v1`: SendMessage starts a turn in
a new conversation (no contextId) or continues one (contextId, `if_busy=reject`, or
`steer` with `{"ifBusy": "steer"}` in the message metadata); a message with the taskId of
a turn waiting for a person answers it. SendStreamingMessage and SubscribeToTask stream
the turn's events as they are in the event log. Every failure is a JSON-RPC error answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from agent_runner import Agent, AgentNotFound, AgentTurn, TurnNotFound
from workers.api import service
from workers.api.a2a import wire
from workers.api.a2a.wire import RpcError
from workers.api.auth import RuntimeDep, TenantDep, get_tenant
from workers.api.bodies import ID_PATTERN, CancelRequest
from workers.api.errors import ApiError, TurnEndedError, api_error_of
from workers.api.event_streams import KEEPALIVE_S
from workers.api.idempotency_header import request_id
from workers.api.openapi import error_responses
from workers.api.protocols import chat, steps
from workers.api.runtime import Runtime
from workers.api.tenancy import Tenant
from workers.views import find_agent

_log = logging.getLogger(__name__)

CHANNEL = "a2a"
CANCEL_REASON = "canceled by the A2A client"
BLOCKING_WAIT_S = 60.0
"""How long a blocking SendMessage waits for the task to end or ask for input before answering it as working."""

AgentId = Annotated[str, Path(pattern=ID_PATTERN, max_length=128, description="The agent (see GET /v1/agents).")]

A2A_PREFIX = "/a2a/"

router = APIRouter(prefix="/a2a", tags=["a2a"], dependencies=[Depends(get_tenant)], responses=error_responses(401, 503))

_RPC_BODY: dict[str, Any] = {
    "x-jsonrpc": True,  # its refusals are JSON-RPC error answers (HTTP 200), not the API's error shape
    "requestBody": {
        "required": True,
        "description": "A JSON-RPC 2.0 request (`jsonrpc`, `id`, `method`, `params`); anything else is a JSON-RPC error.",
        "content": {"application/json": {"schema": {}}},
    },
}
_RPC_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": (
            "A JSON-RPC 2.0 answer (`result` or `error`; every failure is an error answer), or for "
            "SendStreamingMessage and SubscribeToTask server-sent events, each a JSON-RPC answer."
        ),
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {"schema": {"type": "string"}},
        },
    },
    **error_responses(422),
}


def _agent(runtime: Runtime, agent_id: str) -> Agent:
    try:
        return runtime.agent_loader.load(agent_id)
    except AgentNotFound:
        raise RpcError(wire.INVALID_PARAMS, f"no agent {agent_id!r}") from None


@router.get(
    "/{agent_id}/.well-known/agent-card.json",
    summary="The agent card of an agent",
    responses={200: {"content": {"application/json": {"schema": {"type": "object"}}}}, **error_responses(404, 422)},
)
def agent_card(agent_id: AgentId, request: Request, runtime: RuntimeDep, tenant: TenantDep) -> JSONResponse:
    """The A2A agent card: name, description, a skill per tool, streaming, and the JSON-RPC URL."""
    try:
        agent = runtime.agent_loader.load(agent_id)
    except AgentNotFound as exc:
        raise api_error_of(exc) from None
    url = str(request.url).split("/.well-known/", 1)[0]
    return JSONResponse(wire.agent_card(agent, url, secured=tenant.id is not None))


def _answer(request_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _failure(request_id: Any, error: RpcError) -> JSONResponse:
    return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": error.to_json()})


def guard_refusal(error: ApiError) -> JSONResponse:
    """A body the request guard refused (too large, not JSON, nested too deep) as a JSON-RPC error."""
    code = wire.PARSE_ERROR if error.status == 422 and "not valid JSON" in error.message else wire.INVALID_REQUEST
    return _failure(None, RpcError(code, error.message))


def _rpc_error(error: BaseException) -> RpcError:
    """The JSON-RPC error of a failure of the runner or of the API's checks."""
    if isinstance(error, RpcError):
        return error
    if isinstance(error, TurnNotFound):
        return RpcError(wire.TASK_NOT_FOUND, "task not found")
    if isinstance(error, TurnEndedError):
        return RpcError(wire.TASK_NOT_CANCELABLE, error.message)
    api = api_error_of(error)
    if api.status == 404:
        return RpcError(wire.TASK_NOT_FOUND, api.message)
    if api.status in (400, 409, 413, 422):
        return RpcError(wire.INVALID_PARAMS, api.message, {"type": api.type_name, "details": api.details})
    if api.status < 500:
        return RpcError(wire.INVALID_REQUEST, api.message, {"type": api.type_name})
    _log.error("A2A request failed", exc_info=error)
    return RpcError(wire.INTERNAL_ERROR, api.message if api.status == 503 else "the request could not be served")


@router.post(
    "/{agent_id}",
    summary="A2A JSON-RPC endpoint of an agent",
    response_class=Response,
    responses=_RPC_ANSWERS,
    openapi_extra=_RPC_BODY,
)
async def rpc(agent_id: AgentId, request: Request, runtime: RuntimeDep, tenant: TenantDep) -> Response:
    """JSON-RPC 2.0: SendMessage, SendStreamingMessage, GetTask, CancelTask, SubscribeToTask."""
    try:
        payload = json.loads(await request.body())
    except (ValueError, RecursionError):
        return _failure(None, RpcError(wire.PARSE_ERROR, "the body is not JSON"))
    if not isinstance(payload, dict) or payload.get("jsonrpc") != "2.0" or not isinstance(payload.get("method"), str):
        return _failure(None, RpcError(wire.INVALID_REQUEST, "not a JSON-RPC 2.0 request"))
    request_id = payload.get("id")
    if request_id is not None and not isinstance(request_id, str | int):
        return _failure(None, RpcError(wire.INVALID_REQUEST, "id must be a string, a number or null"))
    method, params = payload["method"], payload.get("params") or {}
    try:
        if not isinstance(params, dict):
            raise RpcError(wire.INVALID_PARAMS, "params must be an object")
        if method in ("SendStreamingMessage", "SubscribeToTask"):
            first, after = await run_in_threadpool(_open_stream, runtime, tenant, agent_id, method, params)
            return StreamingResponse(_stream(runtime, request_id, first, after), media_type="text/event-stream")
        handler = _METHODS.get(method)
        if handler is None:
            raise RpcError(wire.METHOD_NOT_FOUND, f"unknown method {method!r}")
        result = await handler(runtime, tenant, agent_id, params)
    except Exception as exc:  # every failure is told as a JSON-RPC error, never as a 500
        return _failure(request_id, _rpc_error(exc))
    return JSONResponse(_answer(request_id, result))


# --- Methods ----------------------------------------------------------------------------------


def _task_of(runtime: Runtime, tenant: Tenant, agent_id: str, params: dict[str, Any]) -> AgentTurn:
    task_id = params.get("id")
    if not isinstance(task_id, str) or not task_id or len(task_id) > 128:
        raise RpcError(wire.INVALID_PARAMS, "params.id must be a task id")
    turn = service.get_turn(runtime, tenant, task_id)
    if turn.agent_id != agent_id:
        raise TurnNotFound(task_id)
    return turn


def _view(runtime: Runtime, turn: AgentTurn) -> dict[str, Any]:
    return wire.task_view(turn, find_agent(runtime.agent_loader, turn))


def _act(runtime: Runtime, tenant: Tenant, agent_id: str, params: dict[str, Any]) -> chat.Started:
    """Start or continue the turn the message is for."""
    _agent(runtime, agent_id)
    incoming = wire.parse_message(params)
    if incoming.task_id is not None:
        return _answer_task(runtime, tenant, agent_id, incoming)
    if not incoming.text.strip():
        raise RpcError(wire.INVALID_PARAMS, "a message that starts a task needs a text part")
    # A browser token limited to one conversation starts its tasks there. A new context is
    # named after the message, so the same message sent again finds the task it started.
    conversation_id = incoming.context_id or tenant.conversation or request_id(tenant, f"a2a:{incoming.message_id}")
    message_id = chat.stored_message_id(tenant, conversation_id, incoming.message_id)
    steer = incoming.metadata.get("ifBusy") == "steer"
    return chat.send_message(
        runtime, tenant, agent_id, conversation_id, incoming.text, message_id, CHANNEL, steer=steer
    )


def _answer_task(runtime: Runtime, tenant: Tenant, agent_id: str, incoming: wire.Incoming) -> chat.Started:
    """Answer what the task (a waiting turn) asks: form data, an approval decision, or a plain-text answer."""
    assert incoming.task_id is not None
    turn = _task_of(runtime, tenant, agent_id, {"id": incoming.task_id})
    suspension = turn.suspension
    if suspension is None or wire.task_state(turn) != "TASK_STATE_INPUT_REQUIRED":
        raise RpcError(wire.UNSUPPORTED_OPERATION, f"task {turn.id!r} does not wait for input")
    if suspension.correlation_id is None:
        if not incoming.text.strip():
            raise RpcError(wire.INVALID_PARAMS, "the answer to the question must be a text part")
        decision = chat.Decision("", "input", content=incoming.text)
    elif suspension.form is not None:
        if incoming.data is None:
            raise RpcError(wire.INVALID_PARAMS, "answer the form with a data part holding the form data")
        decision = chat.Decision(suspension.correlation_id, "form", data=incoming.data)
    else:
        approved = None if incoming.data is None else incoming.data.get("approved")
        if not isinstance(approved, bool):
            raise RpcError(wire.INVALID_PARAMS, 'answer the approval with a data part {"approved": true|false}')
        reason = incoming.data.get("reason") if incoming.data is not None else None
        decision = chat.Decision(
            suspension.correlation_id,
            "approve" if approved else "reject",
            reason=reason if isinstance(reason, str) and reason else None,
        )
    return chat.decide(runtime, tenant, turn, decision, CHANNEL)


async def _send(runtime: Runtime, tenant: Tenant, agent_id: str, params: dict[str, Any]) -> dict[str, Any]:
    started = await run_in_threadpool(_act, runtime, tenant, agent_id, params)
    configuration = params.get("configuration")
    immediately = isinstance(configuration, dict) and configuration.get("returnImmediately") is True
    turn = started.turn
    if not immediately:
        turn = await _settled(runtime, started)
    return {"task": await run_in_threadpool(_view, runtime, turn)}


async def _settled(runtime: Runtime, started: chat.Started) -> AgentTurn:
    """The turn once it ended or asks for input (or as it is after `BLOCKING_WAIT_S`)."""
    translator = steps.TurnTranslator(started.turn.id, chat.turn_content(runtime, started.turn))

    async def follow() -> None:
        async for _ in chat.stream_steps(runtime, translator, started.after, quiet_after=KEEPALIVE_S):
            pass

    try:
        await asyncio.wait_for(follow(), BLOCKING_WAIT_S)
    except TimeoutError:
        pass
    return await run_in_threadpool(runtime.turn_store.load, started.turn.id)


async def _get(runtime: Runtime, tenant: Tenant, agent_id: str, params: dict[str, Any]) -> dict[str, Any]:
    turn = await run_in_threadpool(_task_of, runtime, tenant, agent_id, params)
    return await run_in_threadpool(_view, runtime, turn)


def _cancel_now(runtime: Runtime, tenant: Tenant, agent_id: str, params: dict[str, Any]) -> dict[str, Any]:
    turn = _task_of(runtime, tenant, agent_id, params)
    return _view(runtime, service.cancel_turn(runtime, tenant, turn.id, CancelRequest(reason=CANCEL_REASON)))


async def _cancel(runtime: Runtime, tenant: Tenant, agent_id: str, params: dict[str, Any]) -> dict[str, Any]:
    return await run_in_threadpool(_cancel_now, runtime, tenant, agent_id, params)


async def _no_push(runtime: Runtime, tenant: Tenant, agent_id: str, params: dict[str, Any]) -> dict[str, Any]:
    raise RpcError(wire.PUSH_NOT_SUPPORTED, "push notifications are not supported; stream or poll the task")


_METHODS = {
    "SendMessage": _send,
    "GetTask": _get,
    "CancelTask": _cancel,
    "CreateTaskPushNotificationConfig": _no_push,
    "GetTaskPushNotificationConfig": _no_push,
    "ListTaskPushNotificationConfigs": _no_push,
    "DeleteTaskPushNotificationConfig": _no_push,
}


# --- Streams ----------------------------------------------------------------------------------


def _open_stream(
    runtime: Runtime, tenant: Tenant, agent_id: str, method: str, params: dict[str, Any]
) -> tuple[AgentTurn, Any]:
    """The turn to stream and the feed position its events start after.

    A subscription takes the position before reading the task it shows first, so the events
    that follow miss nothing that happened after the snapshot.
    """
    if method == "SendStreamingMessage":
        started = _act(runtime, tenant, agent_id, params)
        return started.turn, started.after
    turn = _task_of(runtime, tenant, agent_id, params)
    after = chat.feed_position(runtime, turn.id)
    return runtime.turn_store.load(turn.id), after


def _sse(request_id: Any, result: dict[str, Any]) -> str:
    return f"data: {json.dumps(_answer(request_id, result), separators=(',', ':'))}\n\n"


async def _stream(runtime: Runtime, request_id: Any, turn: AgentTurn, after: Any) -> AsyncIterator[str]:
    """The task first, then text as artifact updates and each status change, until the turn ends or asks for input."""
    first = await run_in_threadpool(_view, runtime, turn)
    yield _sse(request_id, {"task": first})
    if first["status"]["state"] in wire.STREAM_ENDS:
        return
    ids = {"taskId": turn.id, **({"contextId": turn.conversation_id} if turn.conversation_id else {})}
    translator = steps.TurnTranslator(turn.id, chat.turn_content(runtime, turn))
    opened: set[str] = set()
    async for batch in chat.stream_steps(runtime, translator, after, quiet_after=KEEPALIVE_S):
        if not batch:
            yield ": keep-alive\n\n"
            continue
        for step, _cursor in batch:
            if isinstance(step, steps.TextDelta) and step.delta:
                artifact = {"artifactId": step.text_id, "parts": [{"text": step.delta}]}
                update = {**ids, "artifact": artifact, "append": step.text_id in opened}
                opened.add(step.text_id)
                yield _sse(request_id, {"artifactUpdate": update})
            elif isinstance(step, steps.TurnFinished | steps.TurnFailed):
                current = await run_in_threadpool(runtime.turn_store.load, turn.id)
                agent = find_agent(runtime.agent_loader, current)
                yield _sse(request_id, {"statusUpdate": {**ids, "status": wire.task_status(current, agent)}})

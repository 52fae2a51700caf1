"""The routes of the HTTP API (DESIGN section 8): HTTP in, `workers.api.service` calls, JSON views out."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from agent_runner import AgentTurn, AgentTurnStatus, TurnNotFound
from store.idempotency import RESUME_MARK
from workers.api import service
from workers.api.auth import RuntimeDep, TenantDep, get_tenant
from workers.api.auth import get_runtime as get_runtime  # importable from here as before
from workers.api.bodies import (
    ID_PATTERN,
    AgentList,
    CancelRequest,
    MessageList,
    QueuedView,
    ResumeRequest,
    StartTurnRequest,
    TurnList,
    TurnView,
)
from workers.api.idempotency_header import Answer, is_cancelled, request_id, run_once, turn_id_of
from workers.api.openapi import error_responses
from workers.api.runtime import Runtime
from workers.api.tenancy import Tenant
from workers.views import catalog_mask, find_agent, message_view, turn_view

TurnId = Annotated[str, Path(pattern=ID_PATTERN, max_length=128, description="A turn id.")]
ConversationId = Annotated[str, Path(pattern=ID_PATTERN, max_length=128, description="A conversation id.")]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        pattern=r"^[\x21-\x7e]{1,255}$",
        description=(
            "Makes a retried POST return the first answer (same status and body) instead of acting again; "
            "scoped to the tenant. Reusing a key for a different request is a 422."
        ),
    ),
]


_Route = TypeVar("_Route", bound=Callable[..., Any])

router = APIRouter(prefix="/v1", dependencies=[Depends(get_tenant)], responses=error_responses(401, 413, 503))


def _view(runtime: Runtime, tenant: Tenant, turn: AgentTurn, *, messages: bool = False) -> dict[str, Any]:
    agent = find_agent(runtime.agent_loader, turn)
    return turn_view(turn, agent, messages=messages)


def _fingerprint(request: Request, body: BaseModel | None) -> str:
    data = None if body is None else body.model_dump(mode="json")
    text = json.dumps([request.method, request.url.path, data], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _key_fingerprint(request: Request, body: BaseModel | None, key: str | None) -> str:
    """The request's fingerprint for `run_once`; empty without an idempotency key, where nothing compares it."""
    return "" if key is None else _fingerprint(request, body)


def _turn_command(command: str, summary: str) -> Callable[[_Route], _Route]:
    """The POST route of a command on one turn: accepted (202) with the turn's view."""
    return router.post(
        f"/turns/{{turn_id}}/{command}",
        tags=["turns"],
        summary=summary,
        status_code=202,
        response_model=TurnView,
        responses=error_responses(404, 409, 422),
    )


# --- Turns ------------------------------------------------------------------------------------


@router.post(
    "/turns",
    tags=["turns"],
    summary="Start a turn",
    status_code=201,
    response_model=TurnView,
    responses={
        202: {
            "model": QueuedView | TurnView,
            "description": (
                "Queued (`if_busy=enqueue`, or an interrupt that had to wait): the queued message; or given to the "
                "conversation's active turn (`if_busy=steer`): the view of the turn that reads it."
            ),
        },
        **error_responses(404, 409, 422),
    },
)
def start_turn(
    request: Request,
    body: StartTurnRequest,
    runtime: RuntimeDep,
    tenant: TenantDep,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    """Start a turn of an agent; a worker runs it. Answers 201 with the turn, or 202 when the message was queued or steered."""
    # With a key, the same key always names the same message and turn, so even a request
    # redone after a crash cannot start, queue or project a second copy.
    message_id = request_id(tenant, idempotency_key)
    turn_id = turn_id_of(idempotency_key, message_id)

    def queued(conversation_id: str) -> Answer:
        return 202, {"status": "QUEUED", "message_id": message_id, "conversation_id": conversation_id}

    def act() -> Answer:
        outcome = service.start_turn(runtime, tenant, body, message_id, turn_id)
        if isinstance(outcome, service.Queued):
            return queued(outcome.conversation_id)
        if isinstance(outcome, service.Steered):
            return 202, _view(runtime, tenant, outcome.turn)
        return 201, _view(runtime, tenant, outcome)

    def find_earlier() -> Answer | None:
        assert turn_id is not None
        try:
            return 201, _view(runtime, tenant, service.get_turn(runtime, tenant, turn_id))
        except TurnNotFound:
            pass
        message = runtime.inbox.get(message_id)
        if message is None or message.tenant_id != tenant.id or body.conversation_id is None:
            return None
        return queued(body.conversation_id)

    return run_once(
        runtime, tenant, idempotency_key, _key_fingerprint(request, body, idempotency_key), act, find_earlier
    )


@router.get("/turns", tags=["turns"], summary="List turns", response_model=TurnList, responses=error_responses(422))
def list_turns(
    runtime: RuntimeDep,
    tenant: TenantDep,
    conversation_id: Annotated[str | None, Query(pattern=ID_PATTERN, max_length=128)] = None,
    status: Annotated[list[AgentTurnStatus] | None, Query(description="Repeat for several statuses.")] = None,
    agent_id: Annotated[str | None, Query(pattern=ID_PATTERN, max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=512, description="`next_cursor` of the previous page.")] = None,
) -> JSONResponse:
    """The tenant's turns, newest first, filtered by conversation, status and agent."""
    turns, next_cursor = service.list_turns(
        runtime,
        tenant,
        conversation_id=conversation_id,
        statuses=status,
        agent_id=agent_id,
        limit=limit,
        cursor=cursor,
    )
    return JSONResponse({"items": [_view(runtime, tenant, t) for t in turns], "next_cursor": next_cursor})


@router.get(
    "/turns/{turn_id}",
    tags=["turns"],
    summary="Get a turn",
    response_model=TurnView,
    responses=error_responses(404, 422),
)
def get_turn(
    turn_id: TurnId,
    runtime: RuntimeDep,
    tenant: TenantDep,
    messages: Annotated[bool, Query(description="Include the turn's messages.")] = False,
) -> JSONResponse:
    """A turn: status, what it waits for (with the frozen form schema), output, usage."""
    turn = service.get_turn(runtime, tenant, turn_id)
    return JSONResponse(_view(runtime, tenant, turn, messages=messages))


@_turn_command("resume", "Resume a waiting turn")
def resume_turn(
    request: Request,
    turn_id: TurnId,
    body: ResumeRequest,
    runtime: RuntimeDep,
    tenant: TenantDep,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    """Approve or reject a tool call, answer a question, submit a form or retry now; a worker continues the turn.

    Form data is checked against the schema frozen in the suspension: each failing field is
    a `details` item (`path` is a JSON Pointer such as `/impact_scope`). A decision that no
    longer fits (already decided, another call, a finished turn) is a 409; nothing changes.
    """
    mark = request_id(tenant, idempotency_key)
    marks = {} if idempotency_key is None else {RESUME_MARK: mark}

    def act() -> Answer:
        return 202, _view(runtime, tenant, service.resume_turn(runtime, tenant, turn_id, body, marks))

    def find_earlier() -> Answer | None:
        turn = service.get_turn(runtime, tenant, turn_id)
        return (202, _view(runtime, tenant, turn)) if runtime.idempotency.is_resume_applied(turn, mark) else None

    return run_once(
        runtime, tenant, idempotency_key, _key_fingerprint(request, body, idempotency_key), act, find_earlier
    )


@_turn_command("cancel", "Cancel a turn")
def cancel_turn(
    request: Request,
    turn_id: TurnId,
    runtime: RuntimeDep,
    tenant: TenantDep,
    body: CancelRequest | None = None,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    """Cancel a turn and its children; the history is closed out. A turn mid-step stops at its next boundary."""
    command = body if body is not None else CancelRequest()

    def act() -> Answer:
        return 202, _view(runtime, tenant, service.cancel_turn(runtime, tenant, turn_id, command))

    def find_earlier() -> Answer | None:
        turn = service.get_turn(runtime, tenant, turn_id)
        return (202, _view(runtime, tenant, turn)) if is_cancelled(turn) else None

    return run_once(
        runtime, tenant, idempotency_key, _key_fingerprint(request, command, idempotency_key), act, find_earlier
    )


# --- Conversations and agents -----------------------------------------------------------------


@router.get(
    "/conversations/{conversation_id}/messages",
    tags=["conversations"],
    summary="A conversation's page timeline",
    response_model=MessageList,
    responses=error_responses(422),
)
def conversation_messages(
    conversation_id: ConversationId,
    runtime: RuntimeDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    before: Annotated[
        str | None, Query(pattern=ID_PATTERN, max_length=128, description="Only messages older than this message id.")
    ] = None,
) -> JSONResponse:
    """Messages oldest first, with approval cards and forms in their current status and the actions they offer."""
    found = service.conversation_messages(runtime, tenant, conversation_id, limit=limit, before=before)
    mask = catalog_mask(runtime.agent_loader)
    items = []
    for message in found:
        item = message_view(mask, message)
        actions = getattr(message, "get_actions", None)
        if callable(actions):
            item["actions"] = actions()
        items.append(item)
    return JSONResponse({"items": items})


@router.get("/agents", tags=["agents"], summary="List agents", response_model=AgentList)
def list_agents(runtime: RuntimeDep) -> JSONResponse:
    """The agents this server can run, with their tools (and which need approval) and forms."""
    return JSONResponse({"items": service.agent_catalog(runtime)})

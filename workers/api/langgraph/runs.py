"""Runs of the LangGraph API: a run is a turn of the thread's conversation.

A run with `input` starts a turn with the input's last user message; one with
`command.resume` resumes the thread's waiting turn, which stays the same run (the same
`run_id`). `multitask_strategy` is the busy-conversation policy of `POST /v1/turns`:
`reject` (409), `enqueue` (the run is `pending` until the conversation frees; its id is
the queued message's until the turn starts) and `interrupt` (the active turn is cancelled
with close-out). A run with `after_seconds` is a turn saved READY that no worker starts
before then: it is `pending` meanwhile, and it is the thread's active run. `rollback` is refused with a 422 `RollbackNotSupportedError`: a conversation's
messages are never deleted, so a cancelled run cannot be taken out of the thread's state.

Every creation answers with `Content-Location: /threads/{thread_id}/runs/{run_id}`; a
streaming one adds `Location: .../stream`, where `join_stream` reconnects with
`Last-Event-ID`. `wait` and `join` answer the thread's values once the run ended or waits
for a person (with `__interrupt__`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

import store
from agent_runner import AgentTurn, TurnNotFound
from agent_runner.feed import FeedReader
from agent_runner.ids import new_id
from agent_runner.persistence import EventScope
from agent_runner.snapshot import WAITING_FOR_A_PERSON
from workers.api import service
from workers.api.auth import RuntimeDep, TenantDep, get_tenant
from workers.api.bodies import ID_PATTERN, CancelRequest, StartTurnRequest
from workers.api.errors import ApiError, InvalidRequestError, RecordNotFoundError
from workers.api.event_streams import LastEventId
from workers.api.langgraph.mapping import (
    NotSupportedError,
    input_text,
    interrupt_of,
    resume_command,
    run_status,
)
from workers.api.langgraph.request_bodies import MAX_OFFSET, RunCreate
from workers.api.langgraph.stream_parts import SUPPORTED_MODES, RunTranslator, run_stream
from workers.api.langgraph.threads import (
    HISTORY_MESSAGES,
    RecordsDep,
    ThreadId,
    ThreadNotFoundError,
    create_thread,
    load_thread,
    thread_records,
    thread_view,
)
from workers.api.openapi import error_responses, event_stream_response
from workers.api.runtime import Runtime
from workers.api.tenancy import Tenant
from workers.views import find_agent

RunId = Annotated[str, Path(pattern=ID_PATTERN, max_length=128, description="A run id (a turn id).")]

_POLL_S = 0.1
"""How often a waiting request looks at its run."""

router = APIRouter(
    tags=["langgraph"], dependencies=[Depends(get_tenant)], responses=error_responses(404, 409, 413, 501)
)
RUN_STREAM = event_stream_response("`text/event-stream` of the run's events in the stream modes asked for.")


class RollbackNotSupportedError(ApiError):
    """`rollback` cannot be honoured: a cancelled run's messages stay in the conversation (422)."""

    def __init__(self, where: str) -> None:
        super().__init__(
            422,
            "rollback is not supported: a conversation's messages are never deleted, so a cancelled run cannot be "
            "removed from the thread's state; use interrupt (cancel with close-out) instead",
            type_name="RollbackNotSupported",
            details=[{"path": where, "message": "rollback is not supported; use interrupt"}],
        )


@dataclass(frozen=True)
class StartedRun:
    """A run just created: its turn (None while it is queued), its id, and where its stream starts."""

    thread: store.ThreadRecord
    run_id: str
    turn: AgentTurn | None
    after: str | None
    strategy: str


def run_view(turn: AgentTurn, thread_id: str, strategy: str | None = None) -> dict[str, Any]:
    """The `Run` object of a turn."""
    return {
        "run_id": turn.id,
        "thread_id": thread_id,
        "assistant_id": turn.agent_id,
        "created_at": turn.created_at.isoformat(),
        "updated_at": turn.updated_at.isoformat(),
        "status": run_status(turn),
        "metadata": turn.metadata,
        "multitask_strategy": strategy,
        "kwargs": {},
    }


def _queued_view(message: store.InboxMessage, thread_id: str, strategy: str | None) -> dict[str, Any]:
    return {
        "run_id": message.message_id,
        "thread_id": thread_id,
        "assistant_id": message.agent_id,
        "created_at": None,
        "updated_at": None,
        "status": "pending" if message.status in (store.InboxStatus.PENDING, store.InboxStatus.PROCESSING) else "error",
        "metadata": message.metadata,
        "multitask_strategy": strategy,
        "kwargs": {},
    }


def _check_supported(body: RunCreate) -> None:
    """Answer 501 for the options that would change the outcome and are not implemented."""
    unsupported = [mode for mode in body.modes() if mode not in SUPPORTED_MODES]
    if unsupported:
        raise NotSupportedError(f"stream_mode {', '.join(unsupported)} (supported: {', '.join(SUPPORTED_MODES)})")
    options = {
        "interrupt_before": body.interrupt_before,
        "interrupt_after": body.interrupt_after,
        "webhook": body.webhook,
        "checkpoint": body.checkpoint,
        "checkpoint_id": body.checkpoint_id,
        "feedback_keys": body.feedback_keys,
    }
    for name, value in options.items():
        if value not in (None, [], {}):
            raise NotSupportedError(f"the run option {name}")
    if body.on_completion == "delete":
        raise NotSupportedError("on_completion=delete")
    if body.command is not None and (body.command.update is not None or body.command.goto is not None):
        raise NotSupportedError("command.update and command.goto (only command.resume)")
    if body.after_seconds and body.command is not None:
        raise NotSupportedError("after_seconds with command.resume (a resumed run continues at once)")


def tree_end(runtime: Runtime, root_turn_id: str) -> str:
    """The feed cursor after every event of the turn tree stored so far."""
    reader = FeedReader(runtime.events, EventScope.tree(root_turn_id))
    for _ in reader.pages():
        pass
    return str(reader.position)


def start_run(
    runtime: Runtime, tenant: Tenant, records: store.ThreadRecords, thread_id: str | None, body: RunCreate
) -> StartedRun:
    """Create the run: find (or create) the thread, then start a turn or resume the waiting one."""
    _check_supported(body)
    service.start_time(runtime, body.after_seconds, "after_seconds")  # refused before a thread is created
    if body.multitask_strategy == "rollback":
        raise RollbackNotSupportedError("/multitask_strategy")
    runtime.agent_loader.load(body.assistant_id)
    if thread_id is None:
        thread = create_thread(records, tenant, None, {}, if_exists="raise")
    else:
        try:
            thread = load_thread(records, tenant, thread_id)
        except ThreadNotFoundError:
            if body.if_not_exists != "create":
                raise
            thread = create_thread(records, tenant, thread_id, {}, if_exists="do_nothing")
    if body.command is not None and body.command.resume is not None:
        if body.input is not None:
            raise InvalidRequestError("send either input or command.resume, not both", path="/input")
        return _resume(runtime, tenant, thread, body)
    if body.input is None:
        raise InvalidRequestError('a run needs input ({"messages": [...]}) or command.resume', path="/input")
    history = runtime.memories.of(thread.conversation).get_model_messages(HISTORY_MESSAGES)
    text = input_text(body.input, history)
    request = StartTurnRequest(
        agent_id=body.assistant_id,
        input=text,
        conversation_id=thread.thread_id,
        metadata=body.metadata,
        if_busy=body.multitask_strategy,  # rollback was refused above
        start_after_seconds=body.after_seconds,
    )
    outcome = service.start_turn(runtime, tenant, request, new_id())
    if isinstance(outcome, service.Queued):
        return StartedRun(thread, outcome.message_id, None, None, body.multitask_strategy)
    if isinstance(outcome, service.Steered):
        # The input joined the active run: the answer is that run, streamed from here on.
        turn = outcome.turn
        return StartedRun(thread, turn.id, turn, tree_end(runtime, turn.root_turn_id), body.multitask_strategy)
    return StartedRun(thread, outcome.id, outcome, None, body.multitask_strategy)


def _resume(runtime: Runtime, tenant: Tenant, thread: store.ThreadRecord, body: RunCreate) -> StartedRun:
    assert body.command is not None
    active = runtime.turn_store.find_active_turn(thread.conversation_id, thread.tenant_id)
    if active is None or active.status not in WAITING_FOR_A_PERSON:
        raise ApiError(
            409, f"thread {thread.thread_id!r} has no interrupted run to resume", type_name="NoPendingInterrupt"
        )
    if active.agent_id != body.assistant_id:
        raise InvalidRequestError(
            f"the interrupted run belongs to assistant {active.agent_id!r}, not {body.assistant_id!r}",
            path="/assistant_id",
        )
    metadata = service.decision_metadata(tenant, "langgraph", body.metadata)
    command = resume_command(active, find_agent(runtime.agent_loader, active), body.command.resume, metadata)
    after = tree_end(runtime, active.root_turn_id)
    turn = runtime.runner.submit_resume(active.id, command)
    return StartedRun(thread, turn.id, turn, after, body.multitask_strategy)


def find_run(runtime: Runtime, thread: store.ThreadRecord, run_id: str) -> AgentTurn | store.InboxMessage:
    """The run's turn, or its queued message while it has not started.

    Raises:
        RecordNotFoundError: No run of this id in the thread (`RunNotFound`).
    """
    try:
        turn = runtime.turn_store.load(run_id)
    except TurnNotFound:
        turn = None
    if turn is not None:
        if turn.conversation_id != thread.conversation_id or turn.tenant_id != thread.tenant_id:
            raise RecordNotFoundError("run", run_id)
        return turn
    message = runtime.inbox.get(run_id)
    if message is None or message.conversation != thread.conversation:
        raise RecordNotFoundError("run", run_id)
    if message.turn_id is not None:
        return runtime.turn_store.load(message.turn_id)
    return message


async def _started_turn(runtime: Runtime, thread: store.ThreadRecord, run_id: str) -> AgentTurn:
    """The run's turn, waiting for a queued run to start."""
    while True:
        found = await run_in_threadpool(find_run, runtime, thread, run_id)
        if isinstance(found, AgentTurn):
            return found
        if found.status in (store.InboxStatus.FAILED, store.InboxStatus.COMPLETED):
            raise ApiError(409, f"run {run_id!r} could not start: {found.error}", type_name="RunNotStarted")
        await asyncio.sleep(_POLL_S)


def _settled(turn: AgentTurn) -> bool:
    return turn.is_terminal or turn.status in WAITING_FOR_A_PERSON


async def _until_settled(runtime: Runtime, thread: store.ThreadRecord, run_id: str) -> AgentTurn:
    turn = await _started_turn(runtime, thread, run_id)
    while not _settled(turn):
        await asyncio.sleep(_POLL_S)
        turn = await run_in_threadpool(runtime.turn_store.load, turn.id)
    return turn


def _final_values(runtime: Runtime, thread: store.ThreadRecord, turn: AgentTurn) -> dict[str, Any]:
    """What `wait` and `join` answer: the thread's values, with `__interrupt__` when the run waits."""
    values: dict[str, Any] = thread_view(runtime, thread)["values"]
    interrupt = interrupt_of(turn, find_agent(runtime.agent_loader, turn))
    if interrupt is not None:
        values = {**values, "__interrupt__": [interrupt]}
    if turn.is_terminal and run_status(turn) == "error":
        values = {**values, "__error__": {"error": turn.status.value, "message": turn.error or turn.status.value}}
    return values


def _location(thread_id: str, run_id: str) -> str:
    return f"/threads/{thread_id}/runs/{run_id}"


async def _stream_response(
    runtime: Runtime,
    thread: store.ThreadRecord,
    run_id: str,
    turn: AgentTurn | None,
    modes: list[str],
    subgraphs: bool,
    after: str | None,
    *,
    fresh: bool,
    headers: dict[str, str],
    cancel_on_disconnect: bool = False,
) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        root = turn
        if root is None:
            yield ": queued\n\n"
            root = await _started_turn(runtime, thread, run_id)
        translator = await run_in_threadpool(RunTranslator, runtime, root, thread.thread_id, modes, subgraphs)
        metadata = {"run_id": root.id, "attempt": 1} if fresh else None
        stream = run_stream(runtime, translator, after, metadata=metadata, cancel_on_disconnect=cancel_on_disconnect)
        async for chunk in stream:
            yield chunk

    chunks = body()
    # The first chunk is produced before answering, so a bad cursor is a 422, not a broken stream.
    first = await anext(chunks)

    async def replayed() -> AsyncIterator[str]:
        yield first
        async for chunk in chunks:
            yield chunk

    return StreamingResponse(
        replayed(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers},
    )


# --- Routes -----------------------------------------------------------------------------------


async def _create(
    runtime: Runtime, tenant: Tenant, records: store.ThreadRecords, thread_id: str | None, body: RunCreate
) -> JSONResponse:
    started = await run_in_threadpool(start_run, runtime, tenant, records, thread_id, body)
    thread_shown = started.thread.thread_id
    if started.turn is not None:
        view = run_view(started.turn, thread_shown, started.strategy)
    else:
        message = await run_in_threadpool(runtime.inbox.get, started.run_id)
        assert message is not None
        view = _queued_view(message, thread_shown, started.strategy)
    return JSONResponse(view, headers={"Content-Location": _location(thread_shown, started.run_id)})


async def _create_stream(
    runtime: Runtime, tenant: Tenant, records: store.ThreadRecords, thread_id: str | None, body: RunCreate
) -> StreamingResponse:
    started = await run_in_threadpool(start_run, runtime, tenant, records, thread_id, body)
    location = _location(started.thread.thread_id, started.run_id)
    return await _stream_response(
        runtime,
        started.thread,
        started.run_id,
        started.turn,
        body.modes(),
        body.stream_subgraphs,
        started.after,
        fresh=True,
        headers={"Content-Location": location, "Location": f"{location}/stream"},
        cancel_on_disconnect=body.on_disconnect == "cancel",
    )


async def _create_wait(
    runtime: Runtime, tenant: Tenant, records: store.ThreadRecords, thread_id: str | None, body: RunCreate
) -> JSONResponse:
    started = await run_in_threadpool(start_run, runtime, tenant, records, thread_id, body)
    turn = await _until_settled(runtime, started.thread, started.run_id)
    values = await run_in_threadpool(_final_values, runtime, started.thread, turn)
    location = _location(started.thread.thread_id, started.run_id)
    return JSONResponse(values, headers={"Content-Location": location, "Location": f"{location}/join"})


@router.post("/threads/{thread_id}/runs", summary="Create a background run")
async def create(
    thread_id: ThreadId, body: RunCreate, runtime: RuntimeDep, tenant: TenantDep, records: RecordsDep
) -> JSONResponse:
    """Start a turn on the thread (or resume its interrupted one) and answer at once with the run."""
    return await _create(runtime, tenant, records, thread_id, body)


@router.post(
    "/threads/{thread_id}/runs/stream",
    summary="Create a run and stream it",
    response_class=StreamingResponse,
    responses=RUN_STREAM,
)
async def create_stream(
    thread_id: ThreadId, body: RunCreate, runtime: RuntimeDep, tenant: TenantDep, records: RecordsDep
) -> StreamingResponse:
    """Start (or resume) a run and stream it as server-sent events in the stream modes asked for."""
    return await _create_stream(runtime, tenant, records, thread_id, body)


@router.post("/threads/{thread_id}/runs/wait", summary="Create a run and wait for it")
async def create_wait(
    thread_id: ThreadId, body: RunCreate, runtime: RuntimeDep, tenant: TenantDep, records: RecordsDep
) -> JSONResponse:
    """Start (or resume) a run and answer the thread's values once it ended or waits for a person."""
    return await _create_wait(runtime, tenant, records, thread_id, body)


@router.post("/runs", summary="Create a background run on a new thread")
async def create_stateless(
    body: RunCreate, runtime: RuntimeDep, tenant: TenantDep, records: RecordsDep
) -> JSONResponse:
    """Like `/threads/{thread_id}/runs`, on a new thread."""
    return await _create(runtime, tenant, records, None, body)


@router.post(
    "/runs/stream", summary="Stream a run on a new thread", response_class=StreamingResponse, responses=RUN_STREAM
)
async def create_stateless_stream(
    body: RunCreate, runtime: RuntimeDep, tenant: TenantDep, records: RecordsDep
) -> StreamingResponse:
    """Like `/threads/{thread_id}/runs/stream`, on a new thread."""
    return await _create_stream(runtime, tenant, records, None, body)


@router.post("/runs/wait", summary="Wait for a run on a new thread")
async def create_stateless_wait(
    body: RunCreate, runtime: RuntimeDep, tenant: TenantDep, records: RecordsDep
) -> JSONResponse:
    """Like `/threads/{thread_id}/runs/wait`, on a new thread."""
    return await _create_wait(runtime, tenant, records, None, body)


@router.get("/threads/{thread_id}/runs", summary="List a thread's runs")
async def list_runs(
    thread_id: ThreadId,
    runtime: RuntimeDep,
    tenant: TenantDep,
    records: RecordsDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    status: Annotated[str | None, Query(pattern="^(pending|running|error|success|timeout|interrupted)$")] = None,
) -> JSONResponse:
    """The thread's runs (its turns), newest first."""

    def act() -> list[dict[str, Any]]:
        thread = load_thread(records, tenant, thread_id)
        turns = runtime.turn_store.list_page(
            tenant_id=thread.tenant_id,
            statuses=None,
            conversation_id=thread.conversation_id,
            agent_id=None,
            before=None,
            limit=offset + limit if status is None else 1000,
        )
        views = [run_view(turn, thread.thread_id) for turn in turns]
        views = [view for view in views if status is None or view["status"] == status]
        return views[offset : offset + limit]

    return JSONResponse(await run_in_threadpool(act))


def _run_of(
    runtime: Runtime, records: store.ThreadRecords, tenant: Tenant, thread_id: str, run_id: str
) -> tuple[store.ThreadRecord, AgentTurn | store.InboxMessage]:
    thread = load_thread(records, tenant, thread_id)
    return thread, find_run(runtime, thread, run_id)


@router.get("/threads/{thread_id}/runs/{run_id}", summary="Get a run")
async def get(
    thread_id: ThreadId, run_id: RunId, runtime: RuntimeDep, tenant: TenantDep, records: RecordsDep
) -> JSONResponse:
    """A run with its status."""
    thread, found = await run_in_threadpool(_run_of, runtime, records, tenant, thread_id, run_id)
    if isinstance(found, AgentTurn):
        return JSONResponse(run_view(found, thread.thread_id))
    return JSONResponse(_queued_view(found, thread.thread_id, "enqueue"))


@router.get("/threads/{thread_id}/runs/{run_id}/join", summary="Wait for a run")
async def join(
    thread_id: ThreadId, run_id: RunId, runtime: RuntimeDep, tenant: TenantDep, records: RecordsDep
) -> JSONResponse:
    """The thread's values once the run ended or waits for a person."""
    thread, _ = await run_in_threadpool(_run_of, runtime, records, tenant, thread_id, run_id)
    turn = await _until_settled(runtime, thread, run_id)
    return JSONResponse(await run_in_threadpool(_final_values, runtime, thread, turn))


@router.get(
    "/threads/{thread_id}/runs/{run_id}/stream",
    summary="Join a run's stream",
    response_class=StreamingResponse,
    responses=RUN_STREAM,
)
async def join_stream(
    request: Request,
    thread_id: ThreadId,
    run_id: RunId,
    runtime: RuntimeDep,
    tenant: TenantDep,
    records: RecordsDep,
    stream_mode: Annotated[list[str] | None, Query()] = None,
    cancel_on_disconnect: Annotated[bool, Query()] = False,
    last_event_id: LastEventId = None,
) -> StreamingResponse:
    """The run's stream from its start, or after `Last-Event-ID` (nothing missed, nothing repeated)."""
    # The SDKs send an empty `stream_mode=` when none was chosen: every supported mode then.
    chosen = [mode for mode in stream_mode or [] if mode]
    modes = list(dict.fromkeys(chosen or ["values", "updates", "messages-tuple", "custom"]))
    unsupported = [mode for mode in modes if mode not in SUPPORTED_MODES]
    if unsupported:
        raise NotSupportedError(f"stream_mode {', '.join(unsupported)} (supported: {', '.join(SUPPORTED_MODES)})")
    thread, found = await run_in_threadpool(_run_of, runtime, records, tenant, thread_id, run_id)
    turn = found if isinstance(found, AgentTurn) else None
    location = _location(thread.thread_id, run_id)
    return await _stream_response(
        runtime,
        thread,
        run_id,
        turn,
        modes,
        False,
        last_event_id or None,
        fresh=not last_event_id,
        headers={"Content-Location": location, "Location": f"{location}/stream"},
        cancel_on_disconnect=cancel_on_disconnect,
    )


@router.post("/threads/{thread_id}/runs/{run_id}/cancel", summary="Cancel a run")
async def cancel(
    thread_id: ThreadId,
    run_id: RunId,
    runtime: RuntimeDep,
    tenant: TenantDep,
    records: RecordsDep,
    wait: Annotated[bool, Query()] = False,
    action: Annotated[str, Query(pattern="^(interrupt|rollback)$")] = "interrupt",
) -> Response:
    """Cancel the run (its turn ends CANCELLED, history closed out); `wait=1` answers once it has ended."""
    if action == "rollback":
        raise RollbackNotSupportedError("action")
    thread, found = await run_in_threadpool(_run_of, runtime, records, tenant, thread_id, run_id)
    if not isinstance(found, AgentTurn):
        raise ApiError(
            409, f"run {run_id!r} is queued and has not started; cancel it once it runs", type_name="RunNotStarted"
        )
    turn = await run_in_threadpool(service.cancel_turn, runtime, tenant, found.id, CancelRequest())
    if wait:
        while not turn.is_terminal:
            await asyncio.sleep(_POLL_S)
            turn = await run_in_threadpool(runtime.turn_store.load, turn.id)
        return JSONResponse(run_view(turn, thread.thread_id))
    return JSONResponse(run_view(turn, thread.thread_id), status_code=202)


@router.delete("/threads/{thread_id}/runs/{run_id}", summary="Delete a run", status_code=204)
async def delete(
    thread_id: ThreadId, run_id: RunId, runtime: RuntimeDep, tenant: TenantDep, records: RecordsDep
) -> Response:
    """Not supported for a finished run (its turn is the conversation's record); an active run is a 409."""
    _, found = await run_in_threadpool(_run_of, runtime, records, tenant, thread_id, run_id)
    if isinstance(found, AgentTurn) and not found.is_terminal:
        raise ApiError(409, f"run {run_id!r} is still active; cancel it first", type_name="RunActive")
    raise NotSupportedError("deleting a run (its turn stays as the conversation's record)")


__all__ = ["router", "run_view", "start_run", "thread_records"]

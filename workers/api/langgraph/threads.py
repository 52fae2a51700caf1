"""Threads of the LangGraph API: a thread is a conversation.

A thread's messages are the conversation's chat memory, its runs the conversation's turns,
and its status follows from them: `busy` while a turn runs, `interrupted` while one waits
for a person, `error` when the newest turn failed, else `idle`. The thread record
(`store.ThreadRecords`) adds what a conversation lacks: the owner, metadata, creation time.

Deleting a thread cancels its active turn (with close-out) and marks the record deleted:
the thread is gone for the API (404, not listed, its id cannot be created again), while
its turns, their events and the conversation's messages are kept as the audit record.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

import store
from agent_runner import AgentTurn, AnyMessage, SystemMessage
from agent_runner.ids import new_id
from workers.api.auth import RuntimeDep, TenantDep, get_tenant
from workers.api.bodies import ID_PATTERN
from workers.api.errors import ApiError, RecordNotFoundError
from workers.api.langgraph.mapping import (
    NotSupportedError,
    interrupt_of,
    langchain_messages,
    thread_status,
)
from workers.api.langgraph.request_bodies import ThreadCreate, ThreadHistoryQuery, ThreadPatch, ThreadSearch
from workers.api.langgraph.run_events import next_node
from workers.api.openapi import error_responses
from workers.api.runtime import Runtime
from workers.api.tenancy import Tenant
from workers.views import catalog_mask, find_agent

HISTORY_MESSAGES = 10_000
"""Most messages of a conversation shown as a thread's state."""

ThreadId = Annotated[str, Path(pattern=ID_PATTERN, max_length=128, description="A thread id (a conversation id).")]

router = APIRouter(
    tags=["langgraph"], dependencies=[Depends(get_tenant)], responses=error_responses(404, 409, 413, 501)
)


class ThreadNotFoundError(RecordNotFoundError):
    """No such thread for this tenant (404)."""

    def __init__(self, thread_id: str) -> None:
        super().__init__("thread", thread_id)


class ThreadExistsError(ApiError):
    """A thread with this id exists (or existed) already (409)."""

    def __init__(self, thread_id: str) -> None:
        super().__init__(409, f"thread {thread_id!r} already exists", type_name="ThreadExists")


def thread_records(runtime: RuntimeDep) -> store.ThreadRecords:
    """The thread records of the server's database."""
    assert runtime.threads is not None  # made with every runtime
    return runtime.threads


RecordsDep = Annotated[store.ThreadRecords, Depends(thread_records)]


def _iso(moment: datetime) -> str:
    return moment.isoformat()


def load_thread(records: store.ThreadRecords, tenant: Tenant, thread_id: str) -> store.ThreadRecord:
    """The tenant's existing thread.

    Raises:
        ThreadNotFoundError: No such thread, a deleted one, or another tenant's.
    """
    record = records.get(tenant.reaches(thread_id))
    if record is None or record.deleted_at is not None or record.tenant_id != tenant.id:
        raise ThreadNotFoundError(thread_id)
    return record


def create_thread(
    records: store.ThreadRecords, tenant: Tenant, thread_id: str | None, metadata: dict[str, Any], *, if_exists: str
) -> store.ThreadRecord:
    """Create a thread (a new id when none is given); `if_exists` `do_nothing` returns an existing one.

    A token limited to one conversation reaches one thread only: with no id given, that
    thread is the one meant (created, or returned when it exists).

    Raises:
        ThreadExistsError: The id is taken (409), by a live thread with `raise`, or by a deleted one.
        ConversationNotFoundError: The request's token is limited to another conversation (404).
    """
    if thread_id is None and tenant.conversation is not None:
        thread_id = tenant.conversation
        if_exists = "do_nothing"
    chosen = thread_id or new_id()
    record, created = records.create(tenant.reaches(chosen), chosen, metadata)
    if created:
        return record
    if record.tenant_id == tenant.id and record.deleted_at is None and if_exists == "do_nothing":
        return record
    raise ThreadExistsError(chosen)


def _turns(runtime: Runtime, record: store.ThreadRecord, limit: int) -> list[AgentTurn]:
    return runtime.turn_store.list_page(
        tenant_id=record.tenant_id,
        statuses=None,
        conversation_id=record.conversation_id,
        agent_id=None,
        before=None,
        limit=limit,
    )


def newest_turn(runtime: Runtime, record: store.ThreadRecord) -> AgentTurn | None:
    """The thread's newest turn, with its messages (what `with_unprojected` needs: a listing has none).

    Read it before ChatMemory: a projection made between the two reads is then in ChatMemory.
    """
    newest = _turns(runtime, record, 1)
    return runtime.turn_store.load(newest[0].id) if newest else None


def with_unprojected(messages: Sequence[AnyMessage], newest: AgentTurn | None) -> list[AnyMessage]:
    """The conversation's messages from ChatMemory, with those of its newest turn it does not show yet.

    A store that cannot write ChatMemory in its saves (SQLite; a PostgreSQL save on its
    fallback path) projects a turn's messages just after the save, so a read right after a
    turn ended may find ChatMemory one save behind the turn. The turn is the truth; its
    messages past `projected_count` that ChatMemory lacks (by id) come last, once.
    """
    if newest is None or newest.projected_count >= len(newest.messages):
        return list(messages)
    shown = {message.id for message in messages}
    missing = [
        m for m in newest.messages[newest.projected_count :] if not isinstance(m, SystemMessage) and m.id not in shown
    ]
    return [*messages, *missing]


def thread_view(
    runtime: Runtime, record: store.ThreadRecord, *, with_values: bool = True, newest_in_full: bool = True
) -> dict[str, Any]:
    """The `Thread` object: id, times, metadata, status, values and pending interrupts.

    `newest_in_full`: read the newest turn's messages too, so that values show an answer
    ChatMemory does not hold yet (see `with_unprojected`); a listing of many threads skips
    that read and shows what ChatMemory holds.
    """
    active = runtime.turn_store.find_active_turn(record.conversation_id, record.tenant_id)
    newest = _turns(runtime, record, 1)
    last = newest[0] if newest else None
    view: dict[str, Any] = {
        "thread_id": record.thread_id,
        "created_at": _iso(record.created_at),
        "updated_at": _iso(max(record.updated_at, last.updated_at) if last is not None else record.updated_at),
        "metadata": record.metadata,
        "status": thread_status(active, last),
        "interrupts": {},
    }
    if active is not None:
        interrupt = interrupt_of(active, find_agent(runtime.agent_loader, active))
        if interrupt is not None:
            view["interrupts"] = {interrupt["id"]: [interrupt]}
    if with_values:
        # The turn before ChatMemory: a projection made between the two reads is then in ChatMemory.
        in_full = runtime.turn_store.load(last.id) if last is not None and newest_in_full else None
        stored = runtime.memories.of(record.conversation).get_model_messages(HISTORY_MESSAGES)
        view["values"] = {"messages": _messages(runtime, record, with_unprojected(stored, in_full))}
    return view


def _messages(runtime: Runtime, record: store.ThreadRecord, messages: Sequence[AnyMessage]) -> list[dict[str, Any]]:
    return langchain_messages(messages, catalog_mask(runtime.agent_loader))


def _checkpoint(record: store.ThreadRecord, checkpoint_id: str | None) -> dict[str, Any]:
    return {"thread_id": record.thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id, "checkpoint_map": None}


def thread_state(runtime: Runtime, record: store.ThreadRecord) -> dict[str, Any]:
    """The thread's current state: messages, what runs next, the pending task and its interrupt."""
    newest = newest_turn(runtime, record)
    stored = runtime.memories.of(record.conversation).get_model_messages(HISTORY_MESSAGES)
    messages = with_unprojected(stored, newest)
    active = runtime.turn_store.find_active_turn(record.conversation_id, record.tenant_id)
    interrupts: list[dict[str, Any]] = []
    tasks: list[dict[str, Any]] = []
    next_nodes: list[str] = []
    if active is not None:
        node = next_node(active)
        next_nodes = [node]
        interrupt = interrupt_of(active, find_agent(runtime.agent_loader, active))
        if interrupt is not None:
            interrupts = [interrupt]
        tasks = [
            {
                "id": active.id,
                "name": node,
                "path": [],
                "error": None,
                "interrupts": interrupts,
                "checkpoint": None,
                "state": None,
                "result": None,
            }
        ]
    last_message = messages[-1].id if messages else None
    return {
        "values": {"messages": _messages(runtime, record, messages)},
        "next": next_nodes,
        "tasks": tasks,
        "interrupts": interrupts,
        "checkpoint": _checkpoint(record, last_message),
        "parent_checkpoint": None,
        "metadata": {**record.metadata, "run_id": newest.id if newest else None},
        "created_at": _iso(newest.updated_at if newest else record.created_at),
    }


def thread_history(runtime: Runtime, record: store.ThreadRecord, limit: int) -> list[dict[str, Any]]:
    """The thread's states, newest first: the current one, then the state after each earlier turn ended.

    There are no checkpoints inside a turn: a turn is the unit of history.
    """
    messages = runtime.memories.of(record.conversation).get_model_messages(HISTORY_MESSAGES)
    states = [thread_state(runtime, record)]
    positions = {message.id: index for index, message in enumerate(messages)}
    for turn in _turns(runtime, record, limit):
        if len(states) >= limit:
            break
        if not turn.is_terminal:
            continue
        loaded = runtime.turn_store.load(turn.id)  # listings leave the messages out
        owned = [positions[m.id] for m in loaded.messages if m.id in positions]
        if not owned:
            continue
        upto = messages[: max(owned) + 1]
        if len(upto) == len(messages) and len(states) == 1 and states[0]["next"] == []:
            continue  # the current state already is the state after this turn
        states.append(
            {
                "values": {"messages": _messages(runtime, record, upto)},
                "next": [],
                "tasks": [],
                "interrupts": [],
                "checkpoint": _checkpoint(record, upto[-1].id),
                "parent_checkpoint": None,
                "metadata": {**record.metadata, "run_id": turn.id},
                "created_at": _iso(turn.updated_at),
            }
        )
    return states


# --- Routes -----------------------------------------------------------------------------------


@router.post("/threads", summary="Create a thread")
async def create(body: ThreadCreate, runtime: RuntimeDep, tenant: TenantDep, records: RecordsDep) -> JSONResponse:
    """Create a thread (a conversation), with `thread_id` or a new id; `if_exists=do_nothing` returns an existing one."""
    if body.supersteps:
        raise NotSupportedError("creating a thread from supersteps")
    if body.ttl is not None:
        raise NotSupportedError("a thread TTL")

    def act() -> dict[str, Any]:
        record = create_thread(records, tenant, body.thread_id, body.metadata, if_exists=body.if_exists)
        return thread_view(runtime, record)

    return JSONResponse(await run_in_threadpool(act))


def _query(tenant: Tenant, body: ThreadSearch) -> store.ThreadQuery:
    """The store query of a search's filters and order.

    Raises:
        NotSupportedError: A filter on values, or `extract`.
    """
    if body.values:
        raise NotSupportedError("searching threads by values")
    if body.extract is not None:
        raise NotSupportedError("extract in a thread search")
    return store.ThreadQuery(
        tenant_id=tenant.id,
        conversation_id=tenant.conversation,  # a token limited to one conversation sees that thread only
        thread_ids=body.ids,
        metadata=body.metadata,
        status=body.status,
        sort_by=body.sort_by or "created_at",
        descending=body.sort_order != "asc",
    )


@router.post("/threads/search", summary="Search threads")
async def search(body: ThreadSearch, runtime: RuntimeDep, tenant: TenantDep, records: RecordsDep) -> JSONResponse:
    """A page of the tenant's threads (newest first unless sorted otherwise), filtered by metadata, ids and status.

    The filters, the order and the page are one query; only the threads of the page are read further.
    """

    def act() -> list[dict[str, Any]]:
        page = records.search(_query(tenant, body), limit=body.limit, offset=body.offset)
        return [thread_view(runtime, record, newest_in_full=False) for record in page]

    return JSONResponse(await run_in_threadpool(act))


@router.post("/threads/count", summary="Count threads")
async def count(body: ThreadSearch, tenant: TenantDep, records: RecordsDep) -> JSONResponse:
    """How many of the tenant's threads match the filters of a search."""
    return JSONResponse(await run_in_threadpool(records.count, _query(tenant, body)))


@router.get("/threads/{thread_id}", summary="Get a thread")
async def get(thread_id: ThreadId, runtime: RuntimeDep, tenant: TenantDep, records: RecordsDep) -> JSONResponse:
    """A thread with its status, values and pending interrupts."""
    return JSONResponse(await run_in_threadpool(lambda: thread_view(runtime, load_thread(records, tenant, thread_id))))


@router.patch("/threads/{thread_id}", summary="Update a thread's metadata")
async def patch(
    thread_id: ThreadId, body: ThreadPatch, runtime: RuntimeDep, tenant: TenantDep, records: RecordsDep
) -> JSONResponse:
    """Merge `metadata` into the thread's metadata."""
    if body.ttl is not None:
        raise NotSupportedError("a thread TTL")

    def act() -> dict[str, Any]:
        record = load_thread(records, tenant, thread_id)
        updated = records.update_metadata(record.conversation, body.metadata)
        if updated is None:
            raise ThreadNotFoundError(thread_id)
        return thread_view(runtime, updated)

    return JSONResponse(await run_in_threadpool(act))


@router.delete("/threads/{thread_id}", summary="Delete a thread", status_code=204)
async def delete(thread_id: ThreadId, runtime: RuntimeDep, tenant: TenantDep, records: RecordsDep) -> Response:
    """Cancel the thread's active run and delete the thread; its turns, events and messages are kept."""

    def act() -> None:
        record = load_thread(records, tenant, thread_id)
        active = runtime.turn_store.find_active_turn(record.conversation_id, record.tenant_id)
        if active is not None:
            runtime.runner.cancel(active.id, "thread deleted")
        records.delete(record.conversation)

    await run_in_threadpool(act)
    return Response(status_code=204)


@router.get("/threads/{thread_id}/state", summary="Get a thread's state")
async def state(
    thread_id: ThreadId,
    runtime: RuntimeDep,
    tenant: TenantDep,
    records: RecordsDep,
    subgraphs: Annotated[bool, Query()] = False,
) -> JSONResponse:
    """The current state: `values.messages`, `next`, `tasks` and `interrupts`."""
    return JSONResponse(await run_in_threadpool(lambda: thread_state(runtime, load_thread(records, tenant, thread_id))))


@router.get("/threads/{thread_id}/state/{checkpoint_id}", summary="Get a thread's state at a checkpoint")
async def state_at(thread_id: ThreadId, checkpoint_id: str) -> JSONResponse:
    """Not supported: a thread keeps no checkpoints inside its turns (see `/history`)."""
    raise NotSupportedError("reading a thread's state at a checkpoint")


@router.post("/threads/{thread_id}/state", summary="Update a thread's state")
async def update_state(thread_id: ThreadId) -> JSONResponse:
    """Not supported: a conversation's messages change only through its turns."""
    raise NotSupportedError("updating a thread's state")


@router.get("/threads/{thread_id}/history", summary="A thread's history")
async def history_get(
    thread_id: ThreadId,
    runtime: RuntimeDep,
    tenant: TenantDep,
    records: RecordsDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
) -> JSONResponse:
    """The thread's states, newest first (the current one, then one after each earlier turn)."""
    return JSONResponse(
        await run_in_threadpool(lambda: thread_history(runtime, load_thread(records, tenant, thread_id), limit))
    )


@router.post("/threads/{thread_id}/history", summary="A thread's history")
async def history_post(
    thread_id: ThreadId, body: ThreadHistoryQuery, runtime: RuntimeDep, tenant: TenantDep, records: RecordsDep
) -> JSONResponse:
    """The thread's states, newest first; `before` and `checkpoint` filters are not supported."""
    if body.before is not None or body.checkpoint is not None:
        raise NotSupportedError("filtering a thread's history by checkpoint")
    return JSONResponse(
        await run_in_threadpool(lambda: thread_history(runtime, load_thread(records, tenant, thread_id), body.limit))
    )

"""Server-sent events of a turn tree or a conversation, from the event feed (durable log plus live channel).

Each event is written as

    id: <cursor>
    event: <AgentEventType>
    data: <AgentEvent JSON>

A client that reconnects sends its last cursor (`Last-Event-ID`, which browsers send by
themselves, or `?after=`) and gets exactly the events after it. A comment line goes out
whenever the stream has been quiet for `KEEPALIVE_S`, so proxies keep the connection.
The turn stream ends with `event: end` once the root turn has ended and its events are
out; `?follow=false` sends what is stored and closes.

Following the feed blocks (it waits on the live channel), so each open stream holds a
thread of its own pool while it waits, apart from the pool of the other routes.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

import anyio
from anyio.to_thread import run_sync
from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import StreamingResponse

from agent_runner import AgentEvent, EventFeed, ToolCall
from agent_runner.persistence import DEFAULT_EVENT_PAGE
from workers.api.routes import ConversationId, RuntimeDep, TenantDep, TurnId, _errors, get_tenant
from workers.api.runtime import Runtime
from workers.api.tenancy import Tenant
from workers.views import ArgumentMask, catalog_mask, tool_call_view

KEEPALIVE_S = 10.0
"""Longest quiet stretch before a comment line is sent (at most 15 s is promised)."""

STREAM_THREADS = 256
"""Streams that can wait on the feed at the same time; more wait for a free thread."""

_limiter: anyio.CapacityLimiter | None = None

_CURSOR_PATTERN = r"^[A-Za-z0-9._:-]{0,256}$"

Cursor = Annotated[
    str | None, Query(pattern=_CURSOR_PATTERN, max_length=256, description="Send events after this cursor.")
]
LastEventId = Annotated[
    str | None,
    Header(
        alias="Last-Event-ID",
        pattern=_CURSOR_PATTERN,
        max_length=256,
        description="The cursor of the last event received (browsers send it when they reconnect); wins over `after`.",
    ),
]
Follow = Annotated[
    bool, Query(description="Keep the stream open for new events (false: send what is stored and close).")
]

_SSE_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "`text/event-stream`: `id: <cursor>`, `event: <type>`, `data: <AgentEvent JSON>` per event.",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}

router = APIRouter(prefix="/v1", tags=["events"], dependencies=[Depends(get_tenant)])


def _stream_limiter() -> anyio.CapacityLimiter:
    global _limiter
    if _limiter is None:
        _limiter = anyio.CapacityLimiter(STREAM_THREADS)
    return _limiter


def format_event(event: AgentEvent, tenant: Tenant, mask: ArgumentMask) -> str:
    """One event in the SSE format, its conversation id as the tenant knows it and its arguments masked."""
    data = event.model_dump(mode="json")
    data["conversation_id"] = tenant.shown_conversation(event.conversation_id)
    data["data"] = _masked(event.data, mask)
    return f"id: {event.cursor or ''}\nevent: {event.type.value}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _masked(data: dict[str, Any], mask: ArgumentMask) -> dict[str, Any]:
    """Event data with any tool-call arguments masked like everywhere else in the API."""
    if "arguments" in data and isinstance(data.get("arguments"), dict) and isinstance(data.get("tool_name"), str):
        call = ToolCall(id=str(data.get("tool_call_id") or ""), name=data["tool_name"], arguments=data["arguments"])
        data = {**data, "arguments": mask(call)}
    calls = data.get("tool_calls")
    if isinstance(calls, list) and any(isinstance(c, dict) and "arguments" in c for c in calls):
        masked = []
        for call in calls:
            if isinstance(call, dict) and isinstance(call.get("arguments"), dict) and isinstance(call.get("name"), str):
                made = ToolCall(id=str(call.get("id") or ""), name=call["name"], arguments=call["arguments"])
                masked.append(tool_call_view(mask, made))
            else:
                masked.append(call)
        data = {**data, "tool_calls": masked}
    return data


class _Stream:
    """The events of one scope after a cursor, read and followed on a thread of the stream pool."""

    def __init__(self, feed: EventFeed, scope: dict[str, str], after: str | None) -> None:
        self.feed = feed
        self.root_turn_id = scope.get("root_turn_id")
        self.conversation_id = scope.get("conversation_id")
        self.cursor = after
        self._following: Iterator[AgentEvent] | None = None

    def read_page(self) -> list[AgentEvent]:
        """The stored events after the cursor (one page); moves the cursor past them."""
        events = self.feed.read(
            root_turn_id=self.root_turn_id,
            conversation_id=self.conversation_id,
            after=self.cursor,
            limit=DEFAULT_EVENT_PAGE,
        )
        if events:
            self.cursor = events[-1].cursor
        return events

    def root_end_stored(self) -> bool:
        """Whether the root turn's terminal event is readable, wherever it lies in the stream."""
        after: str | None = None
        while True:
            page = self.feed.read(root_turn_id=self.root_turn_id, after=after, limit=DEFAULT_EVENT_PAGE)
            if any(e.turn_id == self.root_turn_id and e.type.is_terminal for e in page):
                return True
            if len(page) < DEFAULT_EVENT_PAGE:
                return False
            after = page[-1].cursor

    def next_event(self, timeout: float) -> AgentEvent | None:
        """The next event, waiting up to `timeout` seconds for one; None when none came."""
        if self._following is None:
            self._following = self.feed.follow(
                root_turn_id=self.root_turn_id, conversation_id=self.conversation_id, after=self.cursor, timeout=timeout
            )
        try:
            event = next(self._following)
        except StopIteration:
            self._following = None
            return None
        self.cursor = event.cursor
        return event


async def _in_thread(function: Any, *args: Any) -> Any:
    return await run_sync(function, *args, abandon_on_cancel=True, limiter=_stream_limiter())


def _end(turn_id: str, status: str) -> str:
    return f"event: end\ndata: {json.dumps({'turn_id': turn_id, 'status': status})}\n\n"


def _ends_root(event: AgentEvent, root_turn_id: str | None) -> bool:
    return root_turn_id is not None and event.turn_id == root_turn_id and event.type.is_terminal


class _Writer:
    """Formats events for one client and remembers whether the root's terminal event went out."""

    def __init__(self, tenant: Tenant, mask: ArgumentMask, root_turn_id: str | None) -> None:
        self.tenant = tenant
        self.mask = mask
        self.root_turn_id = root_turn_id
        self.root_ended = False

    def __call__(self, event: AgentEvent) -> str:
        self.root_ended = self.root_ended or _ends_root(event, self.root_turn_id)
        return format_event(event, self.tenant, self.mask)


async def _replay(stream: _Stream, page: list[AgentEvent], write: _Writer) -> AsyncIterator[str]:
    """Send `page` and every stored page after it."""
    while page:
        for event in page:
            yield write(event)
        page = await _in_thread(stream.read_page)


async def _finish(runtime: Runtime, stream: _Stream, write: _Writer, root_turn_id: str) -> AsyncIterator[str]:
    """If the root turn has ended and its terminal event is out: send what is left, then `end`.

    The terminal event is stored with the turn's last save, but on PostgreSQL it becomes
    readable a moment later (see the event log), so the status alone does not end the
    stream. When this stream has not sent that event, it either lies before the client's
    cursor (stored, so `end` now) or is not readable yet (the follow brings it).
    """
    ref = await _in_thread(runtime.turn_store.get_ref, root_turn_id)
    if not ref.status.is_terminal:
        return
    async for chunk in _replay(stream, await _in_thread(stream.read_page), write):
        yield chunk
    if write.root_ended or await _in_thread(stream.root_end_stored):
        yield _end(root_turn_id, ref.status.value)
        write.root_ended = True


async def _follow(
    runtime: Runtime, stream: _Stream, first: list[AgentEvent], write: _Writer, root_turn_id: str | None
) -> AsyncIterator[str]:
    yield ": stream open\n\n"
    async for chunk in _replay(stream, first, write):
        yield chunk
    if root_turn_id is not None:
        async for chunk in _finish(runtime, stream, write, root_turn_id):
            yield chunk
        if write.root_ended:
            return
    last_comment = time.monotonic()
    while True:
        event = await _in_thread(stream.next_event, KEEPALIVE_S)
        if event is not None:
            yield write(event)
        if event is None or time.monotonic() - last_comment >= KEEPALIVE_S:
            yield ": keep-alive\n\n"
            last_comment = time.monotonic()
        if root_turn_id is not None and (event is None or _ends_root(event, root_turn_id)):
            async for chunk in _finish(runtime, stream, write, root_turn_id):
                yield chunk
            if write.root_ended:
                return


def _response(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        body,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _open(
    runtime: Runtime,
    tenant: Tenant,
    scope: dict[str, str],
    cursor: str | None,
    follow: bool,
    root_turn_id: str | None,
) -> StreamingResponse:
    stream = _Stream(runtime.events, scope, cursor)
    # The first page is read before answering, so a bad cursor is a 422 rather than a broken stream.
    first = await _in_thread(stream.read_page)
    write = _Writer(tenant, catalog_mask(runtime.agent_loader), root_turn_id)
    if follow:
        return _response(_follow(runtime, stream, first, write, root_turn_id))

    async def replay_and_close() -> AsyncIterator[str]:
        async for chunk in _replay(stream, first, write):
            yield chunk
        if root_turn_id is not None:
            ref = await _in_thread(runtime.turn_store.get_ref, root_turn_id)
            if ref.status.is_terminal:
                yield _end(root_turn_id, ref.status.value)

    return _response(replay_and_close())


@router.get(
    "/turns/{turn_id}/events",
    summary="Events of a turn tree (SSE)",
    response_class=StreamingResponse,
    responses={**_SSE_RESPONSE, **_errors(401, 404, 422, 503)},
)
async def turn_events(
    turn_id: TurnId,
    runtime: RuntimeDep,
    tenant: TenantDep,
    after: Cursor = None,
    follow: Follow = True,
    last_event_id: LastEventId = None,
) -> StreamingResponse:
    """The events of the turn and its child turns, as server-sent events; `event: end` after the root turn ends."""
    turn = await _in_thread(runtime.turn_store.load, turn_id)
    tenant.check(turn)
    root = turn.root_turn_id
    return await _open(runtime, tenant, {"root_turn_id": root}, last_event_id or after, follow, root)


@router.get(
    "/conversations/{conversation_id}/events",
    summary="Events of a conversation (SSE)",
    response_class=StreamingResponse,
    responses={**_SSE_RESPONSE, **_errors(401, 422, 503)},
)
async def conversation_events(
    conversation_id: ConversationId,
    runtime: RuntimeDep,
    tenant: TenantDep,
    after: Cursor = None,
    follow: Follow = True,
    last_event_id: LastEventId = None,
) -> StreamingResponse:
    """Every event of the conversation's turns (and their child turns), as server-sent events."""
    scope = {"conversation_id": tenant.stored_conversation(conversation_id)}
    return await _open(runtime, tenant, scope, last_event_id or after, follow, None)

"""Server-sent events of a turn tree or a conversation, from the event feed (durable log plus live channel).

Each event is written as

    id: <cursor>
    event: <AgentEventType>
    data: <AgentEvent JSON>

A client that reconnects sends its last cursor (`Last-Event-ID`, which browsers send by
themselves, or `?after=`) and gets exactly the events after it. A comment line goes out
whenever the stream has been quiet for `KEEPALIVE_S`, so proxies keep the connection.
The turn stream ends with `event: end` once the root turn has ended and its terminal event
is out (sent on this connection, or before the client's cursor); `?follow=false` sends
what is stored and closes, with `end` on the same terms.

Following costs a stream no thread: the streams of a turn tree or a conversation take
their events from one follower of that scope shared in the process (`workers.api.fanout`),
which waits on the live channel and reads the log for all of them. Reads (a stream catching
up from its cursor) run on a small pool of threads of their own, apart from the other
routes'; so do the few streams that follow on their own (see `_Stream`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
from anyio.to_thread import run_sync
from fastapi import APIRouter, Depends, FastAPI, Header, Query
from fastapi.responses import StreamingResponse
from pydantic import AfterValidator
from pydantic.json_schema import models_json_schema

from agent_runner import AgentEvent, EventFeed, EventScope, ToolCall
from agent_runner.feed import FeedFollower, FeedPage, FeedPosition, FeedReader
from agent_runner.persistence import DEFAULT_EVENT_PAGE
from workers.api import service
from workers.api.auth import RuntimeDep, TenantDep, get_tenant
from workers.api.bodies import AgentEventView
from workers.api.fanout import DetachedError, EventFanout, Subscription
from workers.api.openapi import error_responses as _errors
from workers.api.openapi import event_stream_response
from workers.api.routes import ConversationId, TurnId
from workers.api.runtime import Runtime
from workers.api.tenancy import Tenant
from workers.views import ArgumentMask, catalog_mask, tool_call_view

KEEPALIVE_S = 10.0
"""Longest quiet stretch before a comment line is sent (at most 15 s is promised)."""

STREAM_THREADS = 256
"""Streams that can follow the feed on their own at the same time (a thread each); more wait for a thread."""

READ_THREADS = 32
"""Threads the streams read on (catching up, checking their turn); more reads wait for one, holding no thread."""

_limiters: dict[str, anyio.CapacityLimiter] = {}

_CURSOR_PATTERN = r"^[A-Za-z0-9._:-]{0,256}$"

Cursor = Annotated[
    str | None, Query(pattern=_CURSOR_PATTERN, max_length=256, description="Send events after this cursor.")
]
FROM_THE_START = "-1"
"""The `Last-Event-ID` that asks for a stream from its start (the LangGraph SDKs send it when a page rejoins a run)."""


def _from_the_start(value: str | None) -> str | None:
    return None if value == FROM_THE_START else value


LastEventId = Annotated[
    str | None,
    Header(
        alias="Last-Event-ID",
        pattern=_CURSOR_PATTERN,
        max_length=256,
        description=(
            "The cursor of the last event received (browsers send it when they reconnect); wins over `after`. "
            f"`{FROM_THE_START}` means from the start."
        ),
    ),
    AfterValidator(_from_the_start),
]
"""The `Last-Event-ID` header of every event stream: a cursor, or None for the start (`-1` included)."""
Follow = Annotated[
    bool, Query(description="Keep the stream open for new events (false: send what is stored and close).")
]


@dataclass(frozen=True)
class StreamStart:
    """Where an event stream of the API starts, and whether it stays open for new events."""

    cursor: str | None
    """Send the events after this cursor (None: from the start)."""
    follow: bool


def stream_start(after: Cursor = None, follow: Follow = True, last_event_id: LastEventId = None) -> StreamStart:
    """The start a request asks for: `Last-Event-ID` (a reconnecting browser's) wins over `after`."""
    return StreamStart(last_event_id or after, follow)


StartDep = Annotated[StreamStart, Depends(stream_start)]


_SSE_RESPONSE = event_stream_response(
    "`text/event-stream`: per event `id: <cursor>`, `event: <type>` and `data: <JSON>`, the JSON an "
    "`AgentEventView` (`event: end` last, its data `{turn_id, status}`).",
    {"$ref": f"#/components/schemas/{AgentEventView.__name__}"},
)


def document_event_schemas(app: FastAPI) -> None:
    """Add `AgentEventView` and the schemas it uses to the app's OpenAPI document.

    The event routes refer to them, but no route body or response model holds them, so
    FastAPI would not list them by itself.
    """
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = generate()
            _, document = models_json_schema(
                [(AgentEventView, "serialization")], ref_template="#/components/schemas/{model}"
            )
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in document.get("$defs", {}).items():
                schemas.setdefault(name, schema)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


router = APIRouter(prefix="/v1", tags=["events"], dependencies=[Depends(get_tenant)])


def _limiter(name: str, threads: int) -> anyio.CapacityLimiter:
    limiter = _limiters.get(name)
    if limiter is None:
        limiter = _limiters[name] = anyio.CapacityLimiter(threads)
    return limiter


def format_event(event: AgentEvent, mask: ArgumentMask) -> str:
    """One event in the SSE format, its arguments masked.

    The tenant is left out: a stream shows the events of one tenant's turns, and its
    conversation id is the one that tenant named.
    """
    data = event.model_dump(mode="json", exclude={"tenant_id"})
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


class _Stream(FeedReader):
    """The events of one scope after a cursor: read from the feed, then taken from the scope's shared follower.

    Reads (`read_more`: a `FeedReader` page, which moves the position) run on threads of
    the read pool. Following joins the scope's `EventFanout` follower once the reads
    reached the end of the feed (see `workers.api.fanout`); a stream that cannot join it
    (the server follows too many scopes, or the follower keeps being elsewhere) follows
    the feed on its own, on a thread of a pool of such streams.
    """

    def __init__(
        self, feed: EventFeed, fanout: EventFanout, scope: EventScope, after: FeedPosition | str | None
    ) -> None:
        super().__init__(feed, scope, after=after)
        self.fanout = fanout
        self._subscription: Subscription | None = None
        self._alone: FeedFollower | None = None
        self._missed_joins = 0

    async def read_more(self) -> list[AgentEvent]:
        """The stored events after the position (one page, read on the read pool); moves the position past them."""
        page: FeedPage = await _in_thread(self.read_page)
        return page.events

    def root_end_passed(self) -> bool:
        """Whether the root turn's terminal event lies at or before this stream's place in the log.

        It does when the client resumed after it (it got the event on an earlier connection,
        but not the `end`). The tree's log is read from its start up to that place.
        """
        until = self.position.log
        if until is None or self.scope.kind != "tree":
            return False
        after: str | None = None
        while True:
            page = self.feed.log.read_events(self.scope, after=after, limit=DEFAULT_EVENT_PAGE)
            for event in page:
                if _ends_root(event, self.scope.id):
                    return True
                if event.cursor == until:
                    return False
            if len(page) < DEFAULT_EVENT_PAGE:
                return False
            after = page[-1].cursor

    async def next_events(self, timeout: float) -> list[AgentEvent]:
        """The next events, waiting up to `timeout` seconds for some; empty when none came."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            if self._alone is not None:
                alone = self._alone
                events: list[AgentEvent] = await run_sync(
                    alone.next_batch, remaining, abandon_on_cancel=True, limiter=_limiter("follow", STREAM_THREADS)
                )
                self.position = alone.position
                return events
            if self._subscription is None:
                if self.read_due:
                    events = await self.read_more()
                    if events:
                        return events
                    continue
                if not await self._join(remaining):
                    return []
                continue
            subscription = self._subscription
            try:
                events = await subscription.next_batch(remaining)
            except DetachedError:
                self.leave()
                continue
            self.position = subscription.position
            return events

    async def _join(self, remaining: float) -> bool:
        """Join the shared follower at the position reached; False when `remaining` ran out first."""
        self._subscription = self.fanout.subscribe(self.scope, self.position)
        if self._subscription is not None:
            self._missed_joins = 0
            return True
        self._missed_joins += 1
        if self._missed_joins > _JOIN_ATTEMPTS or not self.fanout.has_room(self.scope):
            self._alone = FeedFollower(self.feed, self.scope, after=self.position)
            return True
        # The shared follower stands elsewhere: a moment behind this stream (it will get
        # here) or ahead of it (a read gets this stream there). Wait a little, read, retry.
        pause = min(remaining, _JOIN_RETRY_S * self._missed_joins)
        await asyncio.sleep(pause)
        self.read_due = True
        return pause < remaining

    def leave(self) -> None:
        """Stop following (reads go on from the position; following joins again)."""
        if self._subscription is not None:
            self.position = self._subscription.position
            self._subscription.close()
            self._subscription = None
        if self._alone is not None:
            self.position = self._alone.position
            self._alone = None
        self.read_due = True


_JOIN_ATTEMPTS = 5
"""Joins of the shared follower a stream tries in a row before it follows on its own."""
_JOIN_RETRY_S = 0.05


async def _in_thread(function: Any, *args: Any) -> Any:
    return await run_sync(function, *args, abandon_on_cancel=True, limiter=_limiter("read", READ_THREADS))


def _end(turn_id: str, status: str) -> str:
    return f"event: end\ndata: {json.dumps({'turn_id': turn_id, 'status': status})}\n\n"


def _ends_root(event: AgentEvent, root_turn_id: str | None) -> bool:
    return root_turn_id is not None and event.turn_id == root_turn_id and event.type.is_terminal


class _Writer:
    """Formats events for one client and remembers whether the root's terminal event went out."""

    def __init__(self, mask: ArgumentMask, root_turn_id: str | None) -> None:
        self.mask = mask
        self.root_turn_id = root_turn_id
        self.root_ended = False

    def __call__(self, event: AgentEvent) -> str:
        self.root_ended = self.root_ended or _ends_root(event, self.root_turn_id)
        if _has_arguments(event.data):
            return format_event(event, self.mask)
        return _shared_texts.text(event)


def _has_arguments(data: dict[str, Any]) -> bool:
    """Whether masking may change the event's data (see `_masked`)."""
    return "arguments" in data or "tool_calls" in data


class _SharedTexts:
    """The SSE text of events without arguments to mask, kept for the other streams sending the same event.

    The streams of a shared follower send the very same event objects, so each event is
    formatted once rather than once per stream. Without arguments the text depends only
    on the event, which makes the key (the event object by identity, kept alive while its
    text is).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._texts: OrderedDict[int, tuple[AgentEvent, str]] = OrderedDict()
        self._lock = threading.Lock()

    def text(self, event: AgentEvent) -> str:
        key = id(event)
        with self._lock:
            found = self._texts.get(key)
        if found is not None and found[0] is event:
            return found[1]
        text = format_event(event, _no_arguments)
        with self._lock:
            self._texts[key] = (event, text)
            if len(self._texts) > self.size:
                self._texts.popitem(last=False)
        return text


def _no_arguments(call: ToolCall) -> dict[str, Any]:
    raise AssertionError("an event with arguments is formatted with the stream's mask")


_shared_texts = _SharedTexts(4096)


async def _replay(stream: _Stream, page: list[AgentEvent], write: _Writer) -> AsyncIterator[str]:
    """Send `page` and every stored page after it."""
    while page:
        yield "".join(write(event) for event in page)
        page = await stream.read_more()


async def _finish(runtime: Runtime, stream: _Stream, write: _Writer, root_turn_id: str) -> AsyncIterator[str]:
    """If the root turn has ended: send every stored event this stream has not sent, then `end`.

    The status is read first and the log after it: the terminal event was saved in the
    same statement as the status, and the log shows a save's events as soon as it
    committed, so these reads bring it unless it lies before the client's cursor (a client
    that got it on an earlier connection). `end` goes out only in those two cases; a
    turn whose terminal event is in neither place gets no `end`.
    """
    ref = await _in_thread(runtime.turn_store.get_ref, root_turn_id)
    if not ref.status.is_terminal:
        return
    stream.leave()
    async for chunk in _replay(stream, await stream.read_more(), write):
        yield chunk
    if write.root_ended or await _in_thread(stream.root_end_passed):
        yield _end(root_turn_id, ref.status.value)
        write.root_ended = True


async def _follow(
    runtime: Runtime, stream: _Stream, first: list[AgentEvent], write: _Writer, root_turn_id: str | None
) -> AsyncIterator[str]:
    try:
        yield ": stream open\n\n"
        if first:
            yield "".join(write(event) for event in first)
        if root_turn_id is not None:
            async for chunk in _finish(runtime, stream, write, root_turn_id):
                yield chunk
            if write.root_ended:
                return
        last_comment = time.monotonic()
        while True:
            events = await runtime.fanout.unless_closing(stream.next_events(KEEPALIVE_S))
            if events is None:
                return  # the server is stopping: end the stream now, the client reconnects elsewhere
            if events:
                # One write per batch: a burst of deltas costs the server one send per stream.
                yield "".join(write(event) for event in events)
            if not events or time.monotonic() - last_comment >= KEEPALIVE_S:
                yield ": keep-alive\n\n"
                last_comment = time.monotonic()
            if root_turn_id is not None and (not events or any(_ends_root(e, root_turn_id) for e in events)):
                async for chunk in _finish(runtime, stream, write, root_turn_id):
                    yield chunk
                if write.root_ended:
                    return
    finally:
        stream.leave()


def _response(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        body,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _open(runtime: Runtime, tenant: Tenant, scope: EventScope, start: StreamStart) -> StreamingResponse:
    # A turn tree's stream ends after its root turn; a conversation's goes on.
    root_turn_id = scope.id if scope.kind == "tree" else None
    stream = _Stream(runtime.events, runtime.fanout, scope, start.cursor)
    # The first page is read before answering, so a bad cursor is a 422 rather than a broken stream.
    first = await stream.read_more()
    write = _Writer(catalog_mask(runtime.agent_loader), root_turn_id)
    if start.follow:
        return _response(_follow(runtime, stream, first, write, root_turn_id))

    async def replay_and_close() -> AsyncIterator[str]:
        async for chunk in _replay(stream, first, write):
            yield chunk
        if root_turn_id is not None:
            # A turn that ended during the replay: its last events are sent before `end`.
            async for chunk in _finish(runtime, stream, write, root_turn_id):
                yield chunk

    return _response(replay_and_close())


@router.get(
    "/turns/{turn_id}/events",
    summary="Events of a turn tree (SSE)",
    response_class=StreamingResponse,
    responses={**_SSE_RESPONSE, **_errors(401, 404, 422, 503)},
)
async def turn_events(turn_id: TurnId, runtime: RuntimeDep, tenant: TenantDep, start: StartDep) -> StreamingResponse:
    """The events of the turn and its child turns, as server-sent events; `event: end` after the root turn ends."""
    turn = await _in_thread(service.get_turn, runtime, tenant, turn_id)
    return await _open(runtime, tenant, EventScope.tree(turn.root_turn_id), start)


@router.get(
    "/conversations/{conversation_id}/events",
    summary="Events of a conversation (SSE)",
    response_class=StreamingResponse,
    responses={**_SSE_RESPONSE, **_errors(401, 422, 503)},
)
async def conversation_events(
    conversation_id: ConversationId, runtime: RuntimeDep, tenant: TenantDep, start: StartDep
) -> StreamingResponse:
    """Every event of the conversation's turns (and their child turns), as server-sent events."""
    scope = EventScope.of_conversation(tenant.reaches(conversation_id))
    return await _open(runtime, tenant, scope, start)


async def follow_tree(
    runtime: Runtime, root_turn_id: str, after: FeedPosition | str | None = None, *, quiet_after: float = KEEPALIVE_S
) -> AsyncIterator[list[AgentEvent]]:
    """The events of a turn tree after `after`, batch by batch, read and followed like the SSE streams do.

    For the client protocols (`workers.api.protocols`), which write the events in a shape
    of their own. A batch is empty when nothing came for `quiet_after` seconds (time for a
    keep-alive). The iteration ends once the root turn's terminal event has been yielded;
    the caller may stop earlier (a turn waiting for a person).
    """
    stream = _Stream(runtime.events, runtime.fanout, EventScope.tree(root_turn_id), after)
    try:
        while True:
            events = await stream.next_events(quiet_after)
            yield events
            if any(_ends_root(e, root_turn_id) for e in events):
                return
    finally:
        stream.leave()

"""What every chat protocol does with a conversation: start a turn, answer what it waits for, stop it, stream it.

The protocol modules parse their client's request into one of these calls and write the
resulting `Step`s in their own format. Everything goes through the server's runner, turn
store, tenants and event feed, as the `/v1/turns` routes do:

- a new user message starts a turn in the conversation through `service.start_turn`
  (busy conversations are refused, the `reject` policy of `if_busy`), or answers the
  active turn's plain-text question;
- a decision (approve, reject, form data) is submitted to the waiting turn with
  `runner.submit_resume`, validated against the frozen form schema;
- a stream is the turn tree's events from the event feed, translated by a
  `TurnTranslator`, so a client that reconnects gets them again from the log.

A client message id names the stored user message (hashed with the tenant and the
conversation), so a request sent twice finds the turn its first copy started instead of
starting another.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from agent_runner import (
    AgentEvent,
    AgentEventType,
    AgentTurn,
    SuspensionType,
    TurnNotFound,
    UserMessage,
)
from agent_runner.feed import FeedPosition, FeedReader
from agent_runner.persistence import EventScope
from store.idempotency import RESUME_MARK
from workers.api import service
from workers.api.bodies import CancelRequest, ResumeRequest, StartTurnRequest
from workers.api.errors import ApiError, InvalidRequestError
from workers.api.event_streams import follow_tree
from workers.api.idempotency_header import Answer, request_id, run_once, turn_id_of
from workers.api.protocols.steps import (
    ApprovalRequested,
    FormRequested,
    QuestionAsked,
    Step,
    TurnContent,
    TurnFailed,
    TurnFinished,
    TurnTranslator,
    ends_stream,
)
from workers.api.runtime import Runtime
from workers.api.tenancy import Tenant
from workers.views import agent_mask, find_agent

CHANNEL_METADATA_KEY = "channel"
"""The resume metadata (and turn metadata) naming the client protocol a decision or a turn came through."""


class NothingToAnswerError(ApiError):
    """A decision for a conversation whose active turn does not wait for it (409)."""

    wire_type = "NothingToAnswer"

    def __init__(self, conversation_id: str, message: str) -> None:
        super().__init__(409, f"conversation {conversation_id!r}: {message}")


@dataclass(frozen=True)
class Decision:
    """A person's answer to what a turn waits for: `kind` is the resume action (see `ResumeRequest`)."""

    call_id: str
    """The tool call answered (unused for `input`, the answer to a plain-text question)."""
    kind: Literal["approve", "reject", "form", "input"]
    reason: str | None = None
    data: dict[str, Any] | None = None
    content: str | None = None


@dataclass(frozen=True)
class Started:
    """The turn a request acted on, and where its client's stream starts (None: the turn's first event)."""

    turn: AgentTurn
    after: FeedPosition | None

    def to_json(self) -> dict[str, Any]:
        """What an idempotency key records, to stream the same turn from the same place on a retry."""
        return {"turn_id": self.turn.id, "after": None if self.after is None else str(self.after)}


def stored_message_id(tenant: Tenant, conversation_id: str, client_message_id: str) -> str:
    """The id of the stored user message for a client's message id (the same for a retried request)."""
    raw = f"{tenant.id or ''}\x00{conversation_id}\x00{client_message_id}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def active_turn(runtime: Runtime, tenant: Tenant, agent_id: str, conversation_id: str) -> AgentTurn | None:
    """The conversation's active (not ended) turn of this agent, if any."""
    conversation = tenant.reaches(conversation_id)
    turn = runtime.turn_store.find_active_turn(conversation.conversation_id, conversation.tenant_id)
    if turn is None or not tenant.owns(turn) or turn.agent_id != agent_id:
        return None
    return turn


IF_BUSY_FIELD = "ifBusy"
"""Where a chat request says what a message for a busy conversation does: `reject` (the default) or `steer`."""


def steers(value: Any, path: str) -> bool:
    """Whether a chat request's `ifBusy` asks to steer the active turn.

    Raises:
        InvalidRequest: The value is neither `reject` nor `steer`.
    """
    if value is None or value == "reject":
        return False
    if value == "steer":
        return True
    raise InvalidRequestError(f"{IF_BUSY_FIELD} must be 'reject' or 'steer', got {value!r}", path=path)


def send_message(
    runtime: Runtime,
    tenant: Tenant,
    agent_id: str,
    conversation_id: str,
    text: str,
    message_id: str,
    channel: str,
    ids: RequestIds | None = None,
    *,
    steer: bool = False,
) -> Started:
    """Start a turn from a user message, or answer the active turn's plain-text question with it.

    A message already stored (the same request sent again) starts nothing: its turn is
    streamed from the start. With `steer`, a message for a conversation whose active turn is
    not asking a question joins that turn (`if_busy=steer`), and its stream continues.

    Raises:
        AgentNotFound: No such agent.
        ConversationBusyError: The conversation has an active turn that is not asking a question (409),
            and `steer` is off.
    """
    conversation = tenant.reaches(conversation_id)
    for turn in runtime.turn_store.list_turns(
        conversation_id=conversation.conversation_id, tenant_id=conversation.tenant_id, limit=1
    ):
        if tenant.owns(turn) and any(isinstance(m, UserMessage) and m.id == message_id for m in turn.messages):
            return Started(turn, None)
    waiting = active_turn(runtime, tenant, agent_id, conversation_id)
    suspension = None if waiting is None else waiting.suspension
    if (
        waiting is not None
        and suspension is not None
        and suspension.type is SuspensionType.USER_INPUT
        and suspension.correlation_id is None
    ):
        return decide(runtime, tenant, waiting, Decision("", "input", content=text), channel, ids)
    # Steering, the stream continues the active turn from here (it reads the message at its next model call).
    busy = runtime.turn_store.find_active_turn(conversation.conversation_id, conversation.tenant_id) if steer else None
    after = None if busy is None else feed_position(runtime, busy.id)
    request = StartTurnRequest(
        agent_id=agent_id,
        input=text,
        conversation_id=conversation_id,
        metadata={CHANNEL_METADATA_KEY: channel},
        if_busy="steer" if steer else "reject",
    )
    outcome = service.start_turn(runtime, tenant, request, message_id, None if ids is None else ids.turn_id)
    if isinstance(outcome, service.Steered):
        taken = outcome.turn
        return Started(taken, after if busy is not None and taken.id == busy.id else None)
    assert isinstance(outcome, AgentTurn), "if_busy=reject and steer never queue"
    return Started(outcome, None)


def decide(
    runtime: Runtime, tenant: Tenant, turn: AgentTurn, decision: Decision, channel: str, ids: RequestIds | None = None
) -> Started:
    """Submit a person's decision to the waiting turn; its stream continues after the decision.

    Raises:
        InvalidResumeCommand: The decision does not fit the turn (409), or the form data
            fails the frozen schema (422, with a detail per field).
    """
    after = feed_position(runtime, turn.id)
    try:
        request = ResumeRequest.model_validate(
            {
                "action": decision.kind,
                "tool_call_id": None if decision.kind == "input" else decision.call_id,
                "content": decision.content,
                "data": decision.data,
                "reason": decision.reason,
                "metadata": {CHANNEL_METADATA_KEY: channel},
            }
        )
    except ValidationError as exc:
        # Only a call id the model made up outside the API's id alphabet gets here.
        raise InvalidRequestError(f"the decision cannot be expressed: {exc.errors()[0]['msg']}", path="/") from None
    turn = service.resume_turn(runtime, tenant, turn.id, request, None if ids is None else ids.marks)
    return Started(turn, after)


def stop(runtime: Runtime, tenant: Tenant, agent_id: str, conversation_id: str, reason: str) -> AgentTurn | None:
    """Cancel the conversation's active turn (with close-out); None when nothing is active."""
    turn = active_turn(runtime, tenant, agent_id, conversation_id)
    if turn is None:
        return None
    return service.cancel_turn(runtime, tenant, turn.id, CancelRequest(reason=reason))


def feed_position(runtime: Runtime, turn_id: str) -> FeedPosition:
    """The position after every event of the turn tree readable now (where a continuation starts)."""
    reader = FeedReader(runtime.events, EventScope.tree(turn_id))
    for _ in reader.pages():
        pass
    return reader.position


@dataclass(frozen=True)
class Primed:
    """Where a client joining a turn starts, and how the stream ends already if it does."""

    after: FeedPosition
    """The position after every event read."""
    ending: list[Step]
    """The steps of the last event read when they end the stream (the turn ended, or waits for a person
    now): the client is shown them at once, as nothing more may come."""


_ENDING_STEPS = (ApprovalRequested, FormRequested, QuestionAsked, TurnFinished, TurnFailed)
"""What a client joining a turn that waits or has ended is shown of the last event (not the close of a text it never saw)."""


def prime(runtime: Runtime, translator: TurnTranslator) -> Primed:
    """Feed the translator every event of its turn readable now, discarding their steps but the ending ones.

    For a client that joins a turn in the middle and is shown what happened so far in
    another way (a snapshot of the messages): `TurnTranslator.reopen` then gives it the
    text streaming now.
    """
    reader = FeedReader(runtime.events, EventScope.tree(translator.root_turn_id))
    last: tuple[AgentEvent, list[Step]] | None = None
    for page in reader.pages():
        for event in page.events:
            steps = translator.translate(event)
            if steps:
                last = (event, steps)
    position = reader.position
    ending: list[Step] = []
    if last is not None and any(ends_stream(step) for step in last[1]):
        event, steps = last
        waits = any(isinstance(step, TurnFinished) and step.waiting for step in steps)
        if not waits or _still_waits(runtime, event):
            ending = [step for step in steps if isinstance(step, _ENDING_STEPS)]
    return Primed(position, ending)


@dataclass(frozen=True)
class RequestIds:
    """Ids derived from a request's `Idempotency-Key`, so that a retry and its first attempt converge on one effect."""

    key: str | None
    turn_id: str | None = None
    """The id of the turn a keyed start creates (None without a key)."""
    marks: dict[str, str] = field(default_factory=dict)
    """Resume metadata naming the keyed request (`RESUME_MARK`), kept by the TURN_RESUMED event."""

    @classmethod
    def of(cls, tenant: Tenant, key: str | None) -> RequestIds:
        """The ids of a request with this key (none without one)."""
        if key is None:
            return cls(None)
        mark = request_id(tenant, key)
        return cls(key, turn_id_of(key, mark), {RESUME_MARK: mark})


async def act_once(
    runtime: Runtime,
    tenant: Tenant,
    conversation_id: str,
    idempotency_key: str | None,
    fingerprint: str,
    act: Callable[[RequestIds], Started],
) -> Started | JSONResponse:
    """Run `act` once per idempotency key, as the `/v1` POSTs do; a retry streams the same turn from the same place.

    A retry whose first answer was not recorded finds what the first attempt did from what
    it saved (the keyed turn it started, or the keyed decision in the conversation's
    latest turn), see `workers.api.idempotency_header`. Returns the `Started` to stream, or the
    error answer given for the key (a retry of a request that failed gets the same failure).
    """
    ids = RequestIds.of(tenant, idempotency_key)

    def recorded() -> Answer:
        return 200, act(ids).to_json()

    def find_earlier() -> Answer | None:
        started = _earlier(runtime, tenant, conversation_id, ids)
        return None if started is None else (200, started.to_json())

    answer: JSONResponse = await run_in_threadpool(
        run_once, runtime, tenant, idempotency_key, fingerprint, recorded, find_earlier
    )
    if answer.status_code != 200:
        return answer
    return await run_in_threadpool(_started_of, runtime, tenant, json.loads(bytes(answer.body)))


def _started_of(runtime: Runtime, tenant: Tenant, recorded: dict[str, Any]) -> Started:
    turn = tenant.check(runtime.turn_store.load(str(recorded["turn_id"])))
    after = recorded.get("after")
    return Started(turn, None if after is None else FeedPosition.parse(str(after)))


def _earlier(runtime: Runtime, tenant: Tenant, conversation_id: str, ids: RequestIds) -> Started | None:
    """What an earlier attempt of a keyed request did, told from what it saved; None when it saved nothing."""
    if ids.turn_id is not None:
        try:
            return Started(tenant.check(runtime.turn_store.load(ids.turn_id)), None)
        except TurnNotFound:
            pass
    mark = ids.marks.get(RESUME_MARK)
    if mark is None:
        return None
    conversation = tenant.reaches(conversation_id)
    for turn in runtime.turn_store.list_turns(
        conversation_id=conversation.conversation_id, tenant_id=conversation.tenant_id, limit=1
    ):
        if tenant.owns(turn) and runtime.idempotency.is_resume_applied(turn, mark):
            return Started(turn, _before_resume(runtime, turn.id, mark))
    return None


def _before_resume(runtime: Runtime, turn_id: str, mark: str) -> FeedPosition | None:
    """The feed position just before the TURN_RESUMED event of the keyed decision `mark` (where its stream began)."""
    previous: str | None = None
    for page in FeedReader(runtime.events, EventScope.tree(turn_id)).pages():
        for event in page.events:
            metadata = event.data.get("metadata")
            if event.type is AgentEventType.TURN_RESUMED and isinstance(metadata, dict):
                if metadata.get(RESUME_MARK) == mark:
                    return FeedPosition() if previous is None else FeedPosition.parse(previous)
            previous = event.cursor
    # The decision's TURN_RESUMED is committed with it, so this is a fallback only: stream from the start.
    return None


def turn_content(runtime: Runtime, turn: AgentTurn) -> TurnContent:
    """Reads the tree's messages for a translator, with the agent's sensitive arguments masked."""
    return TurnContent(runtime.turn_store.load, agent_mask(find_agent(runtime.agent_loader, turn)))


async def stream_steps(
    runtime: Runtime, translator: TurnTranslator, after: FeedPosition | None, *, quiet_after: float
) -> AsyncIterator[list[tuple[Step, str | None]]]:
    """The turn's steps with the cursor of the event behind each, until the turn ends or waits for a person.

    A batch is empty when nothing happened for `quiet_after` seconds (time for a keep-alive).
    """
    async for events in follow_tree(runtime, translator.root_turn_id, after, quiet_after=quiet_after):
        if not events:
            yield []
            continue
        # One thread hop per batch: a burst of deltas needs no store, a response or a result may.
        batch, ended = await run_in_threadpool(_translate, runtime, translator, events)
        yield batch
        if ended:
            return


def _translate(
    runtime: Runtime, translator: TurnTranslator, events: list[AgentEvent]
) -> tuple[list[tuple[Step, str | None]], bool]:
    """The steps of a batch of events, each with its event's cursor, up to the first that ends the stream."""
    batch: list[tuple[Step, str | None]] = []
    for event in events:
        steps = translator.translate(event)
        if any(isinstance(step, TurnFinished) and step.waiting for step in steps) and not _still_waits(runtime, event):
            # A replay going past a wait that has since been answered: the turn went on.
            steps = [s for s in steps if not (isinstance(s, TurnFinished) and s.waiting)]
        batch.extend((step, event.cursor) for step in steps)
        if any(ends_stream(step) for step in steps):
            return batch, True
    return batch, False


def _still_waits(runtime: Runtime, suspended: AgentEvent) -> bool:
    """Whether the turn still waits for what the TURN_SUSPENDED event `suspended` asked."""
    turn = runtime.turn_store.load(suspended.turn_id)
    if turn.suspension is None or turn.status.value != suspended.data.get("status"):
        return False
    return turn.suspension.correlation_id == suspended.data.get("correlation_id")

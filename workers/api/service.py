"""What the routes do, without HTTP: start (with `if_busy`), resume, cancel, list and read turns for a tenant.

Each function checks the tenant first: another tenant's turn is reported exactly like an
unknown one (`TurnNotFound`) and nothing is changed.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agent_runner import (
    AgentConversationBusyException,
    AgentTurn,
    AgentTurnStatus,
    AnyMessage,
    TurnNotFound,
    UserMessage,
    VersionConflictError,
)
from agent_runner.limits import check_start_delay
from agent_runner.machine import DECIDER_METADATA_KEYS
from agent_runner.persistence import ConversationKey
from workers.api.bodies import CancelRequest, ResumeRequest, StartTurnRequest, resume_fields
from workers.api.errors import ApiError, InvalidRequestError, TurnEndedError
from workers.api.runtime import Runtime
from workers.api.tenancy import Tenant
from workers.live import announce
from workers.views import ResumeAction, resume_command

INTERRUPT_REASON = "interrupted by a newer message"
_INTERRUPT_ATTEMPTS = 3
_INTERRUPT_POLL_S = 0.05


class ConversationBusyError(ApiError):
    """The conversation has an active turn (409), told with the conversation id the tenant knows."""

    def __init__(self, conversation_id: str, busy: AgentConversationBusyException) -> None:
        super().__init__(
            409,
            f"conversation {conversation_id!r} already has the active turn {busy.active_turn_id!r} "
            f"in status {str(busy.status)!r}; resume it, cancel it, or send if_busy=enqueue or interrupt",
            type_name=type(busy).__name__,
            active_turn_id=busy.active_turn_id,
            active_turn_status=str(busy.status),
        )


@dataclass(frozen=True)
class Steered:
    """A message given to the conversation's active turn (`if_busy=steer`): `turn` reads it before its next model call."""

    turn: AgentTurn


@dataclass(frozen=True)
class Queued:
    """A message queued in the conversation's inbox instead of starting a turn now."""

    message_id: str
    conversation_id: str


def start_turn(
    runtime: Runtime, tenant: Tenant, request: StartTurnRequest, message_id: str, turn_id: str | None = None
) -> AgentTurn | Queued | Steered:
    """Start a turn, or handle a busy conversation as `request.if_busy` says.

    With `if_busy=enqueue` a message also queues while earlier queued messages of the
    conversation wait to start, so the conversation's messages start in the order accepted.
    With `if_busy=steer` the message joins the active turn (`AgentRunner.steer`); the
    request's agent and metadata only matter when no turn is active and one starts.

    Args:
        runtime: The server's backends.
        tenant: Who asks; owns the turn and the conversation.
        request: The validated request.
        message_id: Id of the user message (and of the inbox message, if it is queued).
        turn_id: Id of the new turn (default: a random one). When a turn with this id is
            stored already, that turn is the answer: the start happened before.

    Raises:
        AgentNotFound: No such agent (nothing is saved).
        AgentConversationBusyException: The conversation is busy and `if_busy` is `reject`.
        ConversationNotFoundError: The request's token is limited to another conversation.
    """
    not_before = start_time(runtime, request.start_after_seconds, "start_after_seconds")
    runtime.agent_loader.load(request.agent_id)
    if request.conversation_id is None and tenant.conversation is not None:
        # A token limited to one conversation starts its turns there (a turn outside it would be out of its reach).
        request = request.model_copy(update={"conversation_id": tenant.conversation})
    conversation = None if request.conversation_id is None else tenant.reaches(request.conversation_id)
    if conversation is not None and request.if_busy == "enqueue" and runtime.inbox.has_waiting(conversation):
        # Earlier messages are still queued (their turn has not started yet, although the
        # conversation may be free for a moment): starting this one now would overtake them.
        started = _started_before(runtime, tenant, turn_id)
        return started if started is not None else _enqueue(runtime, tenant, request, conversation, message_id)
    for _ in range(_INTERRUPT_ATTEMPTS):
        try:
            return runtime.runner.start(
                request.agent_id,
                UserMessage(id=message_id, content=request.input),
                conversation_id=None if conversation is None else conversation.conversation_id,
                tenant_id=tenant.id,
                metadata=request.metadata,
                turn_id=turn_id,
                not_before=not_before,
            )
        except VersionConflictError:
            if turn_id is None:
                raise
            return get_turn(runtime, tenant, turn_id)
        except AgentConversationBusyException as busy:
            assert conversation is not None and request.conversation_id is not None
            if busy.active_turn_id == turn_id:
                return get_turn(runtime, tenant, turn_id)
            if request.if_busy == "reject":
                raise ConversationBusyError(request.conversation_id, busy) from None
            if request.if_busy == "steer":
                return _steer(runtime, request, busy.active_turn_id, message_id)
            if request.if_busy == "enqueue" or not _interrupt(runtime, busy.active_turn_id):
                return _enqueue(runtime, tenant, request, conversation, message_id)
    # Each interrupted turn was followed at once by another (queued messages starting):
    # rather than cancel turns in a loop, this message waits its turn.
    assert conversation is not None
    return _enqueue(runtime, tenant, request, conversation, message_id)


def _steer(runtime: Runtime, request: StartTurnRequest, turn_id: str, message_id: str) -> Steered:
    if request.start_after_seconds:
        raise InvalidRequestError(
            "a message for the conversation's active turn cannot be delayed; send it without start_after_seconds",
            path="/start_after_seconds",
        )
    # The active turn is of the conversation the tenant reached, so it is the tenant's. It
    # may end before the message is read: then the conversation's next turn takes it.
    return Steered(runtime.runner.steer(turn_id, request.input, message_id=message_id))


def _started_before(runtime: Runtime, tenant: Tenant, turn_id: str | None) -> AgentTurn | None:
    """The turn a keyed start with `turn_id` made already (a retry whose first answer was lost), or None."""
    if turn_id is None:
        return None
    try:
        return get_turn(runtime, tenant, turn_id)
    except TurnNotFound:
        return None


def _interrupt(runtime: Runtime, turn_id: str) -> bool:
    """Cancel the active turn (with close-out); whether it ended within the interrupt wait.

    A waiting or READY turn ends at once. One a worker is stepping only gets its cancel
    flag, and ends at its next boundary: wait for that, up to the configured bound.
    """
    turn = runtime.runner.cancel(turn_id, INTERRUPT_REASON)
    if turn.is_terminal:
        return True
    deadline = time.monotonic() + runtime.settings.interrupt_wait_s
    while time.monotonic() < deadline:
        time.sleep(_INTERRUPT_POLL_S)
        if runtime.turn_store.get_ref(turn_id).status.is_terminal:
            return True
    return False


def start_time(runtime: Runtime, delay_s: float | None, field: str) -> datetime | None:
    """When a turn asked to start `delay_s` seconds from now may start; None for no delay.

    Raises:
        InputLimitError: `delay_s` is not a finite number from 0 to the runner's `max_start_delay_s`.
    """
    if delay_s is None:
        return None
    delay = check_start_delay(delay_s, field, runtime.runner.policy.limits)
    return runtime.runner.clock() + timedelta(seconds=delay) if delay else None


def _enqueue(
    runtime: Runtime, tenant: Tenant, request: StartTurnRequest, conversation: ConversationKey, message_id: str
) -> Queued:
    if request.start_after_seconds:
        # The inbox starts a queued message as soon as the conversation frees; it keeps no start time.
        raise InvalidRequestError(
            "a delayed start cannot be queued behind the conversation's active turn; retry once it has ended",
            path="/start_after_seconds",
        )
    message = runtime.inbox.enqueue(
        conversation.conversation_id,
        message_id,
        request.input,
        agent_id=request.agent_id,
        tenant_id=conversation.tenant_id,
        metadata=request.metadata,
    )
    # Stored with the message; announced like a save's events, to wake the conversation's followers.
    announce(runtime.runner, message.queued_event)
    # The active turn may have ended between the busy answer and the enqueue; its end's
    # request for the next message then found nothing queued. Ask once more.
    runtime.wake_inbox(conversation)
    assert request.conversation_id is not None
    return Queued(message_id, request.conversation_id)


def get_turn(runtime: Runtime, tenant: Tenant, turn_id: str) -> AgentTurn:
    """The tenant's turn.

    Raises:
        TurnNotFound: No such turn, another tenant's, or one outside the request token's conversation.
    """
    turn = runtime.turn_store.load(turn_id)
    if tenant.conversation is not None and turn.conversation_id is None and turn.root_turn_id != turn.id:
        return tenant.check(turn, root=runtime.turn_store.load(turn.root_turn_id))
    return tenant.check(turn)


def decision_metadata(tenant: Tenant, channel: str, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata a decision is recorded with: the request's, marked with its channel.

    A request made with a token records the token's user as `decided_by`, whatever the
    request's metadata says (every route family that takes a decision goes through here).
    """
    marked = {"channel": channel, **metadata}
    if tenant.user is None:
        return marked
    decided = {key: value for key, value in marked.items() if key not in DECIDER_METADATA_KEYS}
    decided["decided_by"] = tenant.user
    return decided


def resume_turn(
    runtime: Runtime, tenant: Tenant, turn_id: str, request: ResumeRequest, marks: dict[str, str] | None = None
) -> AgentTurn:
    """Validate and save a decision; the turn is left RUNNING for a worker to continue.

    `marks` join the command's metadata (after the request's own), which the turn's
    TURN_RESUMED event keeps.

    Raises:
        TurnNotFound: No such turn, or another tenant's.
        ResumeRequestError: The request lacks what its action needs (422).
        InvalidResumeCommand: The decision does not fit the turn (409), or the form data
            fails the frozen schema (422); nothing changed.
    """
    get_turn(runtime, tenant, turn_id)
    metadata = decision_metadata(tenant, "http", request.root.metadata)
    command = resume_command(
        ResumeAction(request.root.action),
        metadata={**metadata, **(marks or {})},
        **resume_fields(request),
    )
    return runtime.runner.submit_resume(turn_id, command)


def cancel_turn(runtime: Runtime, tenant: Tenant, turn_id: str, request: CancelRequest) -> AgentTurn:
    """Cancel the turn and its children (a turn mid-step ends at its next boundary).

    Raises:
        TurnNotFound: No such turn, or another tenant's.
        TurnEndedError: The turn has already ended (409).
    """
    turn = get_turn(runtime, tenant, turn_id)
    if turn.is_terminal:
        raise TurnEndedError(turn.id, turn.status.value)
    cancelled = runtime.runner.cancel(turn_id, request.reason)
    if cancelled.is_terminal and cancelled.status is not AgentTurnStatus.CANCELLED:
        raise TurnEndedError(cancelled.id, cancelled.status.value)  # it ended on its own meanwhile
    return cancelled


# --- Listings ---------------------------------------------------------------------------------


def encode_cursor(turn: AgentTurn) -> str:
    """The opaque cursor of the page after `turn`."""
    raw = json.dumps([turn.created_at.isoformat(), turn.id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The `(created_at, id)` position of a cursor from `encode_cursor`.

    Raises:
        InvalidRequestError: The cursor was not made by this server.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, turn_id = json.loads(raw)
        position = (datetime.fromisoformat(created), str(turn_id))
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise InvalidRequestError("cursor is not a cursor from a previous page", path="/cursor") from None
    if position[0].tzinfo is None:
        raise InvalidRequestError("cursor is not a cursor from a previous page", path="/cursor")
    return position


def list_turns(
    runtime: Runtime,
    tenant: Tenant,
    *,
    conversation_id: str | None,
    statuses: list[AgentTurnStatus] | None,
    agent_id: str | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[AgentTurn], str | None]:
    """A page of the tenant's turns, newest first, and the cursor of the next page (None: last page)."""
    before = None if cursor is None else decode_cursor(cursor)
    # A token limited to one conversation lists that one (another one is none of its turns).
    conversation = (
        tenant.conversation if conversation_id is None else tenant.conversation_key(conversation_id).conversation_id
    )
    page = runtime.turn_store.list_page(
        tenant_id=tenant.id,
        statuses=statuses,
        conversation_id=conversation,
        agent_id=agent_id,
        before=before,
        limit=limit + 1,
    )
    more = len(page) > limit
    page = page[:limit]
    return [t for t in page if tenant.owns(t)], (encode_cursor(page[-1]) if more else None)


def conversation_messages(
    runtime: Runtime, tenant: Tenant, conversation_id: str, *, limit: int, before: str | None
) -> list[AnyMessage]:
    """The newest `limit` messages of the tenant's conversation (before message `before`), oldest first.

    Raises:
        InvalidRequestError: `before` is not a message of the conversation.
        ConversationNotFoundError: The request's token is limited to another conversation.
    """
    memory = runtime.memories.of(tenant.reaches(conversation_id))
    if before is None:
        return memory.get_messages(limit)
    found = memory.get_messages_before(before, limit)
    if found is None:
        raise InvalidRequestError(f"message {before!r} is not in conversation {conversation_id!r}", path="/before")
    return found


def agent_catalog(runtime: Runtime) -> list[dict[str, Any]]:
    """The agents the server's loader can list, with their tools and forms."""
    lister = getattr(runtime.agent_loader, "agents", None)
    if not callable(lister):
        return []
    items: list[dict[str, Any]] = []
    for agent in lister():
        tools = []
        for spec in agent.tool_specs():
            tool = agent.tool(spec.name)
            tools.append(
                {
                    "name": spec.name,
                    "description": spec.description,
                    "requires_approval": bool(tool is not None and tool.requires_approval),
                }
            )
        user_input = agent.user_input_tool
        forms = [] if user_input is None else [form.to_dict() for form in user_input.forms]
        items.append({"id": agent.id, "version": agent.version, "tools": tools, "forms": forms})
    return items

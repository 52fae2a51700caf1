"""A message the HTTP API accepts with `if_busy=enqueue` never overtakes the conversation's queued messages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_runner import Agent, AgentEventType, AgentTurn, AiMessage, InMemoryAgentLoader, ScriptedChatModel
from agent_runner.persistence import EventScope
from store import InboxStatus
from workers.api.bodies import StartTurnRequest
from workers.api.runtime import Runtime, build_runtime
from workers.api.server_settings import ApiSettings, WorkerMode
from workers.api.service import Queued, start_turn
from workers.api.tenancy import Tenant
from workers.settings import WorkerSettings


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    """The server's backends on SQLite, with none of its threads running (nothing starts queued messages)."""
    settings = ApiSettings(
        workers=WorkerSettings(database_url=f"sqlite:///{tmp_path / 'order.db'}"), worker_mode=WorkerMode.NONE
    )
    agent = Agent(id="desk", chat_model=ScriptedChatModel([AiMessage(content="ok")] * 4))
    built = build_runtime(settings, InMemoryAgentLoader([agent]))
    try:
        yield built
    finally:
        built.stop()


def _request(text: str, if_busy: str = "enqueue") -> StartTurnRequest:
    return StartTurnRequest.model_validate(
        {"agent_id": "desk", "input": text, "conversation_id": "c-1", "if_busy": if_busy}
    )


def test_an_enqueued_message_queues_behind_waiting_messages_of_a_free_conversation(runtime: Runtime) -> None:
    # Given a tenant's conversation with no active turn and a message still waiting in its
    # inbox (its turn ended a moment ago; the next message has not been started yet)
    tenant = Tenant("tenant-a")
    conversation = tenant.conversation_key("c-1")
    runtime.inbox.enqueue("c-1", "m-1", "first", agent_id="desk", tenant_id=tenant.id)
    assert runtime.turn_store.find_active_turn("c-1", tenant.id) is None

    # When a second message arrives with if_busy=enqueue
    outcome = start_turn(runtime, tenant, _request("second"), "m-2")

    # Then it queues behind the first instead of starting ahead of it
    assert outcome == Queued("m-2", "c-1")
    queued = [runtime.inbox.get(m) for m in ("m-1", "m-2")]
    assert [(m.status, m.conversation) for m in queued if m is not None] == [(InboxStatus.PENDING, conversation)] * 2
    assert queued[0] is not None and queued[1] is not None and queued[0].sequence < queued[1].sequence
    assert runtime.turn_store.list_turns(conversation_id="c-1") == []


def test_an_enqueued_message_starts_at_once_when_nothing_waits(runtime: Runtime) -> None:
    # Given a free conversation whose earlier queued message has started its turn already
    tenant = Tenant("tenant-a")
    runtime.inbox.enqueue("c-1", "m-1", "first", agent_id="desk", tenant_id=tenant.id)
    claimed = runtime.inbox.claim_next(tenant.conversation_key("c-1"))
    assert claimed is not None and runtime.inbox.mark_completed("m-1", "t-earlier")
    # When a message arrives with if_busy=enqueue, and another of another tenant's same conversation id
    started = start_turn(runtime, tenant, _request("second"), "m-2")
    other = start_turn(runtime, Tenant("tenant-b"), _request("hello"), "m-3")
    # Then both start their turns at once, each in its own tenant's conversation
    assert isinstance(started, AgentTurn) and (started.tenant_id, started.conversation_id) == ("tenant-a", "c-1")
    assert isinstance(other, AgentTurn) and (other.tenant_id, other.conversation_id) == ("tenant-b", "c-1")


def test_a_keyed_start_repeated_while_messages_wait_answers_with_the_turn_it_started(runtime: Runtime) -> None:
    # Given a keyed start that started its turn (its answer was lost), then messages queued behind it
    tenant = Tenant("tenant-a")
    first = start_turn(runtime, tenant, _request("first"), "m-1", turn_id="t-keyed")
    assert isinstance(first, AgentTurn)
    assert start_turn(runtime, tenant, _request("second"), "m-2") == Queued("m-2", "c-1")
    # When the keyed start is repeated
    again = start_turn(runtime, tenant, _request("first"), "m-1", turn_id="t-keyed")
    # Then it answers with the turn it started, and queues nothing
    assert isinstance(again, AgentTurn) and again.id == "t-keyed"
    assert runtime.inbox.get("m-1") is None


def test_a_queued_message_is_announced_on_the_live_channel_of_its_conversation_only(runtime: Runtime) -> None:
    # Given a tenant's conversation with a message waiting in its inbox
    tenant = Tenant("tenant-a")
    scope = EventScope.conversation("c-1", tenant.id)
    runtime.inbox.enqueue("c-1", "m-1", "first", agent_id="desk", tenant_id=tenant.id)
    live = runtime.events.live
    assert live is not None

    # When a message is queued through the API, then again with the same id
    assert start_turn(runtime, tenant, _request("second"), "m-2") == Queued("m-2", "c-1")
    assert start_turn(runtime, tenant, _request("second"), "m-2") == Queued("m-2", "c-1")

    # Then its stored MESSAGE_QUEUED was announced once, to the tenant's conversation (a wake-up for followers)
    [stored_event] = [e for e in runtime.turn_store.read_events(scope) if e.data["message_id"] == "m-2"]
    announced = live.read(scope)
    assert [(e.event_id, e.type) for e in announced] == [(stored_event.event_id, AgentEventType.MESSAGE_QUEUED)]
    assert live.read(EventScope.conversation("c-1", "tenant-b")) == []
    assert live.read(EventScope.conversation("c-1")) == []

"""A busy conversation: reject (409), enqueue (202, started when it frees) and interrupt, on the embedded server."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.api_server import ApiServer
from tests.integration.api.api_server import (
    assert_error,
    blocked,
    eventually,
    parse_sse,
    read_stream,
    serve,
    status_is,
    wait_for,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(server_dir: Path) -> Iterator[ApiServer]:
    # A short interrupt wait, so that a turn stuck in a long tool call makes the interrupt queue.
    yield from serve(server_dir, AGENT_RUNNER_API_INTERRUPT_WAIT_S="0.5")


@pytest.fixture
def client(server: ApiServer) -> Iterator[httpx.Client]:
    with server.client() as http:
        yield http


def post(client: httpx.Client, text: str, chat: str, **fields: Any) -> httpx.Response:
    return client.post("/v1/turns", json={"agent_id": "desk", "input": text, "conversation_id": chat, **fields})


def waiting_turn(client: httpx.Client, chat: str) -> dict[str, Any]:
    created = post(client, "ticket", chat)
    assert created.status_code == 201, created.text
    return wait_for(client, created.json()["id"], blocked)


def answered(client: httpx.Client, chat: str, output: str) -> dict[str, Any] | None:
    """The conversation's turn that answered `output`, if any."""
    turns = client.get("/v1/turns", params={"conversation_id": chat}).json()["items"]
    return next((t for t in turns if t["final_output"] == output), None)


def latest_turn(client: httpx.Client, chat: str) -> dict[str, Any]:
    items: list[dict[str, Any]] = client.get("/v1/turns", params={"conversation_id": chat}).json()["items"]
    return items[0]


def test_reject_answers_409_with_the_active_turn(client: httpx.Client) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    active = waiting_turn(client, chat)
    error = assert_error(post(client, "hello?", chat), 409, "AgentConversationBusyException")
    assert error["active_turn_id"] == active["id"] and chat in error["message"]
    assert len(client.get("/v1/turns", params={"conversation_id": chat}).json()["items"]) == 1


def test_enqueue_queues_the_message_and_the_inbox_starts_it_when_the_conversation_frees(client: httpx.Client) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    active = waiting_turn(client, chat)
    queued = post(client, "first queued", chat, if_busy="enqueue", metadata={"from": "queue"})
    assert queued.status_code == 202
    body = queued.json()
    assert body["status"] == "QUEUED" and body["conversation_id"] == chat and body["message_id"]
    second = post(client, "second queued", chat, if_busy="enqueue").json()
    # Nothing starts while the conversation is busy
    assert latest_turn(client, chat)["id"] == active["id"]
    # When the active turn ends (cancelled here), the queued messages start in order
    client.post(f"/v1/turns/{active['id']}/cancel")
    wait_for(client, active["id"], status_is("CANCELLED"))

    def started(text: str) -> dict[str, Any]:
        found: dict[str, Any] = eventually(lambda: answered(client, chat, f"echo: {text}"), what=f"{text!r} to run")
        return found

    first = started("first queued")
    assert first["agent_id"] == "desk" and first["metadata"] == {"from": "queue"} and first["conversation_id"] == chat
    later = started("second queued")
    assert later["created_at"] > first["created_at"]
    # The user message of each queued turn carries its message id
    messages = client.get(f"/v1/turns/{later['id']}", params={"messages": "true"}).json()["messages"]
    assert any(m["id"] == second["message_id"] and m["role"] == "user" for m in messages)


def test_interrupt_cancels_a_waiting_turn_with_close_out_and_starts_the_new_one(client: httpx.Client) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    active = waiting_turn(client, chat)
    response = post(client, "never mind", chat, if_busy="interrupt")
    assert response.status_code == 201, response.text
    new = response.json()
    old = client.get(f"/v1/turns/{active['id']}", params={"messages": "true"}).json()
    assert old["status"] == "CANCELLED" and old["messages"][-1]["role"] == "assistant"
    assert wait_for(client, new["id"], blocked)["final_output"] == "echo: never mind"


def test_interrupt_of_a_turn_mid_step_queues_the_message_when_it_does_not_stop_in_time(client: httpx.Client) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    created = post(client, "sleep 2", chat).json()
    wait_for(client, created["id"], lambda v: v["steps"] >= 1, what="the pause call to start")
    response = post(client, "after the pause", chat, if_busy="interrupt")
    # The worker is inside the 2 s tool call: the turn only got its cancel flag within the 0.5 s wait
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "QUEUED"
    flagged = client.get(f"/v1/turns/{created['id']}").json()
    assert flagged["cancel_requested"] is True
    # It ends at its next boundary, with the interrupt as its reason, and then the queued message starts
    ended = wait_for(client, created["id"], blocked, timeout=15)
    assert (ended["status"], ended["error"]) == ("CANCELLED", "interrupted by a newer message")
    eventually(lambda: answered(client, chat, "echo: after the pause"), what="the queued message to run")


def test_a_cancel_of_a_turn_mid_step_ends_it_with_the_given_reason(client: httpx.Client) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    created = post(client, "sleep 1", chat).json()
    wait_for(client, created["id"], lambda v: v["steps"] >= 1, what="the pause call to start")
    response = client.post(f"/v1/turns/{created['id']}/cancel", json={"reason": "the customer hung up"})
    assert response.status_code == 202 and response.json()["cancel_requested"] is True
    ended = wait_for(client, created["id"], blocked, timeout=15)
    assert (ended["status"], ended["error"]) == ("CANCELLED", "the customer hung up")
    messages = client.get(f"/v1/turns/{created['id']}", params={"messages": "true"}).json()["messages"]
    assert "the customer hung up" in messages[-1]["content"]


def test_a_delayed_start_waits_holding_its_conversation_and_then_runs(client: httpx.Client) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    # Given a turn started 1.5 s from now
    created = post(client, "hello", chat, start_after_seconds=1.5)
    assert created.status_code == 201, created.text
    turn = created.json()
    # Then it is READY with its start time, and the conversation is busy with it
    assert turn["status"] == "READY" and turn["starts_at"] is not None and turn["next_retry_at"] is None
    starts_at = datetime.fromisoformat(turn["starts_at"])
    error = assert_error(post(client, "now", chat), 409, "AgentConversationBusyException")
    assert error["active_turn_id"] == turn["id"]
    # And a delayed message cannot wait in the conversation's queue
    queued = assert_error(post(client, "also later", chat, if_busy="enqueue", start_after_seconds=5), 422)
    assert queued["details"][0]["path"] == "/start_after_seconds"
    # When its time has come, it runs and answers, having started no earlier
    done = wait_for(client, turn["id"], status_is("COMPLETED"))
    assert done["final_output"] == "echo: hello" and done["starts_at"] is None
    assert datetime.fromisoformat(done["updated_at"]) >= starts_at


@pytest.mark.parametrize("delay", [-1, 1e12, "soon", True])
def test_a_bad_start_delay_is_refused_and_nothing_starts(client: httpx.Client, delay: object) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    answer = post(client, "hello", chat, start_after_seconds=delay)
    assert_error(answer, 422)
    assert client.get("/v1/turns", params={"conversation_id": chat}).json()["items"] == []


def test_a_follower_of_the_conversation_sees_the_message_queued_then_its_turn_start(client: httpx.Client) -> None:
    # Given a client following a conversation whose turn waits for a person
    chat = f"c-{uuid.uuid4().hex[:8]}"
    active = waiting_turn(client, chat)
    chunks: list[str] = []
    seen: dict[str, float] = {}
    opened = threading.Event()

    def listen() -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=30) as listener:
            with listener.stream("GET", f"/v1/conversations/{chat}/events") as response:
                for chunk in response.iter_text():
                    chunks.append(chunk)
                    opened.set()
                    text = "".join(chunks)
                    if "event: MESSAGE_QUEUED\n" in text:
                        seen.setdefault("queued", time.monotonic())
                    if "event: TURN_COMPLETED\n" in text:
                        break

    thread = threading.Thread(target=listen)
    thread.start()
    assert opened.wait(20)

    # When a message is queued behind that turn
    queued = post(client, "later please", chat, if_busy="enqueue")
    assert queued.status_code == 202, queued.text
    message_id = queued.json()["message_id"]

    # Then the follower sees it while the first turn still waits
    eventually(lambda: "queued" in seen, what="MESSAGE_QUEUED on the open stream")
    assert client.get(f"/v1/turns/{active['id']}").json()["status"] == "WAITING_FOR_USER"
    # And once that turn ends, the queued message's turn starts under the id the event named
    client.post(f"/v1/turns/{active['id']}/cancel")
    thread.join(30)
    assert not thread.is_alive()
    events = parse_sse("".join(chunks))
    types = [e["event"] for e in events]
    assert types.count("MESSAGE_QUEUED") == 1 and types.count("TURN_STARTED") == 2
    announced = events[types.index("MESSAGE_QUEUED")]
    assert announced["data"]["data"]["message_id"] == message_id
    assert announced["data"]["data"]["content"] == "later please" and announced["data"]["data"]["ahead"] == 0
    assert announced["data"]["conversation_id"] == chat
    started = [e for e in events if e["event"] == "TURN_STARTED"][-1]
    assert types.index("MESSAGE_QUEUED") < types.index("TURN_CANCELLED") < events.index(started)
    assert started["data"]["turn_id"] == announced["data"]["turn_id"]
    assert started["data"]["data"]["queued_message_id"] == message_id
    assert client.get(f"/v1/turns/{started['data']['turn_id']}").json()["final_output"] == "echo: later please"
    # A reconnect with any cursor gets exactly what followed it: the message's event once, or not again
    for index in (types.index("MESSAGE_QUEUED") - 1, types.index("MESSAGE_QUEUED")):
        _, rest = read_stream(
            client,
            f"/v1/conversations/{chat}/events",
            params={"follow": "false"},
            headers={"Last-Event-ID": events[index]["id"]},
            until_end=False,
        )
        expected = [e["data"]["event_id"] for e in events[index + 1 :]]
        assert [e["data"]["event_id"] for e in rest] == expected


def test_steer_gives_the_message_to_the_active_turn_after_its_tool_call(client: httpx.Client) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    created = post(client, "sleep 1.5", chat).json()
    wait_for(client, created["id"], lambda v: v["steps"] >= 1, what="the pause call to start")
    # While the worker is inside the tool call, two messages for the same turn
    first = post(client, "use staging", chat, if_busy="steer", message_id_hint="ignored")
    assert first.status_code == 422  # unknown fields are refused, as everywhere
    steered = post(client, "use staging", chat, if_busy="steer")
    assert steered.status_code == 202, steered.text
    assert steered.json()["id"] == created["id"] and steered.json()["status"] == "RUNNING"
    again = post(client, "and be quick", chat, if_busy="steer")
    assert again.status_code == 202 and again.json()["id"] == created["id"]
    # The model's next call reads both, in order, after the tool's result: it answers the last
    ended = wait_for(client, created["id"], blocked, timeout=15)
    assert (ended["status"], ended["final_output"]) == ("COMPLETED", "echo: and be quick")
    messages = client.get(f"/v1/turns/{created['id']}", params={"messages": "true"}).json()["messages"]
    roles = [(m["role"], m.get("content")) for m in messages]
    assert roles[-4:] == [
        ("tool", "paused"),
        ("user", "use staging"),
        ("user", "and be quick"),
        ("assistant", ended["final_output"]),
    ]
    # A conversation with no active turn: the message starts one, as without steer
    fresh = post(client, "hello", chat, if_busy="steer")
    assert fresh.status_code == 201 and fresh.json()["id"] != created["id"]
    assert wait_for(client, fresh.json()["id"], blocked)["final_output"] == "echo: hello"


def _sse_data(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: ") :]) for line in response.text.splitlines() if line.startswith("data: {")]


def test_the_ai_sdk_and_ag_ui_routes_steer_the_active_turn_when_the_request_asks(client: httpx.Client) -> None:
    # AI SDK: a message while the turn is inside a tool call is refused, unless the body says steer
    chat = f"c-{uuid.uuid4().hex[:8]}"
    created = post(client, "sleep 1.5", chat).json()
    wait_for(client, created["id"], lambda v: v["steps"] >= 1, what="the pause call to start")
    message = {"id": "u-1", "role": "user", "parts": [{"type": "text", "text": "use staging"}]}
    body = {"id": chat, "messages": [message]}
    assert client.post("/v1/agents/desk/ai-sdk/chat", json=body).status_code == 409
    assert_error(client.post("/v1/agents/desk/ai-sdk/chat", json={**body, "ifBusy": "maybe"}), 422)
    steered = client.post("/v1/agents/desk/ai-sdk/chat", json={**body, "ifBusy": "steer"}, timeout=30)
    assert steered.status_code == 200, steered.text
    chunks = _sse_data(steered)
    # The stream is the active turn's, from the moment the message was accepted to its end
    assert chunks[0]["type"] == "start" and chunks[0]["messageMetadata"]["turnId"] == created["id"]
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert text.endswith("echo: use staging") and chunks[-1]["type"] == "finish"
    # AG-UI: the same through forwardedProps
    thread = f"c-{uuid.uuid4().hex[:8]}"
    other = post(client, "sleep 1.5", thread).json()
    wait_for(client, other["id"], lambda v: v["steps"] >= 1, what="the pause call to start")
    run = {
        "threadId": thread,
        "runId": "r-1",
        "messages": [{"id": "u-2", "role": "user", "content": "use production"}],
        "forwardedProps": {"ifBusy": "steer"},
    }
    answered = client.post("/v1/agents/desk/ag-ui", json=run, timeout=30)
    assert answered.status_code == 200, answered.text
    events = _sse_data(answered)
    assert [e["type"] for e in events][0] == "RUN_STARTED" and events[-1]["type"] == "RUN_FINISHED"
    content = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert content.endswith("echo: use production")
    assert client.get(f"/v1/turns/{other['id']}").json()["final_output"] == "echo: use production"

"""Server-sent events of the embedded server: replay, resume with Last-Event-ID or after, live follow, end.

The durable events are written to the server's event log through the turn store's save,
in the transaction of a snapshot save, the way a runner step records them; the server
reads them through its event feed like any others.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_agents import SECRET_TOKEN
from api_server import ApiServer, append_events, assert_error, blocked, parse_sse, read_stream, serve, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def database_url(server_dir: Path) -> str:
    return f"sqlite:///{server_dir / 'events.db'}"


@pytest.fixture(scope="module")
def server(server_dir: Path, database_url: str) -> Iterator[ApiServer]:
    yield from serve(server_dir, database_url)


@pytest.fixture
def client(server: ApiServer) -> Iterator[httpx.Client]:
    with server.client() as http:
        yield http


def waiting_turn(client: httpx.Client, chat: str) -> dict[str, Any]:
    created = client.post("/v1/turns", json={"agent_id": "desk", "input": "ticket", "conversation_id": chat})
    assert created.status_code == 201, created.text
    return wait_for(client, created.json()["id"], blocked)


STEP_EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("TURN_STARTED", {"status": "READY", "agent_id": "desk"}),
    (
        "MODEL_RESPONSE",
        {
            "status": "RUNNING",
            "tool_calls": [
                {
                    "id": "c1",
                    "name": "open_ticket",
                    "arguments": {"system": "db", "scope": "ONE_USER", "api_token": SECRET_TOKEN},
                }
            ],
        },
    ),
    (
        "TOOL_STARTED",
        {
            "status": "RUNNING",
            "tool_call_id": "c1",
            "tool_name": "open_ticket",
            "arguments": {"system": "db", "scope": "ONE_USER", "api_token": SECRET_TOKEN},
        },
    ),
    ("TURN_SUSPENDED", {"status": "WAITING_FOR_APPROVAL", "correlation_id": "c1"}),
]


def test_replay_and_resume_from_any_cursor_give_exactly_the_suffix(client: httpx.Client, database_url: str) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    turn = waiting_turn(client, chat)
    append_events(database_url, turn["id"], *STEP_EVENTS[:2])
    append_events(database_url, turn["id"], *STEP_EVENTS[2:])
    # follow=false replays what is stored and closes (no `end`: the turn has not ended)
    text, stored = read_stream(client, f"/v1/turns/{turn['id']}/events", params={"follow": "false"}, until_end=False)
    assert [e["event"] for e in stored] == [kind for kind, _ in STEP_EVENTS]
    for event in stored:
        assert event["id"] and event["data"]["cursor"] == event["id"] and event["data"]["type"] == event["event"]
        assert event["data"]["turn_id"] == turn["id"] and event["data"]["conversation_id"] == chat
    # Tool-call arguments in event data are masked like everywhere else
    assert SECRET_TOKEN not in text
    assert stored[1]["data"]["data"]["tool_calls"][0]["arguments"]["api_token"] == "***"
    assert stored[2]["data"]["data"]["arguments"] == {"system": "db", "scope": "ONE_USER", "api_token": "***"}
    # From every position, Last-Event-ID or ?after= gives exactly what followed it
    for index in range(len(stored)):
        cursor = stored[index]["id"]
        expected = [e["id"] for e in stored[index + 1 :]]
        _, by_header = read_stream(
            client,
            f"/v1/turns/{turn['id']}/events",
            params={"follow": "false"},
            headers={"Last-Event-ID": cursor},
            until_end=False,
        )
        _, by_query = read_stream(
            client, f"/v1/turns/{turn['id']}/events", params={"follow": "false", "after": cursor}, until_end=False
        )
        assert [e["id"] for e in by_header] == expected == [e["id"] for e in by_query]
    # The header wins over the query: a browser reconnecting sends its newest cursor
    _, both = read_stream(
        client,
        f"/v1/turns/{turn['id']}/events",
        params={"follow": "false", "after": stored[0]["id"]},
        headers={"Last-Event-ID": stored[2]["id"]},
        until_end=False,
    )
    assert [e["id"] for e in both] == [stored[3]["id"]]
    # The conversation's stream holds the same events
    _, conversation = read_stream(
        client, f"/v1/conversations/{chat}/events", params={"follow": "false"}, until_end=False
    )
    assert [e["id"] for e in conversation] == [e["id"] for e in stored]
    # Bad cursors are a 422 before any stream starts; unknown turns a 404
    assert_error(client.get(f"/v1/turns/{turn['id']}/events", params={"after": "not a cursor"}), 422)
    assert_error(client.get(f"/v1/turns/{turn['id']}/events", params={"after": "9:x"}), 422)
    assert_error(client.get(f"/v1/turns/{turn['id']}/events", headers={"Last-Event-ID": "x" * 300}), 422)
    assert_error(client.get("/v1/turns/no-such-turn/events"), 404, "TurnNotFound")


def test_a_live_stream_sends_new_events_then_end_after_the_root_turn_ends(
    client: httpx.Client, database_url: str
) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    turn = waiting_turn(client, chat)
    append_events(database_url, turn["id"], STEP_EVENTS[0])
    received: dict[str, Any] = {}
    opened = threading.Event()

    def listen() -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=30) as listener:
            with listener.stream("GET", f"/v1/turns/{turn['id']}/events") as response:
                chunks = []
                for chunk in response.iter_text():
                    chunks.append(chunk)
                    opened.set()
                    if "event: end\n" in "".join(chunks):
                        break
                received["text"] = "".join(chunks)

    thread = threading.Thread(target=listen)
    thread.start()
    assert opened.wait(20)
    # While the stream is open, the turn moves on and ends
    append_events(database_url, turn["id"], *STEP_EVENTS[1:])
    cancelled = client.post(f"/v1/turns/{turn['id']}/cancel", json={"reason": "done watching"})
    assert cancelled.json()["status"] == "CANCELLED"
    append_events(database_url, turn["id"], ("TURN_CANCELLED", {"status": "CANCELLED", "error": "done watching"}))
    thread.join(30)
    assert not thread.is_alive()
    text = received["text"]
    assert text.startswith(":")  # a comment first, so a client sees the stream open at once
    events = parse_sse(text)
    assert [e["event"] for e in events] == [kind for kind, _ in STEP_EVENTS] + ["TURN_CANCELLED", "end"]
    assert events[-1]["data"] == {"turn_id": turn["id"], "status": "CANCELLED"}
    # A client that reconnects after the end gets `end` at once
    _, after_end = read_stream(client, f"/v1/turns/{turn['id']}/events", headers={"Last-Event-ID": events[-2]["id"]})
    assert [e["event"] for e in after_end] == ["end"]
    _, replay = read_stream(client, f"/v1/turns/{turn['id']}/events", params={"follow": "false"}, until_end=False)
    assert [e["event"] for e in replay][-2:] == ["TURN_CANCELLED", "end"]

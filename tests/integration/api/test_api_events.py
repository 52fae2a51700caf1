"""Server-sent events of the embedded server: replay, resume with Last-Event-ID or after, live follow, end."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers.api_server import ApiServer
from tests.integration.api.api_agents import SECRET_TOKEN
from tests.integration.api.api_server import assert_error, blocked, ended, parse_sse, read_stream, wait_for
from workers.api.event_streams import KEEPALIVE_S

pytestmark = pytest.mark.integration


@pytest.fixture
def client(server: ApiServer) -> Iterator[httpx.Client]:
    with server.client() as http:
        yield http


def start(client: httpx.Client, text: str, chat: str | None = None) -> str:
    response = client.post("/v1/turns", json={"agent_id": "desk", "input": text, "conversation_id": chat})
    assert response.status_code == 201, response.text
    turn_id: str = response.json()["id"]
    return turn_id


def answer_form(client: httpx.Client, turn_id: str, call: str) -> None:
    form = {"action": "form", "tool_call_id": call, "data": {"system": "mail", "scope": "ONE_USER"}}
    assert client.post(f"/v1/turns/{turn_id}/resume", json=form).status_code == 202


def finished_ticket(client: httpx.Client, chat: str) -> str:
    """A turn that went through its form and approval to the end."""
    turn_id = start(client, "ticket", chat)
    answer_form(client, turn_id, wait_for(client, turn_id, blocked)["suspension"]["correlation_id"])
    approval = wait_for(client, turn_id, lambda v: v["status"] == "WAITING_FOR_APPROVAL")
    approve = {"action": "approve", "tool_call_id": approval["suspension"]["correlation_id"]}
    assert client.post(f"/v1/turns/{turn_id}/resume", json=approve).status_code == 202
    wait_for(client, turn_id, ended)
    return turn_id


def ids(events: list[dict[str, Any]]) -> list[str]:
    return [e["id"] for e in events if e["event"] != "end"]


def event_ids(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["event_id"] for e in events if e["event"] != "end"]


def test_replay_then_resume_from_any_cursor_gives_exactly_the_suffix(client: httpx.Client) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    turn_id = finished_ticket(client, chat)
    # follow=false replays what is stored, then `end` since the turn has ended, and closes
    text, events = read_stream(client, f"/v1/turns/{turn_id}/events", params={"follow": "false"}, until_end=False)
    assert events[-1]["event"] == "end" and events[-1]["data"] == {"turn_id": turn_id, "status": "COMPLETED"}
    stored = events[:-1]
    types = [e["event"] for e in stored]
    assert types[0] == "TURN_STARTED" and types[-1] == "TURN_COMPLETED"
    assert {"TURN_SUSPENDED", "TURN_RESUMED", "MODEL_RESPONSE", "TOOL_STARTED", "TOOL_COMPLETED"} <= set(types)
    for event in stored:
        assert event["id"] and event["data"]["cursor"] == event["id"] and event["data"]["type"] == event["event"]
        assert event["data"]["turn_id"] == turn_id and event["data"]["conversation_id"] == chat
    assert len(set(ids(stored))) == len(stored) == len({e["data"]["event_id"] for e in stored})
    assert SECRET_TOKEN not in text
    # From every position, Last-Event-ID (or ?after=) gives exactly what followed it, then `end`
    for index in range(len(stored)):
        cursor = stored[index]["id"]
        _, by_header = read_stream(client, f"/v1/turns/{turn_id}/events", headers={"Last-Event-ID": cursor})
        _, by_query = read_stream(client, f"/v1/turns/{turn_id}/events", params={"after": cursor})
        expected = ids(stored[index + 1 :])
        assert ids(by_header) == expected == ids(by_query)
        assert by_header[-1]["event"] == by_query[-1]["event"] == "end"
    # The header wins over the query: a browser reconnecting sends its newest cursor
    _, both = read_stream(
        client,
        f"/v1/turns/{turn_id}/events",
        params={"after": stored[0]["id"]},
        headers={"Last-Event-ID": stored[-2]["id"]},
    )
    assert ids(both) == [stored[-1]["id"]]
    # `Last-Event-ID: -1` (what the LangGraph SDKs send when a page rejoins) means from the start
    for path in (f"/v1/turns/{turn_id}/events", f"/v1/conversations/{chat}/events"):
        _, from_start = read_stream(
            client, path, params={"follow": "false"}, headers={"Last-Event-ID": "-1"}, until_end=False
        )
        assert ids([e for e in from_start if e["event"] != "end"]) == ids(stored)
    # The conversation's stream holds the same events (and no `end`: conversations go on)
    _, conversation = read_stream(
        client, f"/v1/conversations/{chat}/events", params={"follow": "false"}, until_end=False
    )
    assert [e["id"] for e in conversation] == ids(stored)
    # Bad cursors are a 422 before any stream starts; unknown turns a 404
    assert_error(client.get(f"/v1/turns/{turn_id}/events", params={"after": "not a cursor"}), 422)
    assert_error(client.get(f"/v1/turns/{turn_id}/events", params={"after": "9:x"}), 422)
    assert_error(client.get(f"/v1/turns/{turn_id}/events", headers={"Last-Event-ID": "x" * 300}), 422)
    assert_error(client.get("/v1/turns/no-such-turn/events"), 404, "TurnNotFound")


def test_a_live_stream_follows_the_turn_and_ends_after_it(client: httpx.Client) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    turn_id = start(client, "ticket", chat)
    waiting = wait_for(client, turn_id, blocked)
    received: dict[str, Any] = {}
    opened = threading.Event()

    def listen() -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=30) as listener:
            with listener.stream("GET", f"/v1/turns/{turn_id}/events") as response:
                chunks: list[str] = []
                for chunk in response.iter_text():
                    chunks.append(chunk)
                    opened.set()
                    if "event: end\n" in "".join(chunks):
                        break
                received["text"] = "".join(chunks)

    thread = threading.Thread(target=listen)
    thread.start()
    assert opened.wait(20)
    # While the stream is open, a person answers; the stream shows it happen and ends with the turn
    answer_form(client, turn_id, waiting["suspension"]["correlation_id"])
    approval = wait_for(client, turn_id, lambda v: v["status"] == "WAITING_FOR_APPROVAL")
    reject = {"action": "reject", "tool_call_id": approval["suspension"]["correlation_id"], "reason": "no"}
    assert client.post(f"/v1/turns/{turn_id}/resume", json=reject).status_code == 202
    thread.join(30)
    assert not thread.is_alive()
    text = received["text"]
    assert text.startswith(":")  # a comment first, so a client sees the stream open at once
    events = parse_sse(text)
    types = [e["event"] for e in events]
    assert types[-2:] == ["TURN_COMPLETED", "end"] and types[0] == "TURN_STARTED"
    assert types.count("TURN_RESUMED") == 2 and types.count("TURN_SUSPENDED") == 2
    # What the live stream sent is exactly what is stored (cursors differ: they carry live positions)
    _, replay = read_stream(client, f"/v1/turns/{turn_id}/events", params={"follow": "false"}, until_end=False)
    assert event_ids(events) == event_ids(replay)


def test_a_delegating_turn_streams_its_childs_events_too(client: httpx.Client) -> None:
    parent = start(client, "delegate tally")
    _, events = read_stream(client, f"/v1/turns/{parent}/events")
    turns = {e["data"]["turn_id"] for e in events if e["event"] != "end"}
    assert parent in turns and len(turns) == 2
    assert events[-1] == {"event": "end", "data": {"turn_id": parent, "status": "COMPLETED"}}
    # A child's id streams its whole tree
    child = next(t for t in turns if t != parent)
    _, from_child = read_stream(client, f"/v1/turns/{child}/events", params={"follow": "false"}, until_end=False)
    assert event_ids(from_child) == event_ids(events)


def test_many_streams_of_one_conversation_get_the_same_events_and_each_cursor_resumes(client: httpx.Client) -> None:
    # Given a dozen clients following one conversation (they share one follower in the server)
    chat = f"c-{uuid.uuid4().hex[:8]}"
    received: dict[int, str] = {}
    opened = threading.Barrier(13, timeout=20)

    def listen(index: int) -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=30) as listener:
            with listener.stream("GET", f"/v1/conversations/{chat}/events") as response:
                chunks: list[str] = []
                for chunk in response.iter_text():
                    if not chunks:
                        opened.wait()
                    chunks.append(chunk)
                    if "event: TURN_COMPLETED\n" in "".join(chunks):
                        break
                received[index] = "".join(chunks)

    threads = [threading.Thread(target=listen, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    opened.wait()
    # When a turn goes through its form and approval to the end
    turn_id = finished_ticket(client, chat)
    for thread in threads:
        thread.join(30)
    assert len(received) == 12
    # Then each client got every stored event, in the order a replay gives
    _, replay = read_stream(client, f"/v1/conversations/{chat}/events", params={"follow": "false"}, until_end=False)
    streams = [parse_sse(text) for text in received.values()]
    assert all(event_ids(events) == event_ids(replay) for events in streams)
    assert {e["data"]["turn_id"] for e in replay} == {turn_id}
    # And every cursor the live streams handed out resumes with exactly the rest
    live = streams[0]
    for index, event in enumerate(live):
        _, rest = read_stream(
            client,
            f"/v1/conversations/{chat}/events",
            params={"follow": "false"},
            headers={"Last-Event-ID": event["id"]},
            until_end=False,
        )
        assert event_ids(rest) == event_ids(live[index + 1 :])


def test_a_client_that_leaves_while_its_stream_waits_logs_no_error(client: httpx.Client, server: ApiServer) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    turn_id = start(client, "ticket", chat)
    call = wait_for(client, turn_id, blocked)["suspension"]["correlation_id"]
    logged_before = len(server.log.read_text(errors="replace"))
    # Given streams of the conversation and of the turn, caught up and waiting for new events
    for path in (f"/v1/conversations/{chat}/events", f"/v1/turns/{turn_id}/events"):
        with client.stream("GET", path) as response:
            for line in response.iter_lines():
                if line.startswith("event: TURN_SUSPENDED"):
                    break
            time.sleep(0.3)  # the stream now waits on the scope's follower
        # When the client goes away (the `with` closes the connection)
    # Then the events that come next reach nobody there, and the server logs no error
    answer_form(client, turn_id, call)
    wait_for(client, turn_id, lambda v: v["status"] == "WAITING_FOR_APPROVAL")
    time.sleep(KEEPALIVE_S + 1.0)  # a read left behind by its stream would wake by then
    log = server.log.read_text(errors="replace")[logged_before:]
    assert "Task exception was never retrieved" not in log and "Traceback" not in log, log

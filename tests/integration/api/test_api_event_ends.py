"""When a turn stream sends `end`: only after the root's terminal event, whatever else runs on the database server.

The stream reads the turn's status and the event log at moments of its own while the turn
goes on; these tests put the turn's last save (or the end of a transaction elsewhere on
the server) exactly between two of those reads, by wrapping the store of an in-process
server, and run real turns on a real server while a transaction stays open in another
database of the same PostgreSQL server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

import store
import workers.api.event_streams
from agent_runner import (
    AgentEvent,
    AgentEventType,
    AgentTurn,
    AgentTurnStatus,
    EventScope,
    InMemoryAgentLoader,
    TurnRef,
)
from tests.helpers.other_database import transaction_open_elsewhere
from tests.integration.api.api_server import ended, parse_sse, read_stream, serve, wait_for
from workers.api import create_app
from workers.api.auth import runtime_handle
from workers.api.runtime import Runtime

pytestmark = pytest.mark.integration

E = AgentEventType


@pytest.fixture(params=[pytest.param("sqlite_url", id="sqlite"), pytest.param("pg_url", id="postgres")])
def database_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(request.param))


@pytest.fixture
def app_client(database_url: str) -> Iterator[TestClient]:
    """An in-process server with no worker: the tests save the turns themselves."""
    app = create_app(agents=InMemoryAgentLoader([]), database_url=database_url, worker="none")
    with TestClient(app) as client:
        yield client


def runtime_of(client: TestClient) -> Runtime:
    app = client.app
    assert isinstance(app, FastAPI)
    return runtime_handle(app).get()


def started_turn(turns: store.SqlAgentTurnStore, turn_id: str) -> AgentTurn:
    """A RUNNING root turn saved with its TURN_STARTED event."""
    turn = AgentTurn(id=turn_id, agent_id="desk", status=AgentTurnStatus.RUNNING)
    return turns.save(turn, -1, [AgentEvent(event_id=f"{turn_id}:0:0", type=E.TURN_STARTED, turn_id=turn_id)])


def end_turn(turns: store.SqlAgentTurnStore, turn: AgentTurn) -> None:
    """The turn's last save: its answer and TURN_COMPLETED, with the COMPLETED status."""
    events = [
        AgentEvent(event_id=f"{turn.id}:1:0", type=E.MODEL_RESPONSE, turn_id=turn.id, data={"content": "done"}),
        AgentEvent(event_id=f"{turn.id}:1:1", type=E.TURN_COMPLETED, turn_id=turn.id),
    ]
    turns.save(turn.model_copy(update={"status": AgentTurnStatus.COMPLETED}), turn.version, events)


def on_stream_thread() -> bool:
    """Whether this thread serves a stream's own reads (not a shared follower of `workers.api.fanout`)."""
    return not threading.current_thread().name.startswith("agent-runner-events")


def replay(client: TestClient, turn_id: str, after: str | None = None) -> list[dict[str, Any]]:
    """The events of a replay (`?follow=false`) of the turn's stream, from `after`."""
    params = {"follow": "false"} if after is None else {"follow": "false", "after": after}
    response = client.get(f"/v1/turns/{turn_id}/events", params=params)
    assert response.status_code == 200, response.text
    return parse_sse(response.text)


def types_of(events: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in events]


def test_a_replay_of_a_turn_that_ends_during_it_sends_the_terminal_event_before_end(
    app_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns = runtime_of(app_client).turn_store
    turn = started_turn(turns, "t-replay")
    reads = turns.read_events
    ends: list[str] = []

    def read_then_end(scope: EventScope, **kwargs: Any) -> list[AgentEvent]:
        # The turn ends right after the replay read the end of what was stored
        found = reads(scope, **kwargs)
        if not found and not ends and on_stream_thread():
            ends.append("ended")
            end_turn(turns, turn)
        return found

    monkeypatch.setattr(turns, "read_events", read_then_end)
    # When a replay runs into the turn's last save
    events = replay(app_client, "t-replay")
    # Then it sends the events of that save before `end`, never `end` alone
    assert ends == ["ended"]
    assert types_of(events) == ["TURN_STARTED", "MODEL_RESPONSE", "TURN_COMPLETED", "end"]
    assert events[-1]["data"] == {"turn_id": "t-replay", "status": "COMPLETED"}


def test_a_replay_of_an_ended_turn_from_its_last_cursor_ends_at_once(app_client: TestClient) -> None:
    turns = runtime_of(app_client).turn_store
    end_turn(turns, started_turn(turns, "t-done"))
    events = replay(app_client, "t-done")
    assert types_of(events) == ["TURN_STARTED", "MODEL_RESPONSE", "TURN_COMPLETED", "end"]
    # A client that got the terminal event but not `end` is told the end, and nothing again
    again = replay(app_client, "t-done", after=events[-2]["id"])
    assert types_of(again) == ["end"]
    # One that stopped before it gets the rest first
    rest = replay(app_client, "t-done", after=events[0]["id"])
    assert types_of(rest) == ["MODEL_RESPONSE", "TURN_COMPLETED", "end"]


def test_a_live_stream_never_ends_without_the_terminal_event_when_a_transaction_elsewhere_ends_between_its_reads(
    pg_url: str, admin: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers.api.event_streams, "KEEPALIVE_S", 0.3)  # the stream looks at the turn's status often
    app = create_app(agents=InMemoryAgentLoader([]), database_url=pg_url, worker="none")
    with ExitStack() as stack:
        client = stack.enter_context(TestClient(app))
        turns = runtime_of(client).turn_store
        turn = started_turn(turns, "t-live")
        # Given a write transaction open in another database of the server
        elsewhere = stack.enter_context(transaction_open_elsewhere(admin))
        ended_seen: list[str] = []
        released: list[str] = []
        get_ref, reads = turns.get_ref, turns.read_events

        def watched_get_ref(turn_id: str) -> TurnRef:
            ref = get_ref(turn_id)
            if ref.status.is_terminal and on_stream_thread():
                ended_seen.append(turn_id)
            return ref

        def read_then_release(scope: EventScope, **kwargs: Any) -> list[AgentEvent]:
            # The transaction elsewhere ends right after the first read that follows the
            # stream's seeing the turn ended, before any read the stream makes after it
            found = reads(scope, **kwargs)
            if ended_seen and not released and on_stream_thread():
                released.append("released")
                elsewhere.commit()
            return found

        monkeypatch.setattr(turns, "get_ref", watched_get_ref)
        monkeypatch.setattr(turns, "read_events", read_then_release)
        received: list[dict[str, Any]] = []
        reader = threading.Thread(target=follow_into, args=(client, "/v1/turns/t-live/events", received))
        reader.start()
        # When the turn ends while the stream follows it
        wait_until(lambda: len(received) > 0 or not reader.is_alive(), "the stream's first event")
        end_turn(turns, turn)
        reader.join(timeout=60)
    # Then the stream sent the turn's last events, and only then `end`
    assert not reader.is_alive()
    assert types_of(received) == ["TURN_STARTED", "MODEL_RESPONSE", "TURN_COMPLETED", "end"]


def follow_into(client: TestClient, path: str, received: list[dict[str, Any]]) -> None:
    """Follow an SSE stream until `end` (or until it closes), keeping `received` up to date as events come."""
    text = ""
    with client.stream("GET", path) as response:
        for chunk in response.iter_text():
            text += chunk
            received[:] = parse_sse(text)
            if "event: end\n" in text:
                return


def wait_until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_real_server_streams_every_event_at_once_while_a_transaction_elsewhere_stays_open(
    pg_url: str, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    with ExitStack() as stack:
        # Given a write transaction left open in another database of the same server
        stack.enter_context(transaction_open_elsewhere(admin))
        server = stack.enter_context(_served(tmp_path, pg_url))
        client = stack.enter_context(server.client())
        # When a turn runs to its end, a replay of it has every event, then `end`
        first = client.post("/v1/turns", json={"agent_id": "desk", "input": "hello", "conversation_id": "c-1"}).json()
        wait_for(client, first["id"], ended)
        _, replay = read_stream(client, f"/v1/turns/{first['id']}/events", params={"follow": "false"}, until_end=False)
        assert types_of(replay)[0] == "TURN_STARTED"
        assert types_of(replay)[-3:] == ["MODEL_RESPONSE", "TURN_COMPLETED", "end"]
        # And a live stream of the next turn follows it to its end
        second = client.post("/v1/turns", json={"agent_id": "desk", "input": "again", "conversation_id": "c-1"}).json()
        _, live = read_stream(client, f"/v1/turns/{second['id']}/events")
        assert types_of(live)[0] == "TURN_STARTED"
        assert types_of(live)[-3:] == ["MODEL_RESPONSE", "TURN_COMPLETED", "end"]
        # And the conversation's replay holds both turns
        _, both = read_stream(client, "/v1/conversations/c-1/events", params={"follow": "false"}, until_end=False)
        assert [e["data"]["turn_id"] for e in both if e["event"] == "TURN_COMPLETED"] == [first["id"], second["id"]]


def _served(tmp_path: Path, database_url: str) -> Any:
    """A real `agent-runner serve` of the test agents on `database_url`, stepping turns itself."""
    return contextmanager(serve)(tmp_path, database_url, ["--worker", "embedded"])

"""Runs created with `after_seconds`, through the unmodified Python `langgraph-sdk` against a real server."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient

from tests.helpers.api_server import ApiServer

pytestmark = pytest.mark.integration

Client = Any
"""The sync client as the tests use it (its answers are TypedDict unions indexed freely)."""

FINISH_BOUND_S = 15.0
"""How long after its start time a delayed run of the echo agent must have ended (generous: a loaded machine)."""


@pytest.fixture
def client(server: ApiServer) -> Iterator[SyncLangGraphClient]:
    with get_sync_client(url=server.url, api_key=None) as client:
        yield client


def user(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def last_text(values: Any) -> tuple[str, str]:
    message = values["messages"][-1]
    return message["type"], message["content"]


def refused(call: Callable[[], object], status: int) -> dict[str, Any]:
    with pytest.raises(httpx.HTTPStatusError) as raised:
        call()
    assert raised.value.response.status_code == status, raised.value.response.text
    error: dict[str, Any] = raised.value.response.json()["error"]
    return error


def turn_view(server: ApiServer, turn_id: str) -> dict[str, Any]:
    with httpx.Client(base_url=server.url) as raw:
        answer = raw.get(f"/v1/turns/{turn_id}")
        answer.raise_for_status()
        view: dict[str, Any] = answer.json()
        return view


def test_a_delayed_run_is_pending_holds_its_thread_then_succeeds_and_join_returns_its_output(
    client: Client, server: ApiServer
) -> None:
    thread_id = client.threads.create()["thread_id"]
    # Given a run created to start 2 s from now
    run = client.runs.create(thread_id, "desk", input=user("later"), after_seconds=2)
    # Then it is pending, with its start time in the turn view, and it holds the thread
    assert run["status"] == "pending"
    view = turn_view(server, run["run_id"])
    assert view["status"] == "READY" and view["next_retry_at"] is None
    starts_at = datetime.fromisoformat(view["starts_at"]).timestamp()
    time.sleep(0.5)
    assert client.runs.get(thread_id, run["run_id"])["status"] == "pending"
    assert client.threads.get(thread_id)["status"] == "busy"
    assert refused(lambda: client.runs.create(thread_id, "desk", input=user("now")), 409)["type"] == (
        "AgentConversationBusyException"
    )
    # When the client joins it across the delay
    joined = client.runs.join(thread_id, run["run_id"])
    # Then it answers the run's output once it ran, not before its start time
    ended = time.time()
    assert last_text(joined) == ("ai", "echo: later")
    assert starts_at <= ended < starts_at + FINISH_BOUND_S
    assert client.runs.get(thread_id, run["run_id"])["status"] == "success"
    assert turn_view(server, run["run_id"])["starts_at"] is None


def test_stateless_wait_and_stream_runs_start_after_their_delay(client: Client) -> None:
    # A stateless run waited for answers its values once it ran, at least its delay later
    began = time.monotonic()
    values = client.runs.wait(None, "desk", input=user("waited"), after_seconds=1)
    assert last_text(values) == ("ai", "echo: waited")
    assert time.monotonic() - began >= 1.0
    # A streamed run sends the values of the run once it starts
    began = time.monotonic()
    parts = list(client.runs.stream(None, "desk", input=user("streamed"), stream_mode="values", after_seconds=1))
    assert time.monotonic() - began >= 1.0
    values_parts = [part.data for part in parts if part.event == "values"]
    assert last_text(values_parts[-1]) == ("ai", "echo: streamed")


def test_a_delayed_run_cancelled_before_it_starts_ends_at_once(client: Client) -> None:
    thread_id = client.threads.create()["thread_id"]
    run = client.runs.create(thread_id, "desk", input=user("never"), after_seconds=60)
    client.runs.cancel(thread_id, run["run_id"], wait=True)
    assert client.runs.get(thread_id, run["run_id"])["status"] == "interrupted"
    assert client.threads.get(thread_id)["status"] == "idle"
    # The thread is free again for the next run
    assert last_text(client.runs.wait(thread_id, "desk", input=user("now"))) == ("ai", "echo: now")


def test_bad_delays_are_typed_errors_and_start_nothing(client: Client, server: ApiServer) -> None:
    thread_id = client.threads.create()["thread_id"]
    too_long = refused(lambda: client.runs.create(thread_id, "desk", input=user("x"), after_seconds=10**9), 422)
    assert too_long["type"] == "InputLimitError" and too_long["details"][0]["path"] == "/after_seconds"
    with httpx.Client(base_url=server.url) as raw:
        negative = raw.post(f"/threads/{thread_id}/runs", json={"assistant_id": "desk", "after_seconds": -1})
        assert negative.status_code == 422
    assert client.runs.list(thread_id) == []
    assert client.threads.get(thread_id)["status"] == "idle"

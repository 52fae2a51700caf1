"""Crons through the Python `langgraph-sdk`: stored schedules fired by the server, searched and deleted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_sync_client

from tests.helpers.api_server import ApiServer

pytestmark = pytest.mark.integration

FIRST_TICK_TIMEOUT_S = 90.0
"""A cron ticks each minute at the earliest: the first tick comes within one."""


@pytest.fixture
def client(server: ApiServer) -> Iterator[Any]:
    with get_sync_client(url=server.url, api_key=None) as client:
        yield client


def test_a_thread_cron_starts_runs_and_crons_are_searched_and_deleted(client: Any) -> None:
    thread_id = client.threads.create()["thread_id"]
    # Given a cron firing every minute on a thread, and one outside any thread
    cron = client.crons.create_for_thread(
        thread_id,
        "desk",
        schedule="* * * * *",
        input={"messages": [{"role": "user", "content": "status report"}]},
        metadata={"purpose": "test"},
    )
    assert cron["thread_id"] == thread_id and cron["schedule"] == "* * * * *" and cron["enabled"] is True
    assert cron["next_run_date"] is not None and cron["metadata"] == {"purpose": "test"}
    loose = client.crons.create(
        "desk",
        schedule="0 9 * * 1",
        timezone="Europe/Paris",
        input={"messages": [{"role": "user", "content": "weekly"}]},
    )
    assert loose["thread_id"] is None and loose["timezone"] == "Europe/Paris"
    # Then search and count see them
    mine = {c["cron_id"] for c in client.crons.search(thread_id=thread_id)}
    assert mine == {cron["cron_id"]}
    assert {cron["cron_id"], loose["cron_id"]} <= {
        c["cron_id"] for c in client.crons.search(assistant_id="desk", limit=100)
    }
    assert client.crons.count(thread_id=thread_id) == 1
    # When a minute passes, the thread has a run started by the cron
    deadline = time.monotonic() + FIRST_TICK_TIMEOUT_S
    runs: list[dict[str, Any]] = []
    while not runs and time.monotonic() < deadline:
        runs = client.runs.list(thread_id)
        time.sleep(0.5)
    assert runs, "the cron never started a run"
    assert runs[0]["metadata"]["cron_id"] == cron["cron_id"]
    assert client.runs.join(thread_id, runs[0]["run_id"])["messages"][-1]["content"] == "echo: status report"
    # Deleting stops it
    client.crons.delete(cron["cron_id"])
    client.crons.delete(loose["cron_id"])
    assert client.crons.search(thread_id=thread_id) == []
    with pytest.raises(httpx.HTTPStatusError) as raised:
        client.crons.delete(cron["cron_id"])
    assert raised.value.response.status_code == 404


def test_bad_crons_are_refused(client: Any) -> None:
    message = {"messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(httpx.HTTPStatusError) as bad:
        client.crons.create("desk", schedule="every now and then", input=message)
    assert (
        bad.value.response.status_code == 422
        and bad.value.response.json()["error"]["details"][0]["path"] == "/schedule"
    )
    with pytest.raises(httpx.HTTPStatusError) as zone:
        client.crons.create("desk", schedule="* * * * *", timezone="Mars/Olympus", input=message)
    assert zone.value.response.status_code == 422
    with pytest.raises(httpx.HTTPStatusError) as unknown:
        client.crons.create("nobody", schedule="* * * * *", input=message)
    assert unknown.value.response.status_code == 404
    with pytest.raises(httpx.HTTPStatusError) as interrupt:
        client.crons.create("desk", schedule="* * * * *", input=message, multitask_strategy="interrupt")
    assert interrupt.value.response.status_code == 501


def test_a_cron_is_disabled_and_enabled_and_nothing_else_changes(client: Any) -> None:
    message = {"messages": [{"role": "user", "content": "x"}]}
    cron = client.crons.create("desk", schedule="0 9 * * 1", input=message)
    # When it is disabled, it has no next run; enabled again, it has one
    disabled = client.crons.update(cron["cron_id"], enabled=False)
    assert disabled["enabled"] is False and disabled["next_run_date"] is None
    assert client.crons.update(cron["cron_id"], enabled=True)["next_run_date"] is not None
    # Changing anything else is refused, naming it
    with pytest.raises(httpx.HTTPStatusError) as schedule:
        client.crons.update(cron["cron_id"], schedule="* * * * *", enabled=False)
    assert schedule.value.response.status_code == 501
    assert "schedule" in schedule.value.response.json()["error"]["message"]
    # Nothing to change: the cron as it is
    assert client.crons.update(cron["cron_id"])["enabled"] is True
    [kept] = [c for c in client.crons.search(assistant_id="desk", limit=1000) if c["cron_id"] == cron["cron_id"]]
    assert kept["enabled"] is True and kept["schedule"] == "0 9 * * 1"
    client.crons.delete(cron["cron_id"])

"""Two tenants through the LangGraph API: the SDK's `x-api-key` (or a bearer token) names the tenant."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_sync_client

from tests.helpers.api_server import TENANT_A_KEY, TENANT_B_KEY, ApiServer, two_tenants_server
from tests.integration.langgraph.langgraph_agents import AGENTS

pytestmark = pytest.mark.integration

KEY_A = TENANT_A_KEY
KEY_B = TENANT_B_KEY


@pytest.fixture(scope="module")
def server(server_dir: Path) -> Iterator[ApiServer]:
    yield from two_tenants_server(AGENTS, server_dir)


@pytest.fixture
def a(server: ApiServer) -> Iterator[Any]:
    with get_sync_client(url=server.url, api_key=KEY_A) as client:
        yield client


@pytest.fixture
def b(server: ApiServer) -> Iterator[Any]:
    # The bearer token works as well as the SDK's x-api-key.
    with get_sync_client(url=server.url, api_key=None, headers={"Authorization": f"Bearer {KEY_B}"}) as client:
        yield client


def test_requests_without_a_valid_key_are_refused(server: ApiServer) -> None:
    with get_sync_client(url=server.url, api_key=None) as anonymous:
        with pytest.raises(httpx.HTTPStatusError) as raised:
            anonymous.threads.search()
    assert raised.value.response.status_code == 401
    with get_sync_client(url=server.url, api_key="not-a-key") as wrong:
        with pytest.raises(httpx.HTTPStatusError) as refused:
            wrong.assistants.search()
    assert refused.value.response.status_code == 401


def test_tenants_share_thread_ids_without_meeting(a: Any, b: Any) -> None:
    thread_id = f"shared-{uuid.uuid4().hex}"
    # Given the same thread id in both tenants
    a.threads.create(thread_id=thread_id, metadata={"owner": "a"})
    b.threads.create(thread_id=thread_id, metadata={"owner": "b"})
    # When each runs on it
    a.runs.wait(thread_id, "desk", input={"messages": [{"role": "user", "content": "from a"}]})
    b.runs.wait(thread_id, "desk", input={"messages": [{"role": "user", "content": "from b"}]})
    # Then each sees its own conversation only
    seen_a = [m["content"] for m in a.threads.get_state(thread_id)["values"]["messages"]]
    seen_b = [m["content"] for m in b.threads.get_state(thread_id)["values"]["messages"]]
    assert seen_a == ["from a", "echo: from a"] and seen_b == ["from b", "echo: from b"]
    assert a.threads.get(thread_id)["metadata"] == {"owner": "a"}
    # And another tenant's run or thread is not found
    run_a = a.runs.list(thread_id)[0]["run_id"]
    with pytest.raises(httpx.HTTPStatusError) as raised:
        b.runs.get(thread_id, run_a)
    assert raised.value.response.status_code == 404
    only_a = f"only-a-{uuid.uuid4().hex}"
    a.threads.create(thread_id=only_a)
    with pytest.raises(httpx.HTTPStatusError) as hidden:
        b.threads.get(only_a)
    assert hidden.value.response.status_code == 404
    assert only_a not in {t["thread_id"] for t in b.threads.search(limit=1000)}
    assert only_a in {t["thread_id"] for t in a.threads.search(limit=1000)}


def test_the_x_api_key_header_works_on_the_v1_routes_too(server: ApiServer) -> None:
    with httpx.Client(base_url=server.url) as raw:
        assert raw.get("/v1/turns", headers={"x-api-key": KEY_A}).status_code == 200
        assert raw.get("/v1/turns", headers={"x-api-key": "nope"}).status_code == 401
        assert raw.get("/v1/turns").status_code == 401


def test_a_token_limited_to_one_conversation_reaches_that_thread_only(server: ApiServer, a: Any) -> None:
    mine, other = f"mine-{uuid.uuid4().hex}", f"other-{uuid.uuid4().hex}"
    a.threads.create(thread_id=mine)
    a.threads.create(thread_id=other)
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY_A}"}) as raw:
        minted = raw.post("/v1/tokens", json={"user": "ann", "conversation_id": mine})
        assert minted.status_code in (200, 201), minted.text
        token = minted.json()["token"]
    with get_sync_client(url=server.url, api_key=token) as typed:
        limited: Any = typed
        values = limited.runs.wait(mine, "desk", input={"messages": [{"role": "user", "content": "hi"}]})
        assert values["messages"][-1]["content"] == "echo: hi"
        assert [t["thread_id"] for t in limited.threads.search(limit=1000)] == [mine]
        with pytest.raises(httpx.HTTPStatusError) as raised:
            limited.threads.get(other)
        assert raised.value.response.status_code == 404
        # A thread created without an id is the token's thread, never a 404 naming an id it did not send
        assert limited.threads.create()["thread_id"] == mine
        stateless = limited.runs.wait(None, "desk", input={"messages": [{"role": "user", "content": "again"}]})
        assert stateless["messages"][-1]["content"] == "echo: again"
        assert [t["thread_id"] for t in limited.threads.search(limit=1000)] == [mine]

"""The `a2a-sdk` client against `agent-runner serve`: card, tasks, input-required, cancel, streams, tenants."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator
from typing import Any, cast

import httpx
import pytest
from a2a.types import CancelTaskRequest, GetTaskRequest, StreamResponse, SubscribeToTaskRequest, TaskState
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError, TaskNotFoundError, UnsupportedOperationError

from tests.helpers.api_server import ApiServer
from tests.integration.a2a.a2a_client import collect, connect, data_of, message, send
from tests.integration.a2a.conftest import KEY_A, KEY_B
from tests.integration.langgraph.langgraph_agents import story

pytestmark = pytest.mark.integration


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_the_card_names_the_agent_and_its_json_rpc_url(server: ApiServer) -> None:
    async def scenario() -> None:
        http = httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY_A}"}, timeout=30)
        async with http:
            card = (await http.get(f"{server.url}/a2a/desk/.well-known/agent-card.json")).json()
        async with httpx.AsyncClient() as nobody:
            anonymous = await nobody.get(f"{server.url}/a2a/desk/.well-known/agent-card.json")
        assert card["name"] == "desk"
        assert card["capabilities"] == {"streaming": True, "pushNotifications": False}
        assert card["supportedInterfaces"] == [
            {"url": f"{server.url}/a2a/desk", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ]
        assert {"open_ticket", "pause"} <= {skill["id"] for skill in card["skills"]}
        assert anonymous.status_code == 401

    run(scenario())


def test_send_completes_with_the_answer_and_continues_the_context(server: ApiServer) -> None:
    async def scenario() -> None:
        async with connect(server, "desk", KEY_A, streaming=False) as client:
            first = await send(client, message("hello"))
            assert first.status.state == TaskState.TASK_STATE_COMPLETED
            assert [p.text for a in first.artifacts for p in a.parts] == ["echo: hello"]
            assert first.context_id
            # The same context is the same conversation: a second task (turn) in it.
            second = await send(client, message("again", context_id=first.context_id))
            assert second.context_id == first.context_id and second.id != first.id
            assert second.status.state == TaskState.TASK_STATE_COMPLETED
            fetched = await client.get_task(GetTaskRequest(id=first.id))
            assert fetched.status.state == TaskState.TASK_STATE_COMPLETED

    run(scenario())


def test_a_form_asks_for_input_and_its_answer_completes_the_task(server: ApiServer) -> None:
    async def scenario() -> None:
        async with connect(server, "desk", KEY_A, streaming=False) as client:
            task = await send(client, message("ticket please"))
            assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            # A subscription to a task that waits for input shows it and ends.
            async with connect(server, "desk", KEY_A, streaming=True) as streaming:
                shown = await collect(streaming.subscribe(SubscribeToTaskRequest(id=task.id)))
            assert [e.task.status.state for e in shown] == [TaskState.TASK_STATE_INPUT_REQUIRED]
            asked = data_of(task.status.message.parts[-1])
            assert asked["form"]["key"] == "ticket_details"
            assert asked["form"]["schema"]["required"] == ["system", "scope"]
            # Form data that fails the frozen schema is refused; nothing changes.
            with pytest.raises(InvalidParamsError, match="does not match the form's schema"):
                await send(client, message(data={"system": "x"}, task_id=task.id, context_id=task.context_id))
            task = await send(
                client,
                message(data={"system": "vpn", "scope": "ALL_USERS"}, task_id=task.id, context_id=task.context_id),
            )
            # Then the tool waits for approval, also input-required; approving completes it.
            assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            assert data_of(task.status.message.parts[-1])["type"] == "TOOL_APPROVAL"
            task = await send(client, message(data={"approved": True}, task_id=task.id, context_id=task.context_id))
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            assert task.artifacts[0].parts[0].text == "opened TICKET-vpn-ALL_USERS"
            # A finished task waits for no answer.
            with pytest.raises(UnsupportedOperationError):
                await send(client, message(data={"approved": True}, task_id=task.id, context_id=task.context_id))

    run(scenario())


def test_cancel_ends_a_working_task(server: ApiServer) -> None:
    async def scenario() -> None:
        async with connect(server, "desk", KEY_A, streaming=False) as client:
            request = message("sleep 1")
            request.configuration.return_immediately = True
            task = await send(client, request)
            assert task.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
            # A turn in the middle of a step stops at its next boundary: the answer may still say working.
            canceled = await client.cancel_task(CancelTaskRequest(id=task.id))
            assert canceled.id == task.id
            for _ in range(100):
                if canceled.status.state == TaskState.TASK_STATE_CANCELED:
                    break
                await asyncio.sleep(0.1)
                canceled = await client.get_task(GetTaskRequest(id=task.id))
            assert canceled.status.state == TaskState.TASK_STATE_CANCELED
            assert not canceled.artifacts
            with pytest.raises(TaskNotCancelableError):
                await client.cancel_task(CancelTaskRequest(id=task.id))

    run(scenario())


def test_a_stream_tells_the_text_in_order_then_the_end(server: ApiServer) -> None:
    async def scenario() -> None:
        async with connect(server, "writer", KEY_A, streaming=True) as client:
            events = await collect(client.send_message(message("story 6")))
            assert events[0].HasField("task")
            text = "".join(
                p.text for e in events if e.HasField("artifact_update") for p in e.artifact_update.artifact.parts
            )
            assert text == story(6)
            assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED

    run(scenario())


def test_a_resubscription_after_a_disconnect_reaches_the_end(server: ApiServer) -> None:
    async def scenario() -> None:
        async with connect(server, "writer", KEY_A, streaming=True) as client:
            stream = cast(AsyncGenerator[StreamResponse, None], client.send_message(message("story 40")))
            first = await anext(stream)
            await stream.aclose()  # the client drops mid-answer
            task_id = first.task.id
            events = await collect(client.subscribe(SubscribeToTaskRequest(id=task_id)))
            assert events[0].task.id == task_id
            last = events[-1]
            state = last.task.status.state if last.HasField("task") else last.status_update.status.state
            assert state == TaskState.TASK_STATE_COMPLETED

    run(scenario())


def test_another_tenant_never_finds_the_task(server: ApiServer) -> None:
    async def scenario() -> None:
        async with (
            connect(server, "desk", KEY_A, streaming=False) as a,
            connect(server, "desk", KEY_B, streaming=False) as b,
        ):
            task = await send(a, message("mine"))
            for call in (b.get_task(GetTaskRequest(id=task.id)), b.cancel_task(CancelTaskRequest(id=task.id))):
                with pytest.raises(TaskNotFoundError):
                    await call
            with pytest.raises(TaskNotFoundError):
                await send(b, message(data={"approved": True}, task_id=task.id))

    run(scenario())


def test_a_browser_token_reaches_its_conversation_only(server: ApiServer) -> None:
    mine = f"mine-{uuid.uuid4().hex}"
    with server.client(KEY_A) as backend:
        token = backend.post("/v1/tokens", json={"user": "ann", "conversation_id": mine}).json()["token"]

    async def scenario() -> None:
        async with connect(server, "desk", KEY_A, streaming=False) as tenant:
            elsewhere = await send(tenant, message("elsewhere"))
        async with connect(server, "desk", token, streaming=False) as browser:
            # A message naming no context starts its task in the token's conversation.
            task = await send(browser, message("from the browser"))
            assert task.context_id == mine and task.status.state == TaskState.TASK_STATE_COMPLETED
            with pytest.raises(TaskNotFoundError):
                await browser.get_task(GetTaskRequest(id=elsewhere.id))
            with pytest.raises(TaskNotFoundError):
                await send(browser, message("there", context_id=elsewhere.context_id))

    run(scenario())

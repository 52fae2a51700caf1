"""The `a2a-sdk` client of the A2A tests: connecting with a tenant's key, messages with text and data parts."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.helpers import get_data_parts, new_data_part
from a2a.types import Message, Part, Role, SendMessageRequest, StreamResponse, Task

from tests.helpers.api_server import ApiServer


@contextlib.asynccontextmanager
async def connect(server: ApiServer, agent_id: str, key: str, *, streaming: bool) -> AsyncIterator[Client]:
    """The SDK's client of the agent, from its card, sending `key` (the HTTP client it shares is closed after)."""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        factory = ClientFactory(ClientConfig(httpx_client=http, streaming=streaming))
        client = await factory.create_from_url(f"{server.url}/a2a/{agent_id}")
        try:
            yield client
        finally:
            await client.close()


def message(text: str | None = None, *, data: dict[str, Any] | None = None, **ids: str) -> SendMessageRequest:
    parts = []
    if text is not None:
        parts.append(Part(text=text))
    if data is not None:
        parts.append(new_data_part(data))
    return SendMessageRequest(message=Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=parts, **ids))


async def send(client: Client, request: SendMessageRequest) -> Task:
    """The task a blocking SendMessage answers."""
    answers = [answer async for answer in client.send_message(request)]
    assert len(answers) == 1 and answers[0].HasField("task"), answers
    return answers[0].task


async def collect(stream: AsyncIterator[StreamResponse]) -> list[StreamResponse]:
    return [event async for event in stream]


def data_of(part: Part) -> dict[str, Any]:
    found: dict[str, Any] = get_data_parts([part])[0]
    return found

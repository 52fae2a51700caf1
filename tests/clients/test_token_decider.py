"""A browser token's user is the decider on every route family, whatever the request's metadata says.

Each family approves the same kind of call (`deploy`, which needs approval) with a token
minted for `u-7` and, where the family lets a client send metadata, claims to be someone
else; the approval card of the conversation must name `u-7`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.clients.conftest import KEY_A
from tests.helpers.api_server import ApiServer
from tests.integration.api.api_server import blocked, status_is, wait_for

pytestmark = pytest.mark.integration

USER = "u-7"
CLAIMED = {"decided_by": "mallory", "approverId": "mallory", "user_id": "mallory"}
"""What a client writes to pass for someone else; a token's user wins over every decider key."""


def _token(server: ApiServer, conversation: str) -> str:
    with server.client(KEY_A) as client:
        minted = client.post("/v1/tokens", json={"user": USER, "conversation_id": conversation})
    assert minted.status_code == 201, minted.text
    token: str = minted.json()["token"]
    return token


def _waiting_approval(browser: httpx.Client, conversation: str) -> tuple[str, str]:
    """Start `deploy web` in the conversation through /v1 and wait for its approval; (turn id, call id)."""
    started = browser.post(
        "/v1/turns", json={"agent_id": "assistant", "input": "deploy web", "conversation_id": conversation}
    )
    assert started.status_code == 201, started.text
    turn_id = started.json()["id"]
    suspension = wait_for(browser, turn_id, status_is("WAITING_FOR_APPROVAL"))["suspension"]
    return turn_id, suspension["correlation_id"]


def _approve_v1(browser: httpx.Client, conversation: str, turn_id: str, call_id: str) -> None:
    body = {"action": "approve", "tool_call_id": call_id, "metadata": CLAIMED}
    response = browser.post(f"/v1/turns/{turn_id}/resume", json=body)
    assert response.status_code == 202, response.text


def _approve_langgraph(browser: httpx.Client, conversation: str, turn_id: str, call_id: str) -> None:
    body = {
        "assistant_id": "assistant",
        "command": {"resume": {"decisions": [{"type": "approve"}]}},
        "metadata": CLAIMED,
    }
    response = browser.post(f"/threads/{conversation}/runs", json=body)
    assert response.status_code == 200, response.text


def _approve_ai_sdk(browser: httpx.Client, conversation: str, turn_id: str, call_id: str) -> None:
    part = {
        "type": "tool-deploy",
        "toolCallId": call_id,
        "state": "approval-responded",
        "approval": {"id": call_id, "approved": True},
    }
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "deploy web"}]}
    answer = {"id": turn_id, "role": "assistant", "parts": [part], "metadata": CLAIMED}
    body = {"id": conversation, "messages": [user, answer], "trigger": "submit-message", "metadata": CLAIMED}
    response = browser.post("/v1/agents/assistant/ai-sdk/chat", json=body)
    assert response.status_code == 200, response.text


def _approve_ag_ui(browser: httpx.Client, conversation: str, turn_id: str, call_id: str) -> None:
    body = {
        "threadId": conversation,
        "runId": f"r-{uuid.uuid4().hex[:8]}",
        "messages": [],
        "state": {},
        "tools": [],
        "context": [],
        "forwardedProps": {"metadata": CLAIMED},
        "resume": [{"interruptId": call_id, "status": "resolved", "payload": {"approved": True}}],
    }
    response = browser.post("/v1/agents/assistant/ag-ui", json=body)
    assert response.status_code == 200, response.text


def _approve_a2a(browser: httpx.Client, conversation: str, turn_id: str, call_id: str) -> None:
    message = {
        "messageId": uuid.uuid4().hex,
        "role": "ROLE_USER",
        "taskId": turn_id,
        "contextId": conversation,
        "parts": [{"data": {"approved": True}}],
        "metadata": CLAIMED,
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": message, "configuration": {"returnImmediately": True}, "metadata": CLAIMED},
    }
    response = browser.post("/a2a/assistant", json=body)
    assert response.status_code == 200 and "result" in response.json(), response.text


Approve = Callable[[httpx.Client, str, str, str], None]


@pytest.mark.parametrize(
    "approve",
    [_approve_v1, _approve_langgraph, _approve_ai_sdk, _approve_ag_ui, _approve_a2a],
    ids=["v1", "langgraph", "ai-sdk", "ag-ui", "a2a"],
)
def test_the_tokens_user_decides_on_every_route_family(server: ApiServer, approve: Approve) -> None:
    conversation = f"c-decider-{uuid.uuid4().hex[:8]}"
    token = _token(server, conversation)
    with server.client(token) as browser:
        if approve is _approve_langgraph:
            created = browser.post("/threads", json={"thread_id": conversation})
            assert created.status_code == 200, created.text
        turn_id, call_id = _waiting_approval(browser, conversation)
        approve(browser, conversation, turn_id, call_id)
        assert wait_for(browser, turn_id, blocked)["status"] == "COMPLETED"
        items: list[dict[str, Any]] = browser.get(f"/v1/conversations/{conversation}/messages").json()["items"]
    (card,) = [item for item in items if item.get("action_id") == call_id]
    assert (card["status"], card["decided_by"]) == ("APPROVED", USER), json.dumps(card)

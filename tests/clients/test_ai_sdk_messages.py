"""`GET /v1/agents/{agent_id}/ai-sdk/chat/{chat_id}/messages`: a conversation as the UI messages `useChat` shows."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.clients.conftest import KEY_A, KEY_B
from tests.helpers.api_server import ApiServer

pytestmark = pytest.mark.integration

CHAT = "/v1/agents/assistant/ai-sdk/chat"


def _user(text: str, message_id: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def _chunks(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    lines = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def _send(client: httpx.Client, chat_id: str, text: str, message_id: str) -> list[dict[str, Any]]:
    return _chunks(client.post(CHAT, json={"id": chat_id, "messages": [_user(text, message_id)]}))


def _answer(client: httpx.Client, chat_id: str, first: list[dict[str, Any]], part: dict[str, Any]) -> None:
    """Send the assistant message of the turn streamed as `first`, with `part` answering what it waits for."""
    message = {"id": first[0]["messageId"], "role": "assistant", "parts": [part]}
    answered = _chunks(client.post(CHAT, json={"id": chat_id, "messages": [message]}))
    assert answered[-1]["messageMetadata"]["status"] == "COMPLETED", answered


def _call_id(chunks: list[dict[str, Any]]) -> str:
    return str(next(c["toolCallId"] for c in chunks if c["type"] == "tool-input-available"))


def _decide(client: httpx.Client, chat_id: str, first: list[dict[str, Any]], approved: bool, reason: str) -> None:
    call_id = _call_id(first)
    approval = {"id": call_id, "approved": approved, "reason": reason}
    _answer(
        client,
        chat_id,
        first,
        {"type": "tool-deploy", "toolCallId": call_id, "state": "approval-responded", "approval": approval},
    )


def _without_step_starts(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in message["parts"] if p["type"] != "step-start"]


def test_a_conversation_reads_back_as_ui_messages_with_each_call_in_its_current_state(server: ApiServer) -> None:
    # Given a conversation: an answer, a form filled in, a call rejected, one approved, and one waiting
    chat_id = "c-reload"
    with server.client(KEY_A) as client:
        hello = _send(client, chat_id, "hello world", "m-1")
        ticket = _send(client, chat_id, "ticket", "m-2")
        data = {"system": "vpn", "scope": "ALL_USERS"}
        form_part = {"type": "tool-request_user_input", "toolCallId": _call_id(ticket), "state": "output-available"}
        _answer(client, chat_id, ticket, form_part | {"output": data})
        rejected = _send(client, chat_id, "deploy api", "m-3")
        _decide(client, chat_id, rejected, False, "not today")
        approved = _send(client, chat_id, "deploy web", "m-4")
        _decide(client, chat_id, approved, True, "checked")
        waiting = _send(client, chat_id, "deploy billing", "m-5")
        # When the page reloads and asks for the chat's messages (twice)
        first = client.get(f"{CHAT}/{chat_id}/messages")
        second = client.get(f"{CHAT}/{chat_id}/messages")
    assert first.status_code == 200, first.text
    messages = first.json()
    # Then they are the conversation oldest first, with the same ids on every call
    assert messages == second.json()
    assert [m["role"] for m in messages] == ["user", "assistant"] * 5
    assert [m["parts"] for m in messages[::2]] == [
        [{"type": "text", "text": text}]
        for text in ("hello world", "ticket", "deploy api", "deploy web", "deploy billing")
    ]
    answer, form, rejection, approval, pending = messages[1::2]
    assert _without_step_starts(answer) == [{"type": "text", "text": "Hello! You said world.", "state": "done"}]
    # An assistant message whose turn the timeline names has the id the stream gave it
    for message, streamed in ((form, ticket), (rejection, rejected), (approval, approved), (pending, waiting)):
        assert message["id"] == streamed[0]["messageId"]
        assert message["metadata"] == {"turnId": streamed[0]["messageId"], "conversationId": chat_id}
    assert hello[0]["messageId"] != answer["id"]  # an ended turn without cards: the id of its first message
    # The filled-in form: its call with the data as output, then the answer
    assert [p["type"] for p in form["parts"]] == ["step-start", "text", "tool-request_user_input", "step-start", "text"]
    call = form["parts"][2]
    assert call["state"] == "output-available" and call["output"] == data
    assert form["parts"][-1]["text"] == "ticket for vpn (ALL_USERS)"
    # The rejected call is denied with the reason; the approved one ran; the waiting one asks
    denied = rejection["parts"][1]
    assert denied["state"] == "output-denied" and denied["input"] == {"service": "api"}
    assert denied["approval"] == {"id": _call_id(rejected), "approved": False, "reason": "not today"}
    assert rejection["parts"][-1]["text"] == "not deployed: The user rejected this tool call: not today"
    ran = approval["parts"][1]
    assert ran["state"] == "output-available" and ran["output"] == "deployed web"
    assert ran["approval"] == {"id": _call_id(approved), "approved": True, "reason": "checked"}
    assert _without_step_starts(pending) == [
        {
            "type": "tool-deploy",
            "toolCallId": _call_id(waiting),
            "state": "approval-requested",
            "input": {"service": "billing"},
            "approval": {"id": _call_id(waiting)},
        }
    ]


def test_a_form_waiting_reads_back_as_its_call_awaiting_input_and_the_form(server: ApiServer) -> None:
    with server.client(KEY_A) as client:
        streamed = _send(client, "c-reload-form", "ticket", "m-1")
        (user, assistant) = client.get(f"{CHAT}/c-reload-form/messages").json()
    assert user["id"] and user["parts"] == [{"type": "text", "text": "ticket"}]
    assert assistant["id"] == streamed[0]["messageId"]
    (streamed_form,) = [c for c in streamed if c["type"] == "data-form"]
    step, text, call, form = assistant["parts"]
    assert step == {"type": "step-start"} and text["text"] == "I need the details."
    assert call["type"] == "tool-request_user_input" and call["state"] == "input-available"
    assert form == {"type": "data-form", "id": call["toolCallId"], "data": streamed_form["data"]}
    assert form["data"]["schema"]["required"] == ["system", "scope"]


def test_messages_reach_only_the_tenants_and_the_tokens_conversation(server: ApiServer) -> None:
    # Given tenant a's conversation, and a token of tenant a for another conversation
    with server.client(KEY_A) as client:
        _send(client, "c-mine", "hello mine", "m-1")
        minted = client.post("/v1/tokens", json={"user": "u-1", "conversation_id": "c-elsewhere"})
        assert minted.status_code in (200, 201), minted.text
        own = client.get(f"{CHAT}/c-mine/messages")
        unknown_agent = client.get("/v1/agents/nobody/ai-sdk/chat/c-mine/messages")
    with server.client(KEY_B) as other_tenant:
        theirs = other_tenant.get(f"{CHAT}/c-mine/messages")
    with server.client(minted.json()["token"]) as browser:
        scoped = browser.get(f"{CHAT}/c-mine/messages")
        its_own = browser.get(f"{CHAT}/c-elsewhere/messages")
    with server.client() as anonymous:
        missing_key = anonymous.get(f"{CHAT}/c-mine/messages")
    assert [m["role"] for m in own.json()] == ["user", "assistant"]
    # Then tenant b's chat of the same id is its own (empty), the token reaches only its conversation
    assert theirs.status_code == 200 and theirs.json() == []
    assert scoped.status_code == 404 and scoped.json()["error"]["type"]
    assert its_own.status_code == 200 and its_own.json() == []
    assert unknown_agent.status_code == 404 and missing_key.status_code == 401

"""The AI SDK's chat (`AbstractChat`, `DefaultChatTransport`, `readUIMessageStream` of the `ai` package) against a real server."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.clients.conftest import AGENTS, API_KEYS, KEY_A, KEY_B
from tests.clients.node_flows import run_flow
from tests.helpers.api_server import ApiServer, running_server

pytestmark = pytest.mark.integration

CHAT = "/v1/agents/assistant/ai-sdk/chat"


def flow(clients: Path, server: ApiServer, name: str, *keys: str) -> list[dict[str, Any]]:
    return run_flow(clients, server, "aisdk_flows.mjs", name, *keys)


def parts_of(summary: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [p for p in summary["parts"] if p["type"] == kind]


def test_an_answer_streams_as_text_deltas_into_one_assistant_message(clients: Path, server: ApiServer) -> None:
    # Given a chat, when the user sends a message
    (answer,) = flow(clients, server, "answer")
    # Then the chat holds the streamed answer, with the turn in its metadata
    assert answer["status"] == "ready" and answer["error"] is None
    assert answer["messages"] == 2 and answer["text"] == "Hello! You said world."
    assert answer["metadata"]["status"] == "COMPLETED" and answer["metadata"]["turnId"]
    assert [p["type"] for p in answer["parts"]] == ["step-start", "text"]


def test_the_raw_stream_is_a_ui_message_stream_with_one_chunk_per_delta(clients: Path, server: ApiServer) -> None:
    (raw,) = flow(clients, server, "raw")
    assert raw["header"] == "v1"
    types = raw["types"]
    assert types[:3] == ["start", "start-step", "text-start"]
    assert types.count("text-delta") == 4  # "Hello!", " You", " said", " raw."
    assert types[-3:] == ["text-end", "finish-step", "finish"]
    assert raw["message"]["parts"][-1]["text"] == "Hello! You said raw."


def test_a_tool_call_approved_and_one_rejected_through_add_tool_approval_response(
    clients: Path, server: ApiServer
) -> None:
    requested_ok, answered_ok, requested_no, answered_no = flow(clients, server, "approval")
    for requested in (requested_ok, requested_no):
        assert requested["state"] == "approval-requested" and requested["input"] == {"service": "billing"}
        assert requested["finish"]["status"] == "WAITING_FOR_APPROVAL"
    # Approved: the call ran, and the model answered with its result
    assert answered_ok["text"] == "deployed billing" and answered_ok["metadata"]["status"] == "COMPLETED"
    (deploy,) = parts_of(answered_ok, "tool-deploy")
    assert deploy["state"] == "output-available" and deploy["output"] == "deployed billing"
    # Rejected: the call was denied, and the model read the reason
    assert answered_no["text"] == "not deployed: The user rejected this tool call: not on a Friday"
    (denied,) = parts_of(answered_no, "tool-deploy")
    assert denied["state"] == "output-denied" and denied["approval"]["reason"] == "not on a Friday"
    # `ai` 7 kept the request's reason, which is how the server knows it reads `tool-approval-response`
    assert deploy["approval"]["requestReason"] and denied["approval"]["requestReason"]
    # One assistant message per turn, continued by the decision
    assert answered_ok["messages"] == answered_no["messages"] == 2


def test_a_form_is_refused_with_field_errors_then_filled_in(clients: Path, server: ApiServer) -> None:
    requested, refused, filled = flow(clients, server, "form")
    # The form arrives as a data part with the frozen schema
    form = requested["form"]
    assert form["key"] == "ticket_details" and form["schema"]["required"] == ["system", "scope"]
    assert requested["call_state"] == "input-available"
    # Data failing the schema: a 422 naming each field, and nothing changed
    assert refused["status"] == "error"
    assert '"type":"InvalidResumeCommand"' in refused["error"]
    assert '"path":"/scope"' in refused["error"] and '"path":"/system"' in refused["error"]
    # Valid data: the turn goes on and completes
    assert filled["text"].endswith("ticket for vpn (ALL_USERS)") and filled["metadata"]["status"] == "COMPLETED"


def test_tool_results_and_tool_errors_show_on_their_tool_parts(clients: Path, server: ApiServer) -> None:
    found, failed = flow(clients, server, "tools")
    (ok,) = parts_of(found, "tool-lookup")
    assert ok["state"] == "output-available" and ok["input"] == {"key": "vpn"} and ok["output"] == "vpn: 3 gateways"
    assert found["text"] == "found: vpn: 3 gateways"
    (error,) = parts_of(failed, "tool-lookup")
    assert error["state"] == "output-error" and error["errorText"] == "no system called 'mainframe'"
    assert failed["text"] == "lookup failed: no system called 'mainframe'"
    assert failed["metadata"]["status"] == "COMPLETED"
    # one step per model call: the call, then the answer
    assert [p["type"] for p in failed["parts"]] == ["step-start", "tool-lookup", "step-start", "text"]


def test_a_failing_turn_ends_the_stream_with_an_error(clients: Path, server: ApiServer) -> None:
    (failed,) = flow(clients, server, "failure")
    assert failed["status"] == "error" and "the model broke down" in failed["error"]


def test_a_dropped_connection_is_resumed_to_the_same_message_as_an_uninterrupted_client(
    clients: Path, server: ApiServer
) -> None:
    reconnect, after_end = flow(clients, server, "reconnect")
    # Given a stream cut after a few words
    assert reconnect["cut"] and reconnect["partial"]["status"] == "error"
    words = reconnect["partial"]["text"].split()
    assert 0 < len(words) < 12
    # When a reloaded page and the dropped client resume, both end with the whole answer,
    # without a gap or a repeat: the same parts as a client that never lost its connection
    whole = reconnect["uninterrupted"]
    assert whole["text"] == " ".join(f"word{n}" for n in range(1, 13))
    for resumed in (reconnect["reloaded"], reconnect["dropped"]):
        assert resumed["status"] == "ready" and resumed["messages"] == 2
        assert resumed["parts"] == whole["parts"]
        assert resumed["metadata"]["status"] == "COMPLETED"
    # After the turn ended, resuming finds nothing active (204) and changes nothing
    assert after_end["messages"] == 2 and after_end["status"] == "ready"


def test_a_server_killed_mid_answer_finishes_it_after_a_restart_and_a_resumed_page_shows_it_once(
    clients: Path, tmp_path: Path
) -> None:
    # Given an embedded server (its worker inside) streaming a long answer to a client
    serve = contextmanager(running_server)
    with serve(AGENTS, tmp_path, AGENT_RUNNER_API_KEYS=API_KEYS, AGENT_RUNNER_LEASE_TTL_S="2") as crashing:
        body = {"id": "c-crash", "messages": [_user("story 20", "first")]}
        with crashing.client(KEY_A) as client, client.stream("POST", CHAT, json=body) as response:
            deltas = 0
            for line in response.iter_lines():
                deltas += '"type":"text-delta"' in line
                if deltas == 3:
                    break
            # When the whole process is killed mid-answer and started again on the same database
            assert crashing.process is not None
            os.killpg(crashing.process.pid, signal.SIGKILL)
        crashing.process.wait(10)
        crashing.process = None
        crashing.start()
        # Then a page reloaded on the chat resumes it, and ends with the whole answer once
        (resumed,) = run_flow(
            clients, crashing, "aisdk_flows.mjs", "resume", env={"CHAT_ID": "c-crash", "TEXT": "story 20"}
        )
    assert resumed["status"] == "ready" and resumed["error"] is None, resumed
    assert resumed["text"] == " ".join(f"word{n}" for n in range(1, 21))
    assert [p["type"] for p in resumed["parts"]] == ["step-start", "text"]
    assert resumed["metadata"]["status"] == "COMPLETED"


def test_two_tenants_with_the_same_chat_id_never_meet(clients: Path, server: ApiServer) -> None:
    (tenants,) = flow(clients, server, "tenants", KEY_A, KEY_B)
    assert tenants["first"]["text"] == "Hello! You said from a."
    assert tenants["second"]["messages"] == 4  # b's chat: its own two turns
    # b's turn waits for approval in b's conversation; a's conversation has nothing active
    assert tenants["probeB"]["metadata"]["status"] == "WAITING_FOR_APPROVAL"
    assert tenants["probeA"]["messages"] == 2 and tenants["probeA"]["text"] == "Hello! You said from a."


# --- Bad input and the plain HTTP side ------------------------------------------------------------


def _user(text: str, message_id: str = "u1") -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] and error["message"] and isinstance(error["details"], list)
    return error


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"messages": [_user("hi")]}, "/id"),
        ({"id": "c-1", "messages": []}, "/messages"),
        ({"id": "bad id!", "messages": [_user("hi")]}, "/id"),
        ({"id": "c-1", "messages": [{"id": "u", "role": "robot", "parts": []}]}, "/messages/0/role"),
        ({"id": "c-1", "messages": [_user("   ")]}, "/messages/0/parts"),
        ({"id": "c-1", "messages": [_user("hi")], "trigger": "regenerate-message"}, "/trigger"),
    ],
)
def test_a_malformed_chat_body_is_a_422_with_details(server: ApiServer, body: dict[str, Any], path: str) -> None:
    with server.client(KEY_A) as client:
        error = _error(client.post(CHAT, json=body), 422)
    assert any(d["path"] == path for d in error["details"]), error


def test_unknown_agent_missing_key_and_busy_conversation_answer_in_the_api_error_shape(server: ApiServer) -> None:
    with server.client(KEY_A) as client:
        _error(client.post("/v1/agents/nobody/ai-sdk/chat", json={"id": "c-x", "messages": [_user("hi")]}), 404)
        with server.client() as anonymous:
            _error(anonymous.post(CHAT, json={"id": "c-x", "messages": [_user("hi")]}), 401)
        # A turn waiting for approval keeps the conversation busy: a new message is refused (if_busy=reject)
        with client.stream("POST", CHAT, json={"id": "c-busy", "messages": [_user("deploy db")]}) as first:
            assert first.status_code == 200 and b"tool-approval-request" in first.read()
        busy = _error(client.post(CHAT, json={"id": "c-busy", "messages": [_user("hello again", "u2")]}), 409)
        assert busy["active_turn_id"]
        # An assistant message that answers nothing the turn waits for is a 409 too
        unanswered = {"id": "u3", "role": "assistant", "parts": [{"type": "text", "text": "hm"}]}
        _error(client.post(CHAT, json={"id": "c-busy", "messages": [unanswered]}), 409)
        # The explicit stop cancels it; then nothing is active (204) and a new message starts a turn
        stopped = client.post(f"{CHAT}/c-busy/stop")
        assert stopped.status_code == 202 and stopped.json()["status"] == "CANCELLED"
        assert client.post(f"{CHAT}/c-busy/stop").status_code == 204
        assert client.get(f"{CHAT}/c-busy/stream").status_code == 204
        with client.stream("POST", CHAT, json={"id": "c-busy", "messages": [_user("hello again", "u2")]}) as again:
            assert again.status_code == 200 and b'"delta":" again."' in again.read()


def test_a_request_sent_twice_starts_one_turn(server: ApiServer) -> None:
    body = {"id": "c-twice", "messages": [_user("hello twice", "twice-1")]}
    with server.client(KEY_A) as client:
        first = client.post(CHAT, json=body)
        second = client.post(CHAT, json=body)
        keyed = client.post(CHAT, json={**body, "id": "c-keyed"}, headers={"Idempotency-Key": "k-1"})
        keyed_again = client.post(CHAT, json={**body, "id": "c-keyed"}, headers={"Idempotency-Key": "k-1"})
        turns = client.get("/v1/turns", params={"conversation_id": "c-twice"}).json()["items"]
        keyed_turns = client.get("/v1/turns", params={"conversation_id": "c-keyed"}).json()["items"]
    assert first.status_code == second.status_code == 200
    # The second answer replays the first turn (the cursors may differ: the live channel's
    # positions depend on when the stream read it; the chunks do not)
    assert chunks(first) == chunks(second) and chunks(first)[-1] == "data: [DONE]"
    assert len(turns) == 1 and len(keyed_turns) == 1
    assert keyed_again.headers.get("Idempotent-Replayed") is None  # a stream, not a recorded body
    assert chunks(keyed) == chunks(keyed_again)


def chunks(response: httpx.Response) -> list[str]:
    return [line for line in response.text.splitlines() if line.startswith("data: ")]


def _forget_answer(server: ApiServer, key: str) -> None:
    """Make the server's record of `key` look like an attempt that acted and died before recording its answer."""
    database = server.env["AGENT_RUNNER_DATABASE_URL"].removeprefix("sqlite:///")
    with sqlite3.connect(database) as connection:
        changed = connection.execute(
            "UPDATE agent_idempotency_keys SET status = 'IN_PROGRESS', response_status = NULL, response_body = NULL "
            "WHERE idempotency_key = ?",
            (key,),
        ).rowcount
    assert changed == 1


def test_a_keyed_decision_retried_after_its_answer_was_lost_streams_the_same_continuation(server: ApiServer) -> None:
    # Given a turn waiting for approval, and the chat's message approving it
    with server.client(KEY_A) as client:
        first = client.post(CHAT, json={"id": "c-keyed-decision", "messages": [_user("deploy web")]})
        assert '"type":"tool-approval-request"' in first.text
        turn_id = json.loads(chunks(first)[0].removeprefix("data: "))["messageId"]
        call_id = client.get(f"/v1/turns/{turn_id}").json()["suspension"]["correlation_id"]
        approval = {"id": call_id, "approved": True}
        part = {"type": "tool-deploy", "toolCallId": call_id, "state": "approval-responded", "approval": approval}
        answer = {"id": turn_id, "role": "assistant", "parts": [part]}
        body = {"id": "c-keyed-decision", "messages": [_user("deploy web"), answer]}
        headers = {"Idempotency-Key": "decision-1"}
        # When it is sent with a key, then again after the server lost its record of the answer
        decided = client.post(CHAT, json=body, headers=headers)
        _forget_answer(server, "decision-1")
        retried = client.post(CHAT, json=body, headers=headers)
        view = client.get(f"/v1/turns/{turn_id}").json()
    # Then the retry applied nothing twice and streamed the same continuation
    assert decided.status_code == retried.status_code == 200, retried.text
    assert chunks(decided) == chunks(retried)
    assert '"type":"tool-output-available"' in decided.text and '"delta":"deployed"' in decided.text
    assert view["status"] == "COMPLETED" and view["final_output"] == "deployed web"


def test_a_browser_token_for_one_conversation_chats_there_decides_as_its_user_and_reaches_nothing_else(
    server: ApiServer,
) -> None:
    with server.client(KEY_A) as client:
        minted = client.post("/v1/tokens", json={"user": "u-7", "conversation_id": "c-token"})
        assert minted.status_code in (200, 201), minted.text
        token = minted.json()["token"]
    with server.client(token) as browser:
        # The token's conversation: a turn waiting for approval, approved from the chat
        first = browser.post(CHAT, json={"id": "c-token", "messages": [_user("deploy docs")]})
        assert first.status_code == 200 and '"type":"tool-approval-request"' in first.text
        turn_id = json.loads(chunks(first)[0].removeprefix("data: "))["messageId"]
        call_id = browser.get(f"/v1/turns/{turn_id}").json()["suspension"]["correlation_id"]
        part = {
            "type": "tool-deploy",
            "toolCallId": call_id,
            "state": "approval-responded",
            "approval": {"id": call_id, "approved": True},
        }
        answer = {"id": turn_id, "role": "assistant", "parts": [part]}
        approved = browser.post(CHAT, json={"id": "c-token", "messages": [_user("deploy docs"), answer]})
        assert approved.status_code == 200 and '"delta":"deployed"' in approved.text
        cards = browser.get("/v1/conversations/c-token/messages").json()["items"]
        # Any other conversation is out of its reach, like an unknown one
        elsewhere = browser.post(CHAT, json={"id": "c-other", "messages": [_user("hello")]})
        reconnect = browser.get(f"{CHAT}/c-other/stream")
        stop = browser.post(f"{CHAT}/c-other/stop")
        ag_ui = browser.post(
            "/v1/agents/assistant/ag-ui",
            json={"threadId": "c-other", "runId": "r-1", "messages": [{"id": "m", "role": "user", "content": "hi"}]},
        )
    (card,) = [item for item in cards if item.get("action_id") == call_id]
    assert card["status"] == "APPROVED" and card["decided_by"] == "u-7"
    for refused in (elsewhere, reconnect, stop, ag_ui):
        _error(refused, 404)


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line.removeprefix("data: ")) for line in chunks(response) if line != "data: [DONE]"]


def _approve(client: httpx.Client, chat_id: str, *, request_reason: bool) -> list[dict[str, Any]]:
    """Start a deploy in `chat_id` and approve it as `ai` 7 (`request_reason`) or `ai` 6 sends it; the decision's chunks."""
    first = _events(client.post(CHAT, json={"id": chat_id, "messages": [_user("deploy shop")]}))
    (request,) = [c for c in first if c["type"] == "tool-approval-request"]
    assert request["reason"]  # what `ai` 7 keeps as the approval's `requestReason`
    call_id = request["toolCallId"]
    approval = {"id": call_id, **({"requestReason": request["reason"]} if request_reason else {}), "approved": True}
    part = {"type": "tool-deploy", "toolCallId": call_id, "state": "approval-responded", "approval": approval}
    answer = {"id": first[0]["messageId"], "role": "assistant", "parts": [part]}
    return _events(client.post(CHAT, json={"id": chat_id, "messages": [_user("deploy shop"), answer]}))


def test_decisions_are_streamed_as_approval_responses_only_to_clients_that_read_them(server: ApiServer) -> None:
    with server.client(KEY_A) as client:
        # Given the approval an `ai` 6 client sends (its chunk schema has no `tool-approval-response`)
        ai_6 = _approve(client, "c-dialect-6", request_reason=False)
        # And the one an `ai` 7 client sends (it kept the request's reason)
        ai_7 = _approve(client, "c-dialect-7", request_reason=True)
    # Then each hears of the decision in words it reads, and both get the call's result and the answer
    assert "tool-approval-response" not in [c["type"] for c in ai_6]
    assert [c for c in ai_7 if c["type"] == "tool-approval-response"][0]["approved"] is True
    for streamed in (ai_6, ai_7):
        assert any(c["type"] == "tool-output-available" and c["output"] == "deployed shop" for c in streamed)
        assert streamed[-1]["type"] == "finish" and streamed[-1]["messageMetadata"]["status"] == "COMPLETED"

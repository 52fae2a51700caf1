"""AG-UI's `HttpAgent` (@ag-ui/client) against a real server; every event checked against the `ag-ui-protocol` models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from ag_ui.core import RunAgentInput

from tests.clients.ag_ui_events import EVENTS, valid
from tests.clients.conftest import KEY_A, KEY_B
from tests.clients.node_flows import run_flow
from tests.helpers.api_server import ApiServer

pytestmark = pytest.mark.integration

RUN = "/v1/agents/assistant/ag-ui"


def flow(clients: Path, server: ApiServer, name: str, *keys: str) -> list[dict[str, Any]]:
    return run_flow(clients, server, "agui_flows.mjs", name, *keys)


def test_an_answer_streams_as_one_text_message_between_run_started_and_run_finished(
    clients: Path, server: ApiServer
) -> None:
    (answer,) = flow(clients, server, "answer")
    types = valid(answer)
    assert answer["error"] is None
    assert types[:3] == ["RUN_STARTED", "STEP_STARTED", "TEXT_MESSAGE_START"]
    assert types.count("TEXT_MESSAGE_CONTENT") == 4
    assert types[-3:] == ["TEXT_MESSAGE_END", "STEP_FINISHED", "RUN_FINISHED"]
    assert answer["outcome"] == {"type": "success"} and answer["result"] == "Hello! You said world."
    assert answer["text"] == "Hello! You said world."


def test_an_approval_interrupt_is_resumed_approved_and_rejected(clients: Path, server: ApiServer) -> None:
    requested_ok, answered_ok, requested_no, answered_no = flow(clients, server, "approval")
    for requested in (requested_ok, requested_no):
        types = valid(requested)
        assert types == ["RUN_STARTED", "STEP_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"] + [
            "STEP_FINISHED",
            "RUN_FINISHED",
        ]
        (interrupt,) = requested["outcome"]["interrupts"]
        assert requested["outcome"]["type"] == "interrupt" and interrupt["reason"] == "tool_approval"
        assert interrupt["toolCallId"] == interrupt["id"]
        assert interrupt["metadata"] == {"toolName": "deploy", "arguments": {"service": "billing"}}
        assert requested["pendingInterrupts"] == [interrupt]
    assert valid(answered_ok)[:2] == ["RUN_STARTED", "TOOL_CALL_RESULT"]
    assert answered_ok["outcome"] == {"type": "success"} and answered_ok["result"] == "deployed billing"
    assert valid(answered_no)[:2] == ["RUN_STARTED", "TOOL_CALL_RESULT"]
    assert answered_no["result"] == "not deployed: The user rejected this tool call: not on a Friday"
    assert answered_ok["pendingInterrupts"] == answered_no["pendingInterrupts"] == []


def test_a_form_interrupt_carries_the_frozen_schema_and_bad_data_is_refused_per_field(
    clients: Path, server: ApiServer
) -> None:
    requested, refused, filled = flow(clients, server, "form")
    valid(requested)
    (interrupt,) = requested["outcome"]["interrupts"]
    assert interrupt["reason"] == "form" and interrupt["metadata"]["formKey"] == "ticket_details"
    assert interrupt["responseSchema"]["required"] == ["system", "scope"]
    # Bad data: a 422 with a detail per field, and the interrupt is still open
    assert refused["error"].startswith("HTTP 422") and '"path":"/scope"' in refused["error"]
    assert '"path":"/system"' in refused["error"]
    assert valid(filled)[:2] == ["RUN_STARTED", "TOOL_CALL_RESULT"]
    assert filled["result"] == "ticket for vpn (ALL_USERS)"


def test_a_failing_turn_is_a_run_error(clients: Path, server: ApiServer) -> None:
    (failed,) = flow(clients, server, "failure")
    types = valid(failed)
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_ERROR"
    assert failed["runError"]["message"] == "ValueError: the model broke down"
    assert failed["runError"]["code"] == "FAILED"


def test_a_dropped_run_reconnects_with_a_snapshot_and_ends_like_an_uninterrupted_one(
    clients: Path, server: ApiServer
) -> None:
    (reconnect,) = flow(clients, server, "reconnect")
    # Given a run aborted after three words (the turn goes on on the server)
    assert reconnect["dropped"]["types"].count("TEXT_MESSAGE_CONTENT") == 3
    for event in reconnect["dropped"]["events"]:
        EVENTS.validate_python(event)
    # When the client runs again with nothing new, it gets the thread, then the rest of the turn
    again = reconnect["again"]
    types = valid(again)
    assert types[:2] == ["RUN_STARTED", "MESSAGES_SNAPSHOT"] and types[-1] == "RUN_FINISHED"
    whole = reconnect["uninterrupted"]
    valid(whole)
    words = " ".join(f"word{n}" for n in range(1, 13))
    assert again["text"] == whole["text"] == words and again["result"] == words
    # Then the client holds the same conversation as one that never lost its connection
    assert [(m["role"], m.get("content")) for m in again["messages"]] == [
        (m["role"], m.get("content")) for m in whole["messages"]
    ]


def test_stop_cancels_the_turn_and_the_run_finishes_cancelled(clients: Path, server: ApiServer) -> None:
    (stopped,) = flow(clients, server, "stop")
    assert stopped["stopStatus"] == 202
    types = valid(stopped)
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
    assert stopped["outcome"] == {"type": "cancelled"}


def test_two_tenants_with_the_same_thread_id_never_meet(clients: Path, server: ApiServer) -> None:
    (tenants,) = flow(clients, server, "tenants", KEY_A, KEY_B)
    assert tenants["first"]["result"] == "Hello! You said from a."
    assert tenants["second"]["outcome"]["type"] == "interrupt"
    probed = tenants["probed"]
    types = valid(probed)
    # a's reconnect: a's own thread only, finished, with no interrupt of b's
    assert types == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    snapshot = probed["events"][1]["messages"]
    assert [m["content"] for m in snapshot] == ["hello from a", "Hello! You said from a."]
    assert probed["outcome"] == {"type": "success"}
    # b's reconnect: b's thread, and the interrupt b's turn still waits for
    probed_b = tenants["probedB"]
    assert valid(probed_b) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    assert [m["role"] for m in probed_b["events"][1]["messages"]] == ["user", "assistant"]
    assert probed_b["outcome"] == tenants["second"]["outcome"]


# --- The raw stream and bad input ------------------------------------------------------------------


def _input(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"threadId": "t-raw", "runId": "r-1", "messages": [], "state": {}, "tools": []}
    body.update(fields)
    body.setdefault("context", [])
    body.setdefault("forwardedProps", {})
    RunAgentInput.model_validate(body)  # what is sent is a valid RunAgentInput
    return body


def test_the_raw_stream_is_sse_of_valid_events(server: ApiServer) -> None:
    body = _input(threadId="t-raw", messages=[{"id": "m1", "role": "user", "content": "hello raw"}])
    with server.client(KEY_A) as client:
        with client.stream("POST", RUN, json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    events = [EVENTS.validate_json(line.removeprefix("data: ")) for line in lines]
    assert events[0].type == "RUN_STARTED" and events[0].run_id == "r-1" and events[0].thread_id == "t-raw"
    assert events[-1].type == "RUN_FINISHED" and events[-1].result == "Hello! You said raw."


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"runId": "r", "messages": []}, "/threadId"),
        ({"threadId": "bad id!", "runId": "r", "messages": []}, "/threadId"),
        ({"threadId": "t", "runId": "r", "messages": [{"id": "m", "role": "robot"}]}, "/messages/0/role"),
        (
            {"threadId": "t-422", "runId": "r", "messages": [{"id": "m", "role": "user", "content": "  "}]},
            "/messages/0/content",
        ),
        (
            {"threadId": "t", "runId": "r", "messages": [], "resume": [{"interruptId": "x", "status": "maybe"}]},
            "/resume/0/status",
        ),
    ],
)
def test_a_malformed_run_input_is_a_422_with_details(server: ApiServer, body: dict[str, Any], path: str) -> None:
    with server.client(KEY_A) as client:
        response = client.post(RUN, json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert any(d["path"] == path for d in error["details"]), error


def test_busy_threads_bad_resumes_and_missing_keys_answer_in_the_api_error_shape(server: ApiServer) -> None:
    waiting = _input(threadId="t-busy", messages=[{"id": "m1", "role": "user", "content": "deploy db"}])
    with server.client(KEY_A) as client:
        with client.stream("POST", RUN, json=waiting) as first:
            assert b'"type":"interrupt"' in first.read()
        newer = _input(threadId="t-busy", messages=[{"id": "m2", "role": "user", "content": "hello again"}])
        busy = client.post(RUN, json=newer)
        assert busy.status_code == 409 and busy.json()["error"]["active_turn_id"]
        wrong = _input(threadId="t-busy", resume=[{"interruptId": "no-such-call", "status": "resolved"}])
        assert client.post(RUN, json=wrong).status_code == 409
        bad = client.get(f"/v1/turns/{busy.json()['error']['active_turn_id']}").json()["suspension"]
        bad_payload = _input(
            threadId="t-busy", resume=[{"interruptId": bad["correlation_id"], "status": "resolved", "payload": 3}]
        )
        malformed = client.post(RUN, json=bad_payload)
        assert malformed.status_code == 422 and malformed.json()["error"]["details"][0]["path"] == "/resume/0/payload"
        assert client.post("/v1/agents/nobody/ag-ui", json=newer).status_code == 404
        with httpx.Client(base_url=server.url) as anonymous:
            assert anonymous.post(RUN, json=newer).status_code == 401
        assert client.post(f"{RUN}/t-busy/stop").status_code == 202
        assert client.post(f"{RUN}/t-busy/stop").status_code == 204


def _events(response: httpx.Response) -> list[Any]:
    return [
        EVENTS.validate_json(line.removeprefix("data: ")) for line in response.iter_lines() if line.startswith("data: ")
    ]


def test_a_form_interrupt_answered_cancelled_stops_the_turn(server: ApiServer) -> None:
    asked = _input(threadId="t-form-cancel", messages=[{"id": "m1", "role": "user", "content": "ticket"}])
    with server.client(KEY_A) as client:
        with client.stream("POST", RUN, json=asked) as response:
            (interrupt,) = _events(response)[-1].outcome.interrupts
        assert interrupt.reason == "form"
        cancel = _input(threadId="t-form-cancel", resume=[{"interruptId": interrupt.id, "status": "cancelled"}])
        with client.stream("POST", RUN, json=cancel) as response:
            events = _events(response)
        turns = client.get("/v1/turns", params={"conversation_id": "t-form-cancel"}).json()["items"]
    assert events[0].type == "RUN_STARTED" and events[-1].type == "RUN_FINISHED"
    assert events[-1].outcome.type == "cancelled"
    assert [t["status"] for t in turns] == ["CANCELLED"]

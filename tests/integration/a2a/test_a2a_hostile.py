"""Hostile JSON-RPC requests get typed JSON-RPC errors: never a 500, never another tenant's data."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.helpers.api_server import ApiServer
from tests.integration.a2a.conftest import KEY_A, KEY_B

pytestmark = pytest.mark.integration


def post(server: ApiServer, body: Any, key: str = KEY_A, *, raw: bytes | None = None) -> httpx.Response:
    with server.client(key) as client:
        if raw is not None:
            return client.post("/a2a/desk", content=raw, headers={"Content-Type": "application/json"})
        return client.post("/a2a/desk", json=body)


def error_code(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["jsonrpc"] == "2.0" and "result" not in body, body
    code: int = body["error"]["code"]
    return code


def send_params(*parts: dict[str, Any], **ids: str) -> dict[str, Any]:
    return {"message": {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": list(parts), **ids}}


def rpc(method: str, params: Any, request_id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def test_malformed_requests_are_parse_or_request_errors(server: ApiServer) -> None:
    assert error_code(post(server, None, raw=b"{not json")) == -32700
    assert error_code(post(server, [1, 2])) == -32600
    assert error_code(post(server, {"jsonrpc": "1.0", "method": "GetTask", "id": 1})) == -32600
    assert error_code(post(server, {"jsonrpc": "2.0", "method": "GetTask", "id": {"x": 1}})) == -32600
    assert error_code(post(server, rpc("GetTask", [1]))) == -32602
    assert error_code(post(server, rpc("GetTask", {"id": 7}))) == -32602


def test_unknown_methods_and_push_configs_are_typed(server: ApiServer) -> None:
    assert error_code(post(server, rpc("tasks/doSomething", {}))) == -32601
    assert error_code(post(server, rpc("CreateTaskPushNotificationConfig", {"taskId": "x"}))) == -32003


def test_bad_messages_are_invalid_params(server: ApiServer) -> None:
    assert error_code(post(server, rpc("SendMessage", {"message": "hi"}))) == -32602
    assert error_code(post(server, rpc("SendMessage", send_params()))) == -32602
    too_many = [{"text": "x"}] * 65
    assert error_code(post(server, rpc("SendMessage", send_params(*too_many)))) == -32602
    assert error_code(post(server, rpc("SendMessage", send_params({"text": "x" * 200_001})))) == -32602
    nested: Any = {"leaf": 1}
    for _ in range(30):
        nested = {"inner": nested}
    assert error_code(post(server, rpc("SendMessage", send_params({"text": "hi"}, {"data": nested})))) == -32602
    assert error_code(post(server, rpc("SendMessage", send_params({"url": "file:///etc/passwd"})))) == -32602
    # Past what any route takes (1 MiB, 64 levels): refused before parsing, still as JSON-RPC errors.
    assert error_code(post(server, None, raw=b"[" * 100_000 + b"]" * 100_000)) == -32600
    assert error_code(post(server, rpc("SendMessage", send_params({"text": "x" * 1_100_000})))) == -32600
    assert error_code(post(server, rpc("SendMessage", send_params({"text": "hi"}, contextId="../../etc")))) == -32602


def test_another_tenants_task_is_not_found(server: ApiServer) -> None:
    started = post(server, rpc("SendMessage", send_params({"text": "private"})), KEY_A).json()
    task_id = started["result"]["task"]["id"]
    for method in ("GetTask", "CancelTask", "SubscribeToTask"):
        answer = post(server, rpc(method, {"id": task_id}), KEY_B)
        assert error_code(answer) == -32001
        assert "private" not in answer.text
    answered = post(server, rpc("SendMessage", send_params({"text": "hi"}, taskId=task_id)), KEY_B)
    assert error_code(answered) == -32001


def test_requests_without_a_valid_key_are_refused(server: ApiServer) -> None:
    with httpx.Client(base_url=server.url) as anonymous:
        assert anonymous.post("/a2a/desk", json=rpc("GetTask", {"id": "x"})).status_code == 401
    assert post(server, rpc("GetTask", {"id": "x"}), "not-a-key").status_code == 401


def test_a_message_sent_again_answers_the_same_task(server: ApiServer) -> None:
    params = send_params({"text": "only once"})
    first = post(server, rpc("SendMessage", params)).json()["result"]["task"]
    again = post(server, rpc("SendMessage", params)).json()["result"]["task"]
    assert again["id"] == first["id"] and again["contextId"] == first["contextId"]
    assert again["status"]["state"] == "TASK_STATE_COMPLETED"
    # A message that would start a second turn in a context whose turn waits for a person is refused.
    waiting = post(server, rpc("SendMessage", send_params({"text": "ticket"}))).json()["result"]["task"]
    assert waiting["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    busy = post(server, rpc("SendMessage", send_params({"text": "more"}, contextId=waiting["contextId"])))
    assert error_code(busy) == -32602 and waiting["id"] in busy.text

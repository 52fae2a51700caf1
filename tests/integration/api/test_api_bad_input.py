"""Bad input never reaches a route or the database: 4xx in the error shape, never a 500, nothing changed."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.api_server import ApiServer
from tests.integration.api.api_server import blocked, database_state, serve, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def database_url(server_dir: Path) -> str:
    return f"sqlite:///{server_dir / 'bad-input.db'}"


@pytest.fixture(scope="module")
def server(server_dir: Path, database_url: str) -> Iterator[ApiServer]:
    yield from serve(server_dir, database_url)


@pytest.fixture(scope="module")
def waiting(server: ApiServer) -> dict[str, Any]:
    """A turn waiting for its form, so that resumes have a real target."""
    with server.client() as client:
        created = client.post("/v1/turns", json={"agent_id": "desk", "input": "ticket", "conversation_id": "c-bad"})
        return wait_for(client, created.json()["id"], blocked)


def nested(depth: int) -> str:
    return '{"agent_id": "desk", "input": "x", "metadata": {"a": ' + "[" * depth + "]" * depth + "}}"


START_BODIES: list[tuple[str, bytes | str]] = [
    ("malformed", '{"agent_id": "desk", "input": '),
    ("trailing garbage", '{"agent_id": "desk", "input": "x"} x'),
    ("array", "[]"),
    ("string", '"desk"'),
    ("null", "null"),
    ("number", "1"),
    ("empty object", "{}"),
    ("empty body", ""),
    ("agent id a number", '{"agent_id": 5, "input": "x"}'),
    ("input a number", '{"agent_id": "desk", "input": 5}'),
    ("input empty", '{"agent_id": "desk", "input": ""}'),
    ("input an object", '{"agent_id": "desk", "input": {"text": "x"}}'),
    ("metadata a string", '{"agent_id": "desk", "input": "x", "metadata": "x"}'),
    ("metadata a list", '{"agent_id": "desk", "input": "x", "metadata": []}'),
    ("if_busy unknown", '{"agent_id": "desk", "input": "x", "if_busy": "maybe"}'),
    ("if_busy upper case", '{"agent_id": "desk", "input": "x", "if_busy": "REJECT"}'),
    ("unknown field", '{"agent_id": "desk", "input": "x", "priority": 1}'),
    ("agent id too long", '{"agent_id": "' + "a" * 129 + '", "input": "x"}'),
    ("agent id with a space", '{"agent_id": "de sk", "input": "x"}'),
    ("agent id with a slash", '{"agent_id": "a/b", "input": "x"}'),
    ("agent id not ascii", '{"agent_id": "d\\u00e9sk", "input": "x"}'),
    ("agent id empty", '{"agent_id": "", "input": "x"}'),
    ("conversation id with dots and slash", '{"agent_id": "desk", "input": "x", "conversation_id": "../x"}'),
    ("conversation id too long", '{"agent_id": "desk", "input": "x", "conversation_id": "' + "c" * 129 + '"}'),
    ("conversation id a number", '{"agent_id": "desk", "input": "x", "conversation_id": 7}'),
    ("nested 65 deep", nested(65)),
    ("nested 100000 deep", nested(100_000)),
    ("lone high surrogate", '{"agent_id": "desk", "input": "\\ud800"}'),
    ("lone low surrogate in a key", '{"agent_id": "desk", "input": "x", "metadata": {"\\udc00": 1}}'),
    ("NUL character", '{"agent_id": "desk", "input": "a\\u0000b"}'),
    ("NaN", '{"agent_id": "desk", "input": "x", "metadata": {"n": NaN}}'),
    ("Infinity", '{"agent_id": "desk", "input": "x", "metadata": {"n": -Infinity}}'),
    ("float overflow", '{"agent_id": "desk", "input": "x", "metadata": {"n": 1e400}}'),
    ("integer of 5000 digits", '{"agent_id": "desk", "input": "x", "metadata": {"n": ' + "9" * 5000 + "}}"),
    ("invalid UTF-8", b'{"agent_id": "desk", "input": "\xff\xfe"}'),
    ("agent id a boolean", '{"agent_id": true, "input": "x"}'),
]


@pytest.mark.parametrize("body", [b for _, b in START_BODIES], ids=[name for name, _ in START_BODIES])
def test_bad_start_requests_are_422_and_change_nothing(
    server: ApiServer, waiting: dict[str, Any], database_url: str, body: bytes | str
) -> None:
    before = database_state(database_url)
    with server.client() as client:
        response = client.post("/v1/turns", content=body, headers={"Content-Type": "application/json"})
    assert_rejected(response, 422)
    assert database_state(database_url) == before


def resume_bodies(call: str) -> list[tuple[str, str]]:
    bodies: list[tuple[str, dict[str, Any] | list[Any]]] = [
        ("unknown action", {"action": "jump"}),
        ("action missing", {"tool_call_id": call}),
        ("data not an object", {"action": "form", "tool_call_id": call, "data": [1]}),
        ("data missing", {"action": "form", "tool_call_id": call}),
        ("call id bad", {"action": "form", "tool_call_id": "c 1", "data": {}}),
        ("form data failing the schema", {"action": "form", "tool_call_id": call, "data": {"system": 1}}),
        ("extra field for approve", {"action": "approve", "tool_call_id": call, "data": {}}),
        ("unknown field", {"action": "retry", "when": "now"}),
        ("metadata not an object", {"action": "retry", "metadata": 1}),
        ("reason a number", {"action": "reject", "tool_call_id": call, "reason": 1}),
        ("a list", [{"action": "retry"}]),
    ]
    return [(name, json.dumps(body)) for name, body in bodies]


def test_bad_resume_and_cancel_requests_are_422_and_change_nothing(
    server: ApiServer, waiting: dict[str, Any], database_url: str
) -> None:
    call = waiting["suspension"]["correlation_id"]
    before = database_state(database_url)
    with server.client() as client:
        for name, body in resume_bodies(call):
            response = client.post(
                f"/v1/turns/{waiting['id']}/resume", content=body, headers={"Content-Type": "application/json"}
            )
            assert_rejected(response, 422, name)
        for body in ('{"reason": 5}', '{"why": "x"}', "[]", '{"reason": ""}'):
            response = client.post(
                f"/v1/turns/{waiting['id']}/cancel", content=body, headers={"Content-Type": "application/json"}
            )
            assert_rejected(response, 422, body)
    assert database_state(database_url) == before
    with server.client() as client:
        assert client.get(f"/v1/turns/{waiting['id']}").json()["status"] == "WAITING_FOR_USER"


def test_metadata_and_form_data_over_their_limits_are_422_with_details(
    server: ApiServer, waiting: dict[str, Any], database_url: str
) -> None:
    # Given bodies under the 1 MiB the server reads, but over the runner's input limits
    call = waiting["suspension"]["correlation_id"]
    big_metadata = {"agent_id": "desk", "input": "x", "metadata": {"note": "m" * (70 * 1024)}}
    big_form = {"action": "form", "tool_call_id": call, "data": {"system": "f" * (300 * 1024)}}
    big_resume_metadata = {"action": "retry", "metadata": {"note": "m" * (70 * 1024)}}
    before = database_state(database_url)
    with server.client() as client:
        answers = [
            (client.post("/v1/turns", json=big_metadata), "/metadata"),
            (client.post(f"/v1/turns/{waiting['id']}/resume", json=big_form), "/data"),
            (client.post(f"/v1/turns/{waiting['id']}/resume", json=big_resume_metadata), "/metadata"),
        ]
    # Then each is a 422 that says where, what is allowed and what was found
    for response, pointer in answers:
        assert_rejected(response, 422, pointer)
        error = response.json()["error"]
        assert error["type"] == "InputLimitError"
        [detail] = error["details"]
        assert detail["path"] == pointer and detail["limit"].endswith("bytes") and detail["found"], detail
    assert database_state(database_url) == before


BAD_URLS = [
    ("GET", "/v1/turns/" + "t" * 129),
    ("GET", "/v1/turns/bad%20id"),
    ("GET", "/v1/turns/nul%00"),
    ("GET", "/v1/turns/%ED%A0%80"),
    ("GET", "/v1/turns/%FF"),
    ("POST", "/v1/turns/bad%20id/cancel"),
    ("POST", "/v1/turns/" + "t" * 129 + "/resume"),
    ("GET", "/v1/turns?limit=abc"),
    ("GET", "/v1/turns?limit=-1"),
    ("GET", "/v1/turns?limit=100000"),
    ("GET", "/v1/turns?status=bogus"),
    ("GET", "/v1/turns?conversation_id=a%2Fb"),
    ("GET", "/v1/turns?cursor=%%%"),
    ("GET", "/v1/turns?cursor=" + "A" * 600),
    ("GET", "/v1/turns/x?messages=maybe"),
    ("GET", "/v1/conversations/bad%20id/messages"),
    ("GET", "/v1/conversations/c-bad/messages?limit=0"),
    ("GET", "/v1/conversations/c-bad/messages?before=a%20b"),
]


@pytest.mark.parametrize(("method", "url"), BAD_URLS, ids=[f"{m} {u[:60]}" for m, u in BAD_URLS])
def test_bad_ids_and_query_parameters_are_4xx(
    server: ApiServer, waiting: dict[str, Any], database_url: str, method: str, url: str
) -> None:
    before = database_state(database_url)
    with server.client() as client:
        response = client.request(method, url, json={"action": "retry"} if url.endswith("/resume") else None)
    assert_rejected(response, 422)
    assert database_state(database_url) == before


def test_bodies_over_one_mebibyte_are_413_also_when_chunked(server: ApiServer, database_url: str) -> None:
    before = database_state(database_url)
    big = '{"agent_id": "desk", "input": "' + "x" * (1024 * 1024) + '"}'
    with server.client() as client:
        assert_rejected(client.post("/v1/turns", content=big, headers={"Content-Type": "application/json"}), 413)

        def chunks() -> Iterator[bytes]:
            yield b'{"agent_id": "desk", "input": "'
            for _ in range(40):
                yield b"y" * 32768
            yield b'"}'

        chunked = client.post("/v1/turns", content=chunks(), headers={"Content-Type": "application/json"})
        assert_rejected(chunked, 413)
        # Just under the limit is fine for the guard (the agent answers it)
        fits = client.post("/v1/turns", json={"agent_id": "nobody", "input": "z" * (1024 * 1024 - 100)})
        assert_rejected(fits, 404)
    assert database_state(database_url) == before


def test_other_content_types_and_methods_are_4xx(server: ApiServer, database_url: str) -> None:
    before = database_state(database_url)
    with server.client() as client:
        text = client.post(
            "/v1/turns", content='{"agent_id": "desk", "input": "x"}', headers={"Content-Type": "text/plain"}
        )
        assert 400 <= text.status_code < 500, text.text
        form = client.post("/v1/turns", data={"agent_id": "desk", "input": "x"})
        assert 400 <= form.status_code < 500, form.text
        put = client.put("/v1/turns", json={})
        assert_rejected(put, 405)
        # Allow names every method of the path, though GET and POST are two routes
        assert put.headers["allow"] == "GET, HEAD, POST"
        assert_rejected(client.patch("/v1/turns/x", json={}), 405)
        assert client.get("/runs/crons/search").headers["allow"] == "POST"
    assert database_state(database_url) == before


BAD_BODIES: list[tuple[str, bytes]] = [("empty", b""), ("not JSON", b"{not json"), ("null", b"null")]


def body_operations(document: dict[str, Any]) -> list[tuple[str, str, bool, bool]]:
    """Every operation of the OpenAPI document that can carry a body: method, path, whether it needs one,
    and whether it is a JSON-RPC endpoint (`x-jsonrpc`), whose refusals are JSON-RPC error answers."""
    operations = []
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            if method in ("post", "put", "patch"):
                needs_body = bool(operation.get("requestBody", {}).get("required", False))
                operations.append((method.upper(), path, needs_body, bool(operation.get("x-jsonrpc"))))
    return operations


def is_json_rpc_refusal(response: httpx.Response) -> bool:
    """A JSON-RPC 2.0 error answer to a body that is no request: a parse error or an invalid request."""
    try:
        answer = response.json()
    except ValueError:
        return False
    return (
        response.status_code == 200
        and answer.get("jsonrpc") == "2.0"
        and "result" not in answer
        and answer["error"]["code"] in (-32700, -32600)
    )


def test_empty_non_json_and_null_bodies_are_4xx_on_every_route(server: ApiServer, database_url: str) -> None:
    # Given every route of the server that can take a body, read from its OpenAPI document
    with server.client() as client:
        operations = body_operations(client.get("/openapi.json").json())
        assert ("PATCH", "/runs/crons/{cron_id}") in {(method, path) for method, path, _, _ in operations}
        before = database_state(database_url)
        problems = []
        for method, path, needs_body, json_rpc in operations:
            # Ids of the right shape that name nothing: the body is judged before any lookup
            url = re.sub(r"\{[^}]+\}", "missing-1", path)
            for name, body in BAD_BODIES:
                # When it is sent an empty body, one that is not JSON, or JSON null
                try:
                    response = client.request(method, url, content=body, headers={"Content-Type": "application/json"})
                except httpx.TransportError as exc:
                    problems.append(f"{method} {path} ({name}): the connection failed: {exc!r}")
                    continue
                if json_rpc:
                    # Then a JSON-RPC endpoint answers with a JSON-RPC error, as its protocol says
                    if not is_json_rpc_refusal(response):
                        problems.append(f"{method} {path} ({name}): {response.status_code} {response.text[:200]}")
                    continue
                # Then a body it needs, and any body that is not JSON, is refused with a 4xx
                # in the error shape; a route whose body is optional may take an empty or
                # null one, and one the server does not offer says so (501), but none fails
                refused = 400 <= response.status_code < 500
                unsupported = response.status_code == 501 and not needs_body
                if ((needs_body or name == "not JSON") and not refused) or (
                    response.status_code >= 500 and not unsupported
                ):
                    problems.append(f"{method} {path} ({name}): {response.status_code} {response.text[:200]}")
                elif response.status_code >= 400 and not is_error_shape(response):
                    problems.append(f"{method} {path} ({name}): not the error shape: {response.text[:200]}")
    assert problems == [], "\n".join(problems)
    assert database_state(database_url) == before


def is_error_shape(response: httpx.Response) -> bool:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error["type"], str) and bool(error["message"]) and isinstance(error["details"], list)


def assert_rejected(response: httpx.Response, status: int, what: str = "") -> None:
    assert response.status_code == status, (what, response.status_code, response.text[:500])
    error = response.json()["error"]
    assert isinstance(error["type"], str) and error["message"] and isinstance(error["details"], list), what

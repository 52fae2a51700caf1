"""Short-lived tokens of `POST /v1/tokens` over real HTTP: accepted wherever a key is, scoped, and signed."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.api_server import ApiServer
from tests.integration.api.api_server import (
    assert_error,
    blocked,
    database_state,
    read_stream,
    serve,
    status_is,
    wait_for,
)

pytestmark = pytest.mark.integration

KEY_A = "key-a-tokens-0123456789"
KEY_B = "key-b-tokens-9876543210"
SECRET = "0123456789abcdef0123456789abcdef-test-secret"


@pytest.fixture(scope="module")
def database_url(server_dir: Path) -> str:
    return f"sqlite:///{server_dir / 'tokens.db'}"


@pytest.fixture(scope="module")
def server(server_dir: Path, database_url: str) -> Iterator[ApiServer]:
    yield from serve(
        server_dir,
        database_url,
        AGENT_RUNNER_API_KEYS=f"tenant-a:{KEY_A},tenant-b:{KEY_B}",
        AGENT_RUNNER_TOKEN_SECRET=SECRET,
    )


def mint(server: ApiServer, key: str, **body: Any) -> dict[str, Any]:
    with server.client(key) as client:
        response = client.post("/v1/tokens", json=body)
    assert response.status_code == 201, response.text
    minted: dict[str, Any] = response.json()
    return minted


def start(client: httpx.Client, text: str, chat: str | None) -> dict[str, Any]:
    response = client.post("/v1/turns", json={"agent_id": "desk", "input": text, "conversation_id": chat})
    assert response.status_code == 201, response.text
    view: dict[str, Any] = response.json()
    return view


def chat_id() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


def test_a_token_is_minted_with_a_key_and_works_like_the_key(server: ApiServer) -> None:
    minted = mint(server, KEY_A, user="u-alice", expires_in=120)
    assert (minted["token_type"], minted["user"], minted["conversation_id"], minted["expires_in"]) == (
        "Bearer",
        "u-alice",
        None,
        120,
    )
    remaining = (datetime.fromisoformat(minted["expires_at"]) - datetime.now(UTC)).total_seconds()
    assert 100 <= remaining <= 121
    with server.client(minted["token"]) as as_user, server.client(KEY_A) as as_key:
        turn = start(as_user, "hello", chat_id())
        assert as_key.get(f"/v1/turns/{turn['id']}").status_code == 200
        assert as_user.get(f"/v1/turns/{turn['id']}").status_code == 200
        assert as_user.get("/v1/agents").status_code == 200
    # Tenant isolation holds for tokens: B's token does not see A's turn
    with server.client(mint(server, KEY_B, user="u-bob")["token"]) as bob:
        assert_error(bob.get(f"/v1/turns/{turn['id']}"), 404, "TurnNotFound")
        assert bob.get("/v1/turns").json()["items"] == []


def test_a_conversation_token_reaches_that_conversation_alone_and_mints_nothing(
    server: ApiServer, database_url: str
) -> None:
    mine, other = chat_id(), chat_id()
    with server.client(KEY_A) as key:
        elsewhere = wait_for(key, start(key, "ticket", other)["id"], blocked)
    token = mint(server, KEY_A, user="u-alice", conversation_id=mine)["token"]
    with server.client(token) as scoped:
        # Its own conversation: start (also without naming it), read, list, stream
        turn = start(scoped, "hello", mine)
        assert turn["conversation_id"] == mine
        wait_for(scoped, turn["id"], blocked)
        unnamed = start(scoped, "again", None)
        assert unnamed["conversation_id"] == mine
        wait_for(scoped, unnamed["id"], blocked)
        assert {t["id"] for t in scoped.get("/v1/turns").json()["items"]} == {turn["id"], unnamed["id"]}
        assert scoped.get(f"/v1/conversations/{mine}/messages").json()["items"]
        _, events = read_stream(scoped, f"/v1/turns/{turn['id']}/events")
        assert events[-1]["event"] == "end"
        # Anything else of the same tenant: 404 like another tenant's, and nothing changes
        before = database_state(database_url)
        call = elsewhere["suspension"]
        for response in (
            scoped.get(f"/v1/turns/{elsewhere['id']}"),
            scoped.post(f"/v1/turns/{elsewhere['id']}/cancel"),
            scoped.post(
                f"/v1/turns/{elsewhere['id']}/resume",
                json={
                    "action": "form",
                    "tool_call_id": call["correlation_id"],
                    "data": {"system": "db", "scope": "ONE_USER"},
                },
            ),
            scoped.get(f"/v1/turns/{elsewhere['id']}/events", params={"follow": "false"}),
        ):
            assert_error(response, 404, "TurnNotFound")
        for response in (
            scoped.get(f"/v1/conversations/{other}/messages"),
            scoped.get(f"/v1/conversations/{other}/events", params={"follow": "false"}),
            scoped.post("/v1/turns", json={"agent_id": "desk", "input": "x", "conversation_id": other}),
        ):
            assert_error(response, 404, "ConversationNotFound")
        assert scoped.get("/v1/turns", params={"conversation_id": other}).json()["items"] == []
        assert database_state(database_url) == before
        # No token mints tokens, scoped or not
        assert_error(scoped.post("/v1/tokens", json={"user": "u-mallory"}), 403, "TokenNotAllowed")
    with server.client(mint(server, KEY_A, user="u-alice")["token"]) as unscoped:
        assert_error(unscoped.post("/v1/tokens", json={"user": "u-mallory"}), 403, "TokenNotAllowed")


def test_a_resume_made_with_a_token_records_its_user_as_the_decider(server: ApiServer) -> None:
    chat = chat_id()
    token = mint(server, KEY_A, user="u-carol", conversation_id=chat)["token"]
    with server.client(token) as carol:
        turn = start(carol, "ticket", chat)
        form = wait_for(carol, turn["id"], blocked)["suspension"]
        data = {"system": "vpn", "scope": "ALL_USERS"}
        resumed = carol.post(
            f"/v1/turns/{turn['id']}/resume",
            json={"action": "form", "tool_call_id": form["correlation_id"], "data": data},
        )
        assert resumed.status_code == 202, resumed.text
        approval = wait_for(carol, turn["id"], status_is("WAITING_FOR_APPROVAL"))["suspension"]
        # The client claims to be someone else: the token's user is recorded all the same
        approve = {
            "action": "approve",
            "tool_call_id": approval["correlation_id"],
            "metadata": {"decided_by": "u-mallory", "approverId": "u-mallory"},
        }
        assert carol.post(f"/v1/turns/{turn['id']}/resume", json=approve).status_code == 202
        assert wait_for(carol, turn["id"], blocked)["status"] == "COMPLETED"
        cards = [
            m for m in carol.get(f"/v1/conversations/{chat}/messages").json()["items"] if m["role"] == "agent_action"
        ]
        assert [(c["status"], c["decided_by"]) for c in cards] == [("APPROVED", "u-carol")]


def test_a_stream_takes_a_token_in_the_query_but_never_a_key(server: ApiServer) -> None:
    chat = chat_id()
    with server.client(KEY_A) as key:
        turn = start(key, "hello", chat)
        wait_for(key, turn["id"], blocked)
    token = mint(server, KEY_A, user="u-dave", conversation_id=chat, expires_in=60)["token"]
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        # What EventSource does: no header, the token in the URL
        _, events = read_stream(browser, f"/v1/turns/{turn['id']}/events", params={"access_token": token})
        assert events[-1]["event"] == "end" and "TURN_COMPLETED" in [e["event"] for e in events]
        _, conversation = read_stream(
            browser,
            f"/v1/conversations/{chat}/events",
            params={"access_token": token, "follow": "false"},
            until_end=False,
        )
        assert {e["data"]["turn_id"] for e in conversation} == {turn["id"]}
        assert browser.get(f"/v1/turns/{turn['id']}", params={"access_token": token}).status_code == 200
        # A key is never taken from the URL
        error = assert_error(browser.get("/v1/agents", params={"access_token": KEY_A}), 401, "Unauthorized")
        assert "access_token" in error["message"]
        # Whatever the route family answers, its request line is logged the same way
        browser.get("/a2a/any-agent/.well-known/agent-card.json", params={"access_token": token})
    # Neither the key nor the token is written to the access log, which shows the requests
    log = server.log.read_text(errors="replace")
    assert "access_token=***" in log and f"/v1/turns/{turn['id']}/events?access_token=***" in log
    assert "/a2a/any-agent/.well-known/agent-card.json?access_token=***" in log
    assert KEY_A not in log and token not in log and token.split(".")[1] not in log


def test_a_token_verifies_on_every_server_process_with_the_same_secret(
    server: ApiServer, database_url: str, tmp_path: Path
) -> None:
    with server.client(KEY_A) as key:
        turn = start(key, "hello", chat_id())
    token = mint(server, KEY_A, user="u-frank")["token"]
    # A second process of the deployment: same database, keys and secret, nothing shared in memory
    for replica in serve(
        tmp_path,
        database_url,
        ["--worker", "none"],
        AGENT_RUNNER_API_KEYS=f"tenant-a:{KEY_A}",
        AGENT_RUNNER_TOKEN_SECRET=SECRET,
    ):
        with replica.client(token) as frank:
            assert frank.get(f"/v1/turns/{turn['id']}").json()["id"] == turn["id"]


def _tampered(token: str) -> list[str]:
    prefix, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["t"] = "tenant-b"
    forged_payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    flipped = signature[:-2] + ("AA" if signature[-2:] != "AA" else "BB")
    return [
        f"{prefix}.{forged_payload}.{signature}",
        f"{prefix}.{payload}.{flipped}",
        f"{prefix}.{payload}",
        token + "x",
    ]


def test_expired_and_forged_tokens_are_401(server: ApiServer, tmp_path: Path) -> None:
    turn_token = mint(server, KEY_A, user="u-erin", expires_in=1)["token"]
    for forged in _tampered(mint(server, KEY_A, user="u-erin")["token"]):
        for headers, params in (({"Authorization": f"Bearer {forged}"}, {}), ({}, {"access_token": forged})):
            response = httpx.get(f"{server.url}/v1/turns", headers=headers, params=params, timeout=10)
            assert_error(response, 401)
    # A token of another deployment (another secret) is forged as far as this one knows
    for other in serve(tmp_path, AGENT_RUNNER_API_KEYS=f"tenant-a:{KEY_A}", AGENT_RUNNER_TOKEN_SECRET="x" * 40):
        foreign = mint(other, KEY_A, user="u-erin")["token"]
        assert_error(httpx.get(f"{server.url}/v1/turns", headers={"Authorization": f"Bearer {foreign}"}), 401)
        with other.client(foreign) as same:
            assert same.get("/v1/turns").status_code == 200
    time.sleep(1.2)
    expired = httpx.get(f"{server.url}/v1/turns", headers={"Authorization": f"Bearer {turn_token}"})
    assert "expired" in assert_error(expired, 401, "InvalidToken")["message"]


def test_token_requests_are_checked(server: ApiServer, tmp_path: Path) -> None:
    with server.client(KEY_A) as key:
        assert_error(key.post("/v1/tokens", json={"user": "u-1", "expires_in": 3601}), 422, "InvalidRequest")
        assert_error(key.post("/v1/tokens", json={"user": "bad user"}), 422, "InvalidRequest")
        assert_error(key.post("/v1/tokens", json={}), 422, "InvalidRequest")
        assert key.post("/v1/tokens", json={"user": "u-1"}).json()["expires_in"] == 600
    assert_error(httpx.post(f"{server.url}/v1/tokens", json={"user": "u-1"}), 401, "Unauthorized")
    # Without a secret the server issues no tokens, and says how to turn them on
    for plain in serve(tmp_path, AGENT_RUNNER_API_KEYS=f"tenant-a:{KEY_A}"):
        with plain.client(KEY_A) as key:
            error = assert_error(key.post("/v1/tokens", json={"user": "u-1"}), 501, "TokensDisabled")
            assert "AGENT_RUNNER_TOKEN_SECRET" in error["message"]

"""CORS over real HTTP: preflights answered for the configured origins (SSE included), nothing for the others."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.api_server import AGENT_RUNNER, ApiServer, server_env
from tests.helpers.processes import REPO_ROOT
from tests.integration.api.api_server import AGENTS, blocked, read_stream, serve, wait_for
from workers.api import cors

pytestmark = pytest.mark.integration

APP = "http://app.example.test:5173"
OTHER_APP = "https://admin.example.test"
STRANGER = "http://evil.example.test"
KEY = "key-cors-0123456789"


@pytest.fixture(scope="module")
def server(server_dir: Path) -> Iterator[ApiServer]:
    yield from serve(
        server_dir,
        f"sqlite:///{server_dir / 'cors.db'}",
        AGENT_RUNNER_API_KEYS=f"acme:{KEY}",
        AGENT_RUNNER_CORS_ORIGINS=f" {APP} , {OTHER_APP}",
    )


def preflight(client: httpx.Client, path: str, origin: str, method: str, headers: str) -> httpx.Response:
    return client.options(
        path,
        headers={"Origin": origin, "Access-Control-Request-Method": method, "Access-Control-Request-Headers": headers},
    )


def test_preflights_of_a_configured_origin_are_answered_for_posts_and_streams(server: ApiServer) -> None:
    with server.client() as client:
        # A POST with a bearer key, a JSON body and an idempotency key
        post = preflight(client, "/v1/turns", APP, "POST", "authorization, content-type, idempotency-key")
        assert post.status_code == 200, post.text
        assert post.headers["access-control-allow-origin"] == APP
        allowed = {h.strip().lower() for h in post.headers["access-control-allow-headers"].split(",")}
        assert {"authorization", "content-type", "idempotency-key", "last-event-id"} <= allowed
        assert "POST" in post.headers["access-control-allow-methods"]
        assert "access-control-allow-credentials" not in post.headers
        # An event stream read with fetch, sending Last-Event-ID to resume
        stream = preflight(client, "/v1/turns/t-1/events", OTHER_APP, "GET", "authorization, last-event-id")
        assert stream.status_code == 200 and stream.headers["access-control-allow-origin"] == OTHER_APP
        # A header the API does not read is not allowed
        odd = preflight(client, "/v1/turns", APP, "POST", "x-custom")
        assert odd.status_code == 400 and "headers" in odd.text


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE"])
def test_preflights_allow_every_method_of_the_api_and_the_langgraph_key_header(server: ApiServer, method: str) -> None:
    with server.client() as client:
        # threads.update / threads.delete and cron PATCH / DELETE of the LangGraph SDKs, with Client({apiKey})
        answer = preflight(client, "/threads/t-1", APP, method, "x-api-key, content-type")
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == APP
        assert method in answer.headers["access-control-allow-methods"]
        assert "x-api-key" in answer.headers["access-control-allow-headers"].lower()


@pytest.mark.parametrize(
    "path",
    ["/v1/turns", "/threads/t-1/runs/stream", "/v1/agents/desk/ai-sdk/chat", "/v1/agents/desk/ag-ui", "/a2a/desk"],
    ids=["v1", "langgraph", "ai-sdk", "ag-ui", "a2a"],
)
def test_every_route_family_answers_the_preflight_of_a_page_on_another_origin(server: ApiServer, path: str) -> None:
    with server.client() as client:
        answer = preflight(client, path, APP, "POST", "authorization, content-type, idempotency-key, x-api-key")
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == APP
        refused = preflight(client, path, STRANGER, "POST", "authorization, content-type")
        assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers


def test_a_page_on_another_origin_can_read_the_run_id_of_a_new_run(server: ApiServer) -> None:
    with server.client() as client:
        headers = {"Origin": APP, "x-api-key": KEY}
        thread = client.post("/threads", json={}, headers=headers)
        assert thread.status_code == 200, thread.text
        created = client.post(
            f"/threads/{thread.json()['thread_id']}/runs",
            json={"assistant_id": "desk", "input": {"messages": [{"role": "user", "content": "hi"}]}},
            headers=headers,
        )
        assert created.status_code == 200, created.text
        exposed = {h.strip().lower() for h in created.headers["access-control-expose-headers"].split(",")}
        assert {"content-location", "location"} <= exposed
        assert created.headers["content-location"].endswith(f"/runs/{created.json()['run_id']}")


def test_the_documented_cors_table_is_what_the_server_allows_and_exposes() -> None:
    text = (REPO_ROOT / "docs" / "http-api.md").read_text()
    rows = {
        line.split("|")[1].strip(): [name.strip(" `") for name in line.split("|")[2].split(",")]
        for line in text.splitlines()
        if line.startswith(("| methods allowed", "| request headers allowed", "| response headers exposed"))
    }
    assert rows == {
        "methods allowed": list(cors.ALLOWED_METHODS),
        "request headers allowed": list(cors.ALLOWED_HEADERS),
        "response headers exposed": list(cors.EXPOSED_HEADERS),
    }


def test_another_origin_gets_no_cors_answer(server: ApiServer) -> None:
    with server.client() as client:
        refused = preflight(client, "/v1/turns", STRANGER, "POST", "authorization, content-type")
        assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
        plain = client.get("/v1/agents", headers={"Origin": STRANGER, "Authorization": f"Bearer {KEY}"})
        assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


def test_answers_streams_and_errors_are_readable_by_a_configured_origin(server: ApiServer) -> None:
    with server.client(KEY) as client:
        headers = {"Origin": APP}
        created = client.post("/v1/turns", json={"agent_id": "desk", "input": "hi there"}, headers=headers)
        assert created.status_code == 201 and created.headers["access-control-allow-origin"] == APP
        turn_id = created.json()["id"]
        wait_for(client, turn_id, blocked)
        # The event stream carries the header too, so EventSource and fetch can read it
        with client.stream("GET", f"/v1/turns/{turn_id}/events", headers=headers) as response:
            assert response.headers["access-control-allow-origin"] == APP
            assert response.headers["content-type"].startswith("text/event-stream")
        _, events = read_stream(client, f"/v1/turns/{turn_id}/events", headers=headers)
        assert events[-1]["event"] == "end"
        # An error answer is readable, and its Retry-After / WWW-Authenticate headers exposed
        unauthorized = httpx.get(f"{server.url}/v1/agents", headers=headers)
        assert unauthorized.status_code == 401 and unauthorized.headers["access-control-allow-origin"] == APP
        assert "www-authenticate" in unauthorized.headers["access-control-expose-headers"].lower()


def test_a_server_without_origins_answers_no_preflight(tmp_path: Path) -> None:
    for server in serve(tmp_path):
        with server.client() as client:
            response = preflight(client, "/v1/turns", APP, "POST", "content-type")
            assert response.status_code == 405 and "access-control-allow-origin" not in response.headers
            plain = client.get("/v1/agents", headers={"Origin": APP})
            assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


@pytest.mark.parametrize(
    ("origins", "reason"),
    [
        ("*", "'*' lets every web site call an API that has keys"),
        ("http://app.example.test/", "no path"),
        ("app.example.test", "http:// or https://"),
    ],
)
def test_serve_refuses_to_start_with_origins_it_cannot_use(origins: str, reason: str, tmp_path: Path) -> None:
    env = server_env(
        f"sqlite:///{tmp_path / 'x.db'}", AGENT_RUNNER_API_KEYS=f"acme:{KEY}", AGENT_RUNNER_CORS_ORIGINS=origins
    )
    result = subprocess.run(
        [AGENT_RUNNER, "serve", "--agents", AGENTS, "--port", "1"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "AGENT_RUNNER_CORS_ORIGINS" in result.stderr and reason in result.stderr
    assert KEY not in result.stderr

"""The client protocols in front of real Celery workers, on PostgreSQL and Redis (`agent-runner serve --worker celery`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.clients.ag_ui_events import valid
from tests.clients.conftest import AGENTS, API_KEYS, KEY_A
from tests.helpers.node import json_lines, run_node
from tests.integration.api.api_server import CeleryStack, api_on_celery

pytestmark = pytest.mark.integration


@pytest.fixture
def stack(pg_url: str, tmp_path: Path) -> Iterator[CeleryStack]:
    """PostgreSQL, Redis, one Celery worker process (threads) and the API server, all of this test alone."""
    with api_on_celery(
        pg_url, tmp_path, AGENTS, pool="threads", AGENT_RUNNER_INBOX_AGENT="assistant", AGENT_RUNNER_API_KEYS=API_KEYS
    ) as stack:
        yield stack


def run(clients: Path, stack: CeleryStack, script: str, flow: str, **env: str) -> list[dict[str, Any]]:
    done = run_node(clients, script, [flow, stack.server.url, KEY_A], env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:] + stack.server.output() + stack.cluster.logs()
    return json_lines(done.stdout)


def test_approvals_through_both_clients_on_celery_workers(clients: Path, stack: CeleryStack) -> None:
    # AI SDK: approved and rejected
    _, approved, _, rejected = run(clients, stack, "aisdk_flows.mjs", "approval")
    assert approved["text"] == "deployed billing" and approved["metadata"]["status"] == "COMPLETED"
    assert rejected["text"] == "not deployed: The user rejected this tool call: not on a Friday"
    # AG-UI: the same, every event valid
    requested, answered, _, answered_no = run(clients, stack, "agui_flows.mjs", "approval")
    assert valid(requested)[-1] == "RUN_FINISHED" and requested["outcome"]["type"] == "interrupt"
    assert valid(answered)[:2] == ["RUN_STARTED", "TOOL_CALL_RESULT"] and answered["result"] == "deployed billing"
    valid(answered_no)


def test_a_worker_killed_mid_answer_leaves_the_client_with_the_whole_answer_once(
    clients: Path, stack: CeleryStack
) -> None:
    # Given a long answer streaming to an AI SDK chat from worker w1
    chat_id = f"killed-{uuid.uuid4().hex[:8]}"
    words = 30
    with ThreadPoolExecutor(1) as pool:
        client = pool.submit(run, clients, stack, "aisdk_flows.mjs", "story", CHAT_ID=chat_id, WORDS=str(words))
        turn_id = _running_turn(stack, chat_id)
        time.sleep(1.0)  # a few words out
        fence_of_w1 = stack.cluster.load(turn_id).lease_fence
        # When w1 is killed mid-answer, and another worker takes the turn over (the sweep
        # sends it again once its lease has expired)
        (victim,) = [p for p in stack.cluster.processes if p.name == "w1"]
        victim.kill()
        stack.cluster.start_beat()
        stack.cluster.start_worker("w2", pool="threads")
        (story,) = client.result(timeout=180)
    # Then the client, on its one connection, got the whole answer exactly once
    assert story["status"] == "ready" and story["error"] is None, story
    assert story["text"] == " ".join(f"word{n}" for n in range(1, words + 1))
    assert story["metadata"]["turnId"] == turn_id and story["metadata"]["status"] == "COMPLETED"
    assert [p["type"] for p in story["parts"]] == ["step-start", "text"]
    # And it was another lease that finished the turn: the answer was streamed twice by the
    # workers (the killed call, then the re-run from the start), and shown once
    fence_at_end = stack.cluster.load(turn_id).lease_fence
    assert fence_of_w1 is not None and fence_at_end is not None and fence_at_end > fence_of_w1


def _running_turn(stack: CeleryStack, chat_id: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    with stack.server.client(KEY_A) as http:
        while time.monotonic() < deadline:
            items = http.get("/v1/turns", params={"conversation_id": chat_id}).json()["items"]
            if items and items[0]["status"] == "RUNNING":
                return str(items[0]["id"])
            time.sleep(0.05)
    pytest.fail(f"no turn of {chat_id} started running")

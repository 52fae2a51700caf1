"""Steering and recovery with real Celery workers on PostgreSQL: messages from two processes, workers SIGKILLed.

The turn's model and tool calls last until the test opens their gates (see
`steering_agents`), so each message is sent while the call the test names is under way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from agent_runner import AgentEventType, AgentTurn, AgentTurnStatus, EventScope
from tests.helpers.crash import CRASH_DIR_ENV, PAUSE_AT_ENV, paused_processes
from tests.integration.celery_workers import steering_agents
from tests.integration.celery_workers.celery_cluster import Cluster

pytestmark = pytest.mark.integration

LOADER = f"{steering_agents.__name__}:build_loader"
TIMEOUT_S = 60.0

STEER_FROM_ANOTHER_PROCESS = """
import sys
from workers import build_runner
runner = build_runner()
turn_id, pairs = sys.argv[1], sys.argv[2:]
for message_id, text in zip(pairs[::2], pairs[1::2]):
    runner.steer(turn_id, text, message_id=message_id)
"""


def _cluster(make_cluster: Callable[..., Cluster], **env: str) -> Cluster:
    cluster = make_cluster(AGENT_RUNNER_AGENT_LOADER=LOADER, **env)
    engine = sa.create_engine(cluster.settings.database_url)
    try:
        with engine.begin() as connection:
            connection.execute(steering_agents.CREATE_REQUESTS)
    finally:
        engine.dispose()
    return cluster


def _requests(cluster: Cluster, label: str) -> list[tuple[int, list[list[Any]]]]:
    """The model requests of the turn `label`, in the order they were made: (answers before it, messages)."""
    engine = sa.create_engine(cluster.settings.database_url)
    try:
        with engine.connect() as connection:
            bodies = connection.execute(steering_agents.READ_REQUESTS, {"label": label}).scalars()
            return [(body["answered"], body["messages"]) for body in map(json.loads, bodies)]
    finally:
        engine.dispose()


def _trailing_user_texts(messages: list[list[Any]]) -> list[str]:
    tail: list[str] = []
    for message in reversed(messages):
        if message[0] != "user":
            break
        tail.append(message[1])
    return tail[::-1]


def _assert_tool_protocol(messages: list[list[Any]]) -> None:
    """Every call of an AI message is answered right after it, before any other message."""
    for index, message in enumerate(messages):
        if message[0] == "ai" and message[2]:
            answers = messages[index + 1 : index + 1 + len(message[2])]
            assert [m[1] for m in answers if m[0] == "tool"] == message[2], messages


def _wait(cluster: Cluster, turn_id: str, predicate: Callable[[AgentTurn], bool], what: str) -> AgentTurn:
    cluster.wait_for(lambda: predicate(cluster.load(turn_id)), TIMEOUT_S, what)
    return cluster.load(turn_id)


def test_messages_from_two_processes_during_a_model_call_and_a_tool_call_reach_the_next_request_in_order(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = _cluster(make_cluster)
    gates = tmp_path / "gates"
    gates.mkdir()
    cluster.start_worker("w1")
    script = json.dumps({"label": "a", "rounds": 1, "gates": str(gates)})
    turn = cluster.runner.start("steered", script)
    # Given the turn's first model call under way on the worker
    cluster.wait_for(lambda: len(_requests(cluster, "a")) == 1, TIMEOUT_S, "the first model call")
    # When three messages come at once from this process, and two from another process
    other = subprocess.run(
        [sys.executable, "-c", STEER_FROM_ANOTHER_PROCESS, turn.id, "there-1", "from there", "there-2", "and more"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert other.returncode == 0, other.stderr
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda i: cluster.runner.steer(turn.id, f"here {i}", message_id=f"here-{i}"), range(3)))
    # (a retried request adds nothing)
    cluster.runner.steer(turn.id, "here 0 again", message_id="here-0")
    assert cluster.load(turn.id).steered_message_ids == []
    (gates / "a-model-0").touch()
    # And one more while the tool call the model asked for is under way
    _wait(cluster, turn.id, lambda t: t.model_iterations == 1 and bool(t.pending_tool_calls), "the tool call")
    cluster.runner.steer(turn.id, "during the tool", message_id="tool-1")
    (gates / "a-tool-0").touch()
    (gates / "a-model-1").touch()
    ended = _wait(cluster, turn.id, lambda t: t.is_terminal, "the turn to end")

    # Then the next model request holds them all, in the order they were accepted, after the tool's result
    assert ended.status is AgentTurnStatus.COMPLETED and ended.final_output == "done:a"
    accepted = [m.message_id for m in cluster.turn_store.steering_messages(turn.id)]
    assert sorted(accepted) == ["here-0", "here-1", "here-2", "there-1", "there-2", "tool-1"]
    assert accepted.index("there-1") < accepted.index("there-2") and accepted[-1] == "tool-1"
    assert ended.steered_message_ids == accepted
    requests = _requests(cluster, "a")
    assert [answered for answered, _ in requests] == [0, 1]
    texts = {"there-1": "from there", "there-2": "and more", "tool-1": "during the tool"}
    expected = [texts.get(message_id, message_id.replace("-", " ")) for message_id in accepted]
    second = requests[1][1]
    assert _trailing_user_texts(second) == expected
    assert second[-len(expected) - 1][0] == "tool"
    _assert_tool_protocol(second)


def test_a_message_accepted_before_its_worker_was_killed_is_applied_once_by_the_next(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    crash_dir = tmp_path / "crashes"
    crash_dir.mkdir()
    cluster = _cluster(make_cluster, **{CRASH_DIR_ENV: str(crash_dir)})
    doomed = cluster.start_worker("doomed", pool="threads", env={PAUSE_AT_ENV: steering_agents.PAUSE_POINT})
    turn = cluster.runner.start("steered", json.dumps({"label": "k", "rounds": 0}))
    # Given the worker held inside the turn's model call, and two messages accepted meanwhile
    cluster.wait_for(lambda: bool(paused_processes(crash_dir)), TIMEOUT_S, "the model call to be held")
    cluster.runner.steer(turn.id, "first", message_id="m1")
    cluster.runner.steer(turn.id, "second", message_id="m2")
    assert cluster.load(turn.id).steered_message_ids == []
    # When the worker is SIGKILLed before it saved anything more, and another takes over
    doomed.kill()
    cluster.start_worker("fresh", pool="threads")
    cluster.start_beat()
    ended = _wait(cluster, turn.id, lambda t: t.is_terminal, "the turn to end on the fresh worker")

    # Then the model call made again holds both messages, once, in order
    assert ended.status is AgentTurnStatus.COMPLETED and ended.steered_message_ids == ["m1", "m2"]
    requests = _requests(cluster, "k")
    assert [answered for answered, _ in requests] == [0, 0]
    assert _trailing_user_texts(requests[0][1]) == [json.dumps({"label": "k", "rounds": 0})]
    assert _trailing_user_texts(requests[1][1])[-2:] == ["first", "second"]
    users = [m for m in ended.messages if m.id in ("m1", "m2")]
    assert [m.id for m in users] == ["m1", "m2"]


def test_a_tool_that_kills_its_worker_every_time_ends_the_turn_after_the_recovery_budget(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = _cluster(make_cluster)
    cluster.start_worker("w1", concurrency=2)
    cluster.start_beat()
    doomed = cluster.runner.start("steered", json.dumps({"label": "r", "crash": True}))
    other = cluster.runner.start("steered", json.dumps({"label": "o", "rounds": 1}))
    # The fleet keeps serving the other turn while this one crash-loops
    assert _wait(cluster, other.id, lambda t: t.is_terminal, "the other turn").status is AgentTurnStatus.COMPLETED
    ended = _wait(cluster, doomed.id, lambda t: t.is_terminal, "the crash-looping turn to end")
    # Ended FAILED after the budget (three takeovers allowed by default), its output so far kept
    assert ended.status is AgentTurnStatus.FAILED and ended.final_output == "Checked 3 of 5 servers."
    assert ended.error is not None and "recovery budget 3" in ended.error
    assert ended.recoveries == 4
    events = cluster.turn_store.read_events(EventScope.tree(doomed.id))
    recovering = [e.data["recoveries"] for e in events if e.type is AgentEventType.TURN_RECOVERING]
    assert recovering == [1, 2, 3]

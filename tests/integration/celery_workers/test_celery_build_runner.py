"""`workers.build_runner()` from the environment: start, submit_resume and cancel enqueue instead of running."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import workers
from agent_runner import AgentEventType, AgentResumeCommand, AgentRunner, AgentTurnStatus
from agent_runner.persistence import EventScope
from tests.integration.celery_workers.celery_cluster import Cluster
from workers.inbox import enqueue_message

pytestmark = pytest.mark.integration


@pytest.fixture
def web_app_runner(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[AgentRunner]:
    """A web app's runner: `workers.build_runner()` in an environment that points at the cluster's services."""
    for name, value in cluster.env.items():
        monkeypatch.setenv(name, value)
    runner = workers.build_runner()
    yield runner
    runner.turn_store.engine.dispose()  # type: ignore[attr-defined]


def test_a_runner_built_from_the_environment_enqueues_work_for_the_workers(
    cluster: Cluster, web_app_runner: AgentRunner
) -> None:
    check_runner(cluster, web_app_runner)


def check_runner(cluster: Cluster, runner: AgentRunner) -> None:

    # When it starts turns while no worker runs, nothing runs in the calling thread
    plain = runner.start("worker-agent", json.dumps({"kind": "plain", "label": "web"}))
    approval = runner.start("worker-agent", json.dumps({"kind": "approval", "label": "web"}))
    assert runner.turn_store.load(plain.id).status is AgentTurnStatus.READY
    assert cluster.queue_length() == 2

    # Then the workers run them, a decision submitted from the web app continues the turn there
    cluster.start_worker("w1")
    cluster.wait_for(lambda: cluster.load(plain.id).status is AgentTurnStatus.COMPLETED, 20, "the plain turn")
    cluster.wait_for(
        lambda: cluster.load(approval.id).status is AgentTurnStatus.WAITING_FOR_APPROVAL, 20, "the approval"
    )
    waiting = cluster.load(approval.id)
    call_id = waiting.suspension.correlation_id if waiting.suspension else ""
    resumed = runner.submit_resume(approval.id, AgentResumeCommand.approve_tool(call_id or ""))
    assert resumed.status is AgentTurnStatus.RUNNING
    cluster.wait_for(lambda: cluster.load(approval.id).status is AgentTurnStatus.COMPLETED, 20, "the approved turn")

    # And a waiting turn cancelled from the web app ends at once, with its history closed out
    another = runner.start("worker-agent", json.dumps({"kind": "approval", "label": "cancel"}))
    cluster.wait_for(
        lambda: cluster.load(another.id).status is AgentTurnStatus.WAITING_FOR_APPROVAL, 20, "the second approval"
    )
    cancelled = runner.cancel(another.id)
    assert cancelled.status is AgentTurnStatus.CANCELLED
    assert cancelled.pending_tool_calls == []
    assert [row["effect"] for row in cluster.ledger()] == ["web:approved"]


EXPLICIT_SETTINGS_SCRIPT = """
import json, sys
import workers
from workers.settings import WorkerSettings
runner = workers.build_runner(WorkerSettings.from_env(json.loads(sys.argv[1])))
turn = runner.start("worker-agent", json.dumps({"kind": "plain", "label": "explicit"}))
print(turn.id)
"""


def test_a_runner_built_from_explicit_settings_takes_nothing_from_a_conflicting_environment(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Given a process whose environment names another database and a queue name that is invalid
    elsewhere = tmp_path / "from-the-environment.db"
    conflicting = {
        **cluster.env,
        "AGENT_RUNNER_DATABASE_URL": f"sqlite:///{elsewhere}",
        "AGENT_RUNNER_QUEUE": "not a queue!",
        "CELERY_BROKER_URL": "amqp://nobody@127.0.0.1:1//",
    }
    # When it builds a runner from the cluster's settings and starts a turn
    done = subprocess.run(
        [sys.executable, "-c", EXPLICIT_SETTINGS_SCRIPT, json.dumps(cluster.env)],
        env=conflicting,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Then the turn is saved in the settings' database and enqueued on their broker and queue
    assert done.returncode == 0, done.stderr
    turn_id = done.stdout.strip().splitlines()[-1]
    assert cluster.load(turn_id).status is AgentTurnStatus.READY
    assert cluster.queue_length() == 1
    assert not elsewhere.exists()


def test_a_message_a_web_app_queues_is_announced_on_the_live_channel_at_once(
    cluster: Cluster, web_app_runner: AgentRunner
) -> None:
    # Given a conversation whose turn waits for the workers (none runs)
    web_app_runner.start("worker-agent", json.dumps({"kind": "plain", "label": "busy"}), conversation_id="conv-live")

    # When the web app queues a message behind that turn
    queued = enqueue_message(web_app_runner, "conv-live", "and one more thing", message_id="queued-live")

    # Then the conversation's followers on Redis get its MESSAGE_QUEUED without reading the log
    assert queued.queued_event is not None
    expected = [queued.queued_event.event_id]

    def announced() -> list[str]:
        events = cluster.wiring.live.read(EventScope.conversation("conv-live"))
        return [event.event_id for event in events if event.type is AgentEventType.MESSAGE_QUEUED]

    cluster.wait_for(lambda: announced() == expected, 5, "MESSAGE_QUEUED on Redis")

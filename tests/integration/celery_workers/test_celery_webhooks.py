"""Webhooks from Celery workers (the beat-scheduled delivery task), and the tool context under a worker."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest

from agent_runner import AgentResumeCommand, AgentTurnStatus, ToolMessage
from store.webhooks import DeliveryStatus, WebhookDeliveryLog
from tests.helpers.webhook_receiver import WebhookReceiver, fail_by_conversation, webhook_env, webhook_receiver
from tests.integration.celery_workers.celery_cluster import Cluster

SECRET = "whsec-celery-test"


def _spec(kind: str, label: str) -> str:
    return json.dumps({"kind": kind, "label": label})


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with webhook_receiver() as running:
        running.answer = fail_by_conversation
        yield running


@pytest.fixture
def hooked(make_cluster: Callable[..., Cluster], receiver: WebhookReceiver) -> Cluster:
    cluster = make_cluster(**webhook_env(receiver, SECRET, AGENT_RUNNER_WEBHOOK_INTERVAL_S="0.2"))
    cluster.start_worker("w1", concurrency=2)
    cluster.start_beat()
    return cluster


def _wait_status(cluster: Cluster, turn_id: str, status: AgentTurnStatus) -> None:
    cluster.wait_for(lambda: cluster.load(turn_id).status is status, 30, f"{turn_id} to be {status}")


def test_celery_workers_send_each_kind_once_signed_retry_a_500_and_dead_letter(
    hooked: Cluster, receiver: WebhookReceiver
) -> None:
    runner = hooked.runner
    # Given: an approval turn, a failing turn, one whose receiver fails once, one whose receiver always fails
    approval = runner.start("worker-agent", _spec("approval", "hook-a"), conversation_id="c-approval")
    failing = runner.start("worker-agent", _spec("fail", "hook-f"), conversation_id="c-failing")
    flaky = runner.start("worker-agent", _spec("plain", "hook-r"), conversation_id="flaky-1")
    dead = runner.start("worker-agent", _spec("plain", "hook-d"), conversation_id="dead-1")
    _wait_status(hooked, approval.id, AgentTurnStatus.WAITING_FOR_APPROVAL)
    receiver.wait_for(lambda: len(receiver.of_turn(approval.id)) == 1, "the waiting webhook")
    hooked.answer_people([approval.id])
    _wait_status(hooked, approval.id, AgentTurnStatus.COMPLETED)
    # Then: each event reaches its kind's URL once, signed
    receiver.wait_for(lambda: len(receiver.of_turn(approval.id)) == 2, "the ended webhook")
    receiver.wait_for(lambda: len(receiver.of_turn(failing.id)) == 1, "the failed webhook")
    receiver.wait_for(lambda: [r.status for r in receiver.of_turn(flaky.id)] == [500, 200], "the retried delivery")
    receiver.wait_for(lambda: len(receiver.of_turn(dead.id)) == 3, "three attempts of the dead delivery")
    time.sleep(1.5)  # several more beat ticks: none may send an event again
    assert [r.path for r in receiver.of_turn(approval.id)] == ["/waiting", "/ended"]
    assert [r.path for r in receiver.of_turn(failing.id)] == ["/failed"]
    assert hooked.load(failing.id).status is AgentTurnStatus.FAILED
    assert len(receiver.of_turn(flaky.id)) == 2 and len(receiver.of_turn(dead.id)) == 3
    for received in receiver.of_turn(approval.id) + receiver.of_turn(failing.id) + receiver.of_turn(flaky.id):
        assert received.signature_is_valid(SECRET)
        assert received.delivery_id == received.payload["event"]["event_id"]
    retried = receiver.of_turn(flaky.id)
    assert retried[0].delivery_id == retried[1].delivery_id
    # And: the delivery that kept failing is a dead letter in the store
    with WebhookDeliveryLog(hooked.settings.database_url) as log:
        letter = log.get(receiver.of_turn(dead.id)[0].delivery_id)
        delivered = log.get(retried[0].delivery_id)
    assert letter is not None and (letter.status, letter.attempts, letter.last_status_code) == (
        DeliveryStatus.DEAD,
        3,
        500,
    )
    assert delivered is not None and (delivered.status, delivered.attempts) == (DeliveryStatus.DELIVERED, 2)


def test_a_tool_run_by_a_celery_worker_sees_whom_it_acts_for(make_cluster: Callable[..., Cluster]) -> None:
    # Given: a tenant's turn with the app's user id, whose tool needs approval
    cluster = make_cluster()
    cluster.start_worker("w1")
    turn = cluster.runner.start(
        "worker-agent",
        _spec("whoami", "who"),
        conversation_id="c-9",
        tenant_id="acme",
        metadata={"user_id": "u-7"},
    )
    _wait_status(cluster, turn.id, AgentTurnStatus.WAITING_FOR_APPROVAL)
    waiting = cluster.load(turn.id)
    assert waiting.suspension is not None
    # When: a person approves it, saying why
    command = (
        AgentResumeCommand.approve_tool(waiting.suspension.correlation_id or "")
        .with_metadata("decided_by", "ops-1")
        .with_metadata("reason", "known customer")
    )
    cluster.runner.submit_resume(turn.id, command)
    _wait_status(cluster, turn.id, AgentTurnStatus.COMPLETED)
    # Then: the tool, run in the worker process, saw the caller, the tenant apart and the decision
    [answer] = [m for m in cluster.load(turn.id).messages if isinstance(m, ToolMessage)]
    seen = json.loads(answer.content)
    assert {k: seen[k] for k in ("metadata", "conversation_id", "tenant_id")} == {
        "metadata": {"user_id": "u-7"},
        "conversation_id": "c-9",
        "tenant_id": "acme",
    }
    assert (seen["approval"]["by"], seen["approval"]["reason"]) == ("ops-1", "known customer")
    assert seen["approval"]["at"].startswith(str(waiting.updated_at.year))

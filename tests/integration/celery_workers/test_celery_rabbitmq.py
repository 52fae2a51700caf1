"""The same short scenario with RabbitMQ as the broker: steps, approvals, ETA retries, fan-out, the inbox."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent_runner import AgentTurnStatus
from agent_runner.persistence import ConversationKey
from store import InboxStatus
from tests.integration.celery_workers.celery_cluster import Cluster, reachable_rabbitmq_url
from tests.integration.celery_workers.celery_workload import Scenario, run_workload, scenario

pytestmark = pytest.mark.integration


@pytest.fixture
def amqp_url() -> str:
    return reachable_rabbitmq_url()


def test_mixed_turns_and_the_inbox_run_with_rabbitmq_as_the_broker(
    make_cluster: Callable[..., Cluster], amqp_url: str
) -> None:
    # Given a worker consuming from RabbitMQ, and an idle conversation with two queued messages
    cluster = make_cluster(broker_url=amqp_url)
    cluster.start_worker("w1")
    inbox = cluster.wiring.inbox
    for label in ("r1", "r2"):
        inbox.enqueue("conv-rabbit", f"id-{label}", label)
    cluster.wiring.dispatcher.send_inbox(ConversationKey("conv-rabbit"))

    # When turns of every kind run, one of them retried after a 1 s ETA
    scenarios = [scenario(i) for i in range(7)]
    scenarios.append(
        Scenario(
            {"kind": "retry", "label": "eta", "failures": 1, "after": 1.0}, AgentTurnStatus.COMPLETED, ("eta:flaky",)
        )
    )

    def inbox_done() -> bool:
        return (
            all(
                inbox.get(f"id-{label}").status is InboxStatus.COMPLETED  # type: ignore[union-attr]
                for label in ("r1", "r2")
            )
            and cluster.turn_store.find_active_turn("conv-rabbit") is None
        )

    # Then each ends as expected with its side effects made once, and both messages ran in order
    run_workload(cluster, scenarios, timeout=60, other_effects=("inbox:r1", "inbox:r2"), others_done=inbox_done)
    turns = sorted(cluster.turn_store.list_turns(conversation_id="conv-rabbit"), key=lambda t: t.created_at)
    assert [(t.status, t.final_output) for t in turns] == [
        (AgentTurnStatus.COMPLETED, "done:r1"),
        (AgentTurnStatus.COMPLETED, "done:r2"),
    ]

"""A background model response under Celery workers on PostgreSQL: a worker SIGKILLed while it runs starts no second one."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from agent_runner import AgentTurnStatus
from tests.helpers import responses_wire as wire
from tests.helpers.background_responses import BackgroundResponses, Outcome
from tests.helpers.background_turns import LOADER, URL_ENV
from tests.helpers.fake_openai import FakeChatServer
from tests.integration.celery_workers.celery_cluster import Cluster

pytestmark = pytest.mark.integration

S = AgentTurnStatus
TIMEOUT_S = 60.0


@pytest.fixture
def responses() -> BackgroundResponses:
    return BackgroundResponses(
        Outcome([wire.function_call("call_1", "weather", '{"city": "Paris"}')], polls=3),
        Outcome([wire.text("Sunny in Paris.")], polls=1),
    )


@pytest.fixture
def server(responses: BackgroundResponses, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeChatServer]:
    fake = FakeChatServer(answer=responses)
    monkeypatch.setenv(URL_ENV, fake.base_url)  # the producer side builds the agents too
    try:
        yield fake
    finally:
        fake.close()


def test_a_worker_killed_while_the_response_runs_starts_no_second_one(
    make_cluster: Callable[..., Cluster], server: FakeChatServer, responses: BackgroundResponses
) -> None:
    cluster = make_cluster(AGENT_RUNNER_AGENT_LOADER=LOADER, **{URL_ENV: server.base_url})
    first = cluster.start_worker("first", pool="threads", concurrency=2)
    turn = cluster.runner.start("forecaster", "Weather in Paris?")

    def waits_on_the_response() -> bool:
        return "#model" in cluster.load(turn.id).tool_state

    cluster.wait_for(waits_on_the_response, TIMEOUT_S, "the response to start")
    first.kill()
    assert len(responses.created) == 1
    done = cluster.finish_elsewhere(turn.id, TIMEOUT_S)

    assert done.status is S.COMPLETED, done.error
    assert done.final_output == "Sunny in Paris."
    # The killed worker's response was read by the next one, never started again
    assert len(responses.created) == 2 and done.attempt == 0 and responses.cancels == []
    assert [body["input"][-1].get("type") for body in responses.created] == [None, "function_call_output"]

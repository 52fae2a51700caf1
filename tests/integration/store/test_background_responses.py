"""Background model responses through the runner on SQLite: the turn waits holding no thread, polls read the same response.

The provider is a `FakeChatServer` running background responses as the Responses API
does (`tests.helpers.background_responses`); it counts creations, reads and cancels.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import store
from agent_runner import AgentEvent, AgentEventType, AgentTurn, AgentTurnStatus, AiMessage, SuspensionType, ToolMessage
from agent_runner.model_limits import InProcessModelLimiter, ModelLimit
from tests.helpers import responses_wire as wire
from tests.helpers.background_responses import SERVER_ERROR, BackgroundResponses, Outcome
from tests.helpers.background_turns import runner_for
from tests.helpers.fake_openai import FakeChatServer
from tests.helpers.processes import run_module
from tests.unit.agent_runner.turn_kit import FakeClock, poll_until_settled

S = AgentTurnStatus
CALL = wire.function_call("call_1", "weather", '{"city": "Paris"}')


@pytest.fixture
def responses() -> BackgroundResponses:
    return BackgroundResponses()


@pytest.fixture
def server(responses: BackgroundResponses) -> Iterator[FakeChatServer]:
    fake = FakeChatServer(answer=responses)
    try:
        yield fake
    finally:
        fake.close()


def script(responses: BackgroundResponses, *outcomes: Outcome) -> None:
    responses.__init__(*outcomes)  # type: ignore[misc]


def started(sqlite_url: str, server: FakeChatServer) -> AgentTurn:
    """A turn run until it waits for its first background response, by a runner that is gone after."""
    with store.SqlAgentTurnStore(sqlite_url) as turns:
        runner, agent = runner_for(server.base_url, turns)
        turn = runner.run(agent, "Weather?")
    assert_waits_for_the_model(turn, "resp_bg_1")
    return turn


def assert_waits_for_the_model(turn: AgentTurn, response_id: str, attempt: int = 0) -> None:
    """The turn waits for the response (no attempt used by the wait), its id in the snapshot."""
    assert turn.status is S.RETRY_SCHEDULED, turn.error
    assert turn.suspension is not None and turn.suspension.type is SuspensionType.RETRY
    assert turn.suspension.metadata["reason"] == "operation" and turn.attempt == attempt
    assert turn.tool_state["#model"]["operation"] == {"response_id": response_id}


def test_a_background_turn_completes_with_a_tool_call_over_two_steps(
    sqlite_url: str, server: FakeChatServer, responses: BackgroundResponses
) -> None:
    script(responses, Outcome([wire.REASONING, CALL], polls=1), Outcome([wire.text("Sunny in Paris.")], polls=0))
    clock = FakeClock()
    with store.SqlAgentTurnStore(sqlite_url) as turns:
        runner, agent = runner_for(server.base_url, turns, clock)
        events: list[AgentEvent] = []
        runner.add_event_listener(events.append)
        turn = runner.run(agent, "Weather in Paris?")
        assert_waits_for_the_model(turn, "resp_bg_1")
        turn, delays = poll_until_settled(runner, clock, turn, lambda waiting: None)

    assert turn.status is S.COMPLETED, turn.error
    assert turn.final_output == "Sunny in Paris."
    # The first response was read twice (1 s, then 2 s later), the second once; none started twice
    assert delays == [1.0, 2.0, 1.0]
    assert len(responses.created) == 2 and responses.reads == 3
    assert turn.attempt == 0 and turn.tool_state == {} and turn.model_iterations == 2
    assert (turn.usage.input_tokens, turn.usage.output_tokens, turn.usage.reasoning_tokens) == (80, 40, 24)
    [reasoned] = [m for m in turn.messages if isinstance(m, AiMessage) and m.provider_parts]
    assert reasoned.parts_of("openai_responses") == [wire.REASONING]
    assert [m.content for m in turn.messages if isinstance(m, ToolMessage)] == ["sunny in Paris"]
    # The second response was sent the reasoning item, the call and its output
    second = responses.created[1]["input"]
    assert [item.get("type") for item in second[-3:]] == ["reasoning", "function_call", "function_call_output"]
    responded = [e.data["tool_calls"] for e in events if e.type is AgentEventType.MODEL_RESPONSE]
    assert responded == [["weather"], []]
    resumed = [e.data["reason"] for e in events if e.type is AgentEventType.TURN_RESUMED]
    assert resumed == ["poll due"] * 3


def test_another_process_reads_the_same_response_after_the_first_is_gone(
    sqlite_url: str, server: FakeChatServer, responses: BackgroundResponses
) -> None:
    script(responses, Outcome([wire.text("Sunny.")], polls=2))
    turn = started(sqlite_url, server)

    finished = run_module("tests.helpers.background_turns", sqlite_url, server.base_url, turn.id)

    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.split(maxsplit=1) == ["COMPLETED", "Sunny.\n"]
    assert len(responses.created) == 1 and responses.reads == 3 and responses.cancels == []


def test_a_turn_cancelled_while_it_waits_cancels_the_response(
    sqlite_url: str, server: FakeChatServer, responses: BackgroundResponses
) -> None:
    script(responses, Outcome([wire.text("Sunny.")], polls=5))
    turn = started(sqlite_url, server)
    with store.SqlAgentTurnStore(sqlite_url) as turns:
        runner, _ = runner_for(server.base_url, turns)
        cancelled = runner.cancel(turn.id, "not needed")

    assert cancelled.status is S.CANCELLED
    assert responses.cancels == ["resp_bg_1"] and len(responses.created) == 1


def test_a_failed_response_is_retried_per_the_retry_policy_with_a_new_response(
    sqlite_url: str, server: FakeChatServer, responses: BackgroundResponses
) -> None:
    script(responses, Outcome(polls=0, error=SERVER_ERROR), Outcome([wire.text("Sunny.")], polls=0))
    clock = FakeClock()
    with store.SqlAgentTurnStore(sqlite_url) as turns:
        runner, agent = runner_for(server.base_url, turns, clock)
        turn = runner.run(agent, "Weather?")
        clock.advance(1)
        turn = runner.run_until_blocked(runner.restore(turn.id))
        # The response failed for a transient reason: a retry on the schedule, which starts a new one
        assert turn.status is S.RETRY_SCHEDULED and turn.attempt == 1, turn.error
        assert turn.suspension is not None and turn.suspension.metadata.get("reason") != "operation"
        assert turn.tool_state == {}
        clock.advance(1)
        turn = runner.run_until_blocked(runner.restore(turn.id))
        assert_waits_for_the_model(turn, "resp_bg_2", attempt=1)
        clock.advance(1)
        turn = runner.run_until_blocked(runner.restore(turn.id))

    assert turn.status is S.COMPLETED and turn.final_output == "Sunny.", turn.error
    assert len(responses.created) == 2


def test_polls_are_not_model_calls_for_the_shared_limits(
    sqlite_url: str, server: FakeChatServer, responses: BackgroundResponses
) -> None:
    script(responses, Outcome([CALL], polls=2), Outcome([wire.text("Sunny.")], polls=0))
    clock = FakeClock()
    limiter = InProcessModelLimiter({"openai:o4-mini": ModelLimit(rpm=1)}, clock=lambda: clock.now.timestamp())
    reasons: list[str] = []

    def seen(waiting: AgentTurn) -> None:
        assert waiting.suspension is not None
        reasons.append(waiting.suspension.metadata["reason"])

    with store.SqlAgentTurnStore(sqlite_url) as turns:
        runner, agent = runner_for(server.base_url, turns, clock, model_limiter=limiter)
        turn = runner.run(agent, "Weather?")
        turn, delays = poll_until_settled(runner, clock, turn, seen)

    assert turn.status is S.COMPLETED, turn.error
    # Three looks at the first response within the minute went by the limit of one call a
    # minute; the second response waited for the minute to pass since the first started
    assert reasons == ["operation"] * 3 + ["model_limit", "operation"]
    assert sum(delays[:3]) == 7.0 and 60.0 <= sum(delays[:4]) < 61.0
    assert len(responses.created) == 2

"""FallbackChatModel on the Redis limiter: each model's calls and 429s count against its own key, for the fleet."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent_runner import Agent, AgentRunner, AgentTurnStatus, AiMessage, ModelLimit, RecoverableError, ScriptedChatModel
from agent_runner.model_limits import LimitGrant, LimitReason, LimitWait
from agent_runner.models import FallbackChatModel
from store.keys import RedisKeys
from store.redis_limits import RedisModelLimiter

pytestmark = pytest.mark.integration

PRIMARY, SECONDARY = "anthropic:claude-test", "openai:o4-test"


@pytest.fixture
def limiter(redis_url: str, keys: RedisKeys) -> Iterator[RedisModelLimiter]:
    limits = {PRIMARY: ModelLimit(rpm=1), SECONDARY: ModelLimit(rpm=1)}
    with RedisModelLimiter(limits, redis_url, prefix=keys.prefix) as built:
        yield built


def test_a_spent_primary_falls_over_and_each_key_counts_its_own_calls(limiter: RedisModelLimiter) -> None:
    # Given one request a minute on each key, shared through Redis
    primary = ScriptedChatModel(lambda request: AiMessage("from claude"), rate_limit_key=PRIMARY)
    secondary = ScriptedChatModel(lambda request: AiMessage("from o4"), rate_limit_key=SECONDARY)
    agent = Agent(id="pair", chat_model=FallbackChatModel([primary, secondary]))
    runner = AgentRunner(model_limiter=limiter)
    # When three turns start at once
    first, second, third = (runner.run(agent, text) for text in ("one", "two", "three"))
    # Then the primary answers one, the secondary the next at once, and the third waits for a key
    assert (first.final_output, second.final_output) == ("from claude", "from o4")
    assert third.status is AgentTurnStatus.RETRY_SCHEDULED and third.attempt == 0
    assert (primary.calls, secondary.calls) == (1, 1)
    assert third.suspension is not None and third.suspension.metadata["limit_key"] in (PRIMARY, SECONDARY)
    # And another process finds both keys spent
    for key in (PRIMARY, SECONDARY):
        assert isinstance(limiter.acquire(key, 1, f"elsewhere-{key}"), LimitWait)


def test_a_429_that_falls_over_pauses_the_primary_in_redis(redis_url: str, keys: RedisKeys) -> None:
    limits = {PRIMARY: ModelLimit(concurrency=4), SECONDARY: ModelLimit(concurrency=4)}
    with RedisModelLimiter(limits, redis_url, prefix=keys.prefix) as limiter:
        refusal = RecoverableError("HTTP 429: slow down", retry_after=30.0, rate_limited=True)
        primary = ScriptedChatModel([refusal], rate_limit_key=PRIMARY)
        secondary = ScriptedChatModel(lambda request: AiMessage("from o4"), rate_limit_key=SECONDARY)
        runner = AgentRunner(model_limiter=limiter)
        agent = Agent(id="pair", chat_model=FallbackChatModel([primary, secondary]))
        # When a turn's primary answers 429, then the secondary answers it
        assert runner.run(agent, "one").final_output == "from o4"
        # And a process sharing the Redis limiter finds the primary paused, the secondary free
        with RedisModelLimiter(limits, redis_url, prefix=keys.prefix) as elsewhere:
            paused = elsewhere.acquire(PRIMARY, 1, "elsewhere")
            assert isinstance(paused, LimitWait) and paused.reason is LimitReason.PAUSED
            assert isinstance(elsewhere.acquire(SECONDARY, 1, "elsewhere"), LimitGrant)
        # And the next turn goes to the secondary without asking the primary
        assert runner.run(agent, "two").final_output == "from o4"
        assert (primary.calls, secondary.calls) == (1, 2)
